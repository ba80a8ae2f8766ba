package objectstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// faultyTransport spoils the answers to GETs of packs: the first spoil of
// them (all, if spoil < 0) break or stall after bytes of their body, or
// (fault "headers") never answer. It logs every GET of a pack.
type faultyTransport struct {
	base  http.RoundTripper
	fault string // "break", "stall" or "headers"
	after int64
	// whole, if set, answers ranged GETs (wholeAnswers: the whole
	// object, as a store without ranges would).
	whole func(*http.Request) (*http.Response, error)

	mu    sync.Mutex
	spoil int
	gets  []packGet
}

// packGet is one GET of a pack: its key, its Range header, and whether
// it was spoiled.
type packGet struct {
	key, rng string
	spoiled  bool
}

func (f *faultyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/"+chunksDir+"/") {
		return f.base.RoundTrip(r)
	}
	f.mu.Lock()
	spoiled := f.spoil != 0
	if f.spoil > 0 {
		f.spoil--
	}
	f.gets = append(f.gets, packGet{key: r.URL.Path, rng: r.Header.Get("Range"), spoiled: spoiled})
	f.mu.Unlock()

	if spoiled && f.fault == "headers" {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	answer := f.base.RoundTrip
	if f.whole != nil && r.Header.Get("Range") != "" {
		answer = f.whole
	}
	resp, err := answer(r)
	if err != nil || !spoiled {
		return resp, err
	}
	resp.Body = &spoiledBody{ReadCloser: resp.Body, ctx: r.Context(), left: f.after, stall: f.fault == "stall"}
	return resp, nil
}

func (f *faultyTransport) log() []packGet {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]packGet(nil), f.gets...)
}

// spoiledBody passes left bytes, then fails or (stall) waits: for its
// request to be cut, or for gate (if set) to close, when it reads on.
type spoiledBody struct {
	io.ReadCloser
	ctx   context.Context
	left  int64
	stall bool
	gate  chan struct{}
}

func (b *spoiledBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		if !b.stall {
			return 0, errors.New("connection reset (by the test)")
		}
		select {
		case <-b.gate: // a nil gate never opens
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		}
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p[:min(int64(len(p)), b.left)])
	b.left -= int64(n)
	return n, err
}

// storeWithImage starts an S3 server and puts in bucket, as key, a memory
// image of pages random pages (seed); it returns the server, the store's
// config, the image's source directory and its manifest.
func storeWithImage(t *testing.T, bucket, key string, pages int, seed uint64) (*s3test.Server, Config, string, Manifest) {
	t.Helper()
	srv := s3test.Start(t)
	cfg := testConfig(srv, bucket)
	src := filepath.Join(t.TempDir(), "src")
	memoryImage(t, src, randomPages(pages, seed))
	m, err := openStore(t, cfg).PutImage(testCtx(t), key, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return srv, cfg, src, m
}

// TestDownloadsResume: a node fetching an image whose pack downloads break
// or stall midway, or whose GETs are never answered, gets the image whole:
// each spoiled GET is asked again, from the byte it stopped at.
func TestDownloadsResume(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	srv, cfg, src, m := storeWithImage(t, "resume-downloads", "snapshots/r", 5000, 7) // three packs
	tmp := t.TempDir()
	const after = 300 << 10
	for _, fault := range []string{"break", "stall", "headers"} {
		t.Run(fault, func(t *testing.T) {
			ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), fault: fault, after: after, spoil: 2}
			c := cfg
			c.HTTPClient = &http.Client{Transport: ft}
			c.StallTimeout = 500 * time.Millisecond
			c.ChunkDir = t.TempDir() // a node without the packs
			dst := filepath.Join(tmp, "dst-"+fault)
			if _, err := openStore(t, c).Get(ctx, "snapshots/r", m.Digest, dst); err != nil {
				t.Fatalf("Get: %v", err)
			}
			equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
			gets := ft.log()
			for i, g := range gets {
				if !g.spoiled {
					continue
				}
				// A later GET of the same pack asks for what is missing.
				want := ""
				if fault != "headers" {
					want = fmt.Sprintf("bytes=%d-", after)
				}
				resumed := false
				for _, h := range gets[i+1:] {
					resumed = resumed || h.key == g.key && h.rng == want
				}
				if !resumed {
					t.Errorf("the spoiled GET of %s was not asked again with Range %q: %+v", g.key, want, gets)
				}
			}
			if len(gets) < len(m.Packs)+2 {
				t.Errorf("%d GETs of packs, want the %d packs and the 2 spoiled asked again", len(gets), len(m.Packs))
			}
		})
	}

	// A range of a pack (a frame a lazy restore reads) broken or stalled
	// midway. A stalled range is cut after rangeStallTimeout, well before
	// the store's stall timeout (the default, 30 s, here).
	for _, tc := range []struct {
		fault         string
		rangesIgnored bool
	}{{"break", false}, {"stall", false}, {"break", true}} {
		fault := tc.fault
		name := "range-" + fault
		if tc.rangesIgnored {
			name += "-ranges-ignored"
		}
		t.Run(name, func(t *testing.T) {
			ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), fault: fault, after: 1000, spoil: 1}
			if tc.rangesIgnored {
				// The first answer's 1000 bytes hold the range's first 900.
				ft.whole, ft.after = wholeAnswers(srv, cfg.Bucket), 1000
			}
			c := cfg
			c.HTTPClient = &http.Client{Transport: ft}
			s := openStore(t, c)
			ix, err := s.readIndex(ctx, "snapshots/r", m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			p := ix.packs[0]
			start := time.Now()
			got, err := s.getRange(ctx, p, 100, 300_000)
			if err != nil {
				t.Fatalf("getRange: %v", err)
			}
			if d := time.Since(start); fault == "stall" && d >= defaultStallTimeout {
				t.Errorf("a stalled range was asked again after %v, not after the ranges' %v", d, rangeStallTimeout)
			}
			out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(s.packKey(p.name()))})
			if err != nil {
				t.Fatal(err)
			}
			whole, err := io.ReadAll(out.Body)
			out.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, whole[100:300_000]) {
				t.Fatal("getRange over a spoiled GET returned other bytes than the pack's")
			}
			resumeAt := int64(1100)
			if tc.rangesIgnored {
				resumeAt = 1000
			}
			if gets := ft.log(); len(gets) != 2 || gets[1].rng != fmt.Sprintf("bytes=%d-299999", resumeAt) {
				t.Fatalf("GETs %+v, want the range, then the rest of it from byte %d", gets, resumeAt)
			}
		})
	}
}

// TestDownloadFromDeadStore: a store that never answers fails the Get in
// bounded time, saying it stalled, and leaves nothing.
func TestDownloadFromDeadStore(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	srv, cfg, _, m := storeWithImage(t, "dead-store", "snapshots/d", 500, 8) // one pack
	tmp := t.TempDir()
	for _, fault := range []string{"stall", "headers"} {
		ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), fault: fault, spoil: -1}
		c := cfg
		c.HTTPClient = &http.Client{Transport: ft}
		c.StallTimeout = time.Second
		c.ChunkDir = t.TempDir()
		dst := filepath.Join(tmp, "dst-"+fault)
		start := time.Now()
		_, err := openStore(t, c).Get(ctx, "snapshots/d", m.Digest, dst)
		if !errors.Is(err, errStalled) {
			t.Fatalf("%s: Get from a store that stalls = %v, want errStalled", fault, err)
		}
		// maxResumes+1 stalls and the pauses between them; a minute
		// allows a loaded machine.
		if d := time.Since(start); d > time.Minute {
			t.Errorf("%s: the Get took %v to fail", fault, d)
		}
		if n := len(ft.log()); n != maxResumes+1 {
			t.Errorf("%s: %d GETs of the pack, want %d", fault, n, maxResumes+1)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a failed Get left %s", fault, dst)
		}
	}

	// The download's ends, read by the reader itself.
	ix, err := openStore(t, cfg).readIndex(ctx, "snapshots/d", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	p := ix.packs[0]
	t.Run("ranges-ignored-breaking-before-the-range", func(t *testing.T) {
		// Each whole answer breaks before the range starts: re-reading
		// what precedes it is no progress, and the read ends.
		ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), fault: "break", after: 1000, spoil: -1,
			whole: wholeAnswers(srv, cfg.Bucket)}
		c := cfg
		c.HTTPClient = &http.Client{Transport: ft}
		_, err := openStore(t, c).getRange(ctx, p, 5000, 6000)
		if !errors.Is(err, errBroken) {
			t.Fatalf("getRange = %v, want errBroken", err)
		}
		if n := len(ft.log()); n != maxResumes+1 {
			t.Fatalf("%d GETs, want %d", n, maxResumes+1)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		// A download cancelled midway says so (the Get's own failure
		// then wins over its downloads'), and says it again after.
		ft := &faultyTransport{base: http.DefaultTransport.(*http.Transport).Clone(), fault: "stall", after: 1000, spoil: -1}
		c := cfg
		c.HTTPClient = &http.Client{Transport: ft}
		s := openStore(t, c)
		cctx, cancel := context.WithCancel(ctx)
		body, err := s.getPack(cctx, p.name())
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		time.AfterFunc(200*time.Millisecond, cancel)
		if _, err := io.ReadAll(body); !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled download: %v, want context.Canceled", err)
		}
		if _, err := body.Read(make([]byte, 10)); !errors.Is(err, context.Canceled) {
			t.Fatalf("a read after the end: %v, want context.Canceled again", err)
		}
		if n := len(ft.log()); n != 1 {
			t.Fatalf("%d GETs, want 1: nothing is asked after the end", n)
		}
	})
}
