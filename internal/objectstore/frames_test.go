package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// packOf builds a pack of pages as the packer does (framed when framed),
// and its ref.
func packOf(t *testing.T, pages [][]byte, framed bool) ([]byte, packRef) {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var raw, sums []byte
	for _, pg := range pages {
		raw = append(raw, pg...)
		raw = append(raw, zeroPage[:pageSize-len(pg)]...)
		h := sha256.Sum256(pg)
		sums = append(sums, h[:]...)
	}
	var stored []byte
	if framed {
		stored = encodeFrames(enc, raw, nil)
	} else {
		stored = enc.EncodeAll(raw, nil) // as packs were before frames
	}
	stored = append(stored, sums...)
	return stored, packRef{digest: sha256.Sum256(stored), raw: int64(len(raw)), stored: int64(len(stored)), hashes: sha256.Sum256(sums)}
}

// A framed pack decodes whole as one zstd stream (the table is a
// skippable frame: what readers before frames do), its tail gives each
// frame's place, and each frame decodes alone to its pages. A pack from
// before frames has no table; a tail whose hash list was altered is
// refused.
func TestFramedPack(t *testing.T) {
	pages := randomPages(150, 3)   // frames of 64, 64 and 22 pages
	pages[149] = pages[149][:1000] // a file's short last page
	stored, p := packOf(t, pages, true)
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()

	whole, err := dec.DecodeAll(stored[:p.stored-p.hashBytes()], nil)
	if err != nil || int64(len(whole)) != p.raw {
		t.Fatalf("the framed pack decoded whole: %d bytes, %v; want %d", len(whole), err, p.raw)
	}
	tailLen := tableBytes(p.raw) + p.hashBytes()
	tail, err := parseTail(p, stored[p.stored-tailLen:])
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tail.starts); got != 4 {
		t.Fatalf("%d frame starts, want 3 frames and their end", got)
	}
	for j := range 3 {
		frame, err := dec.DecodeAll(stored[tail.starts[j]:tail.starts[j+1]], nil)
		if err != nil || !bytes.Equal(frame, whole[j*framePages*pageSize:min((j+1)*framePages*pageSize, len(whole))]) {
			t.Fatalf("frame %d alone: %v", j, err)
		}
		for k := 0; k < len(frame); k += pageSize {
			slot := j*framePages + k/pageSize
			if !tail.check(slot, frame[k:k+len(pages[slot])]) {
				t.Fatalf("page %d does not check against the hash list", slot)
			}
		}
	}
	if tail.check(0, pages[1]) {
		t.Fatal("another page checked as slot 0")
	}

	old, op := packOf(t, pages, false)
	if _, err := parseTail(op, old[op.stored-tableBytes(op.raw)-op.hashBytes():]); !errors.Is(err, errNotFramed) {
		t.Fatalf("a pack from before frames: %v, want errNotFramed", err)
	}
	bad := bytes.Clone(stored[p.stored-tailLen:])
	bad[len(bad)-1] ^= 1
	if _, err := parseTail(p, bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an altered hash list: %v, want ErrCorrupt", err)
	}
}

// gatedTransport holds whole-object GETs of packs until opened, and counts
// the ranged GETs of packs and their bytes.
type gatedTransport struct {
	base    http.RoundTripper
	gate    chan struct{}
	holding func() bool
	// refuseRanges answers ranged GETs of packs with an error, as a store
	// without them might.
	refuseRanges bool

	mu          sync.Mutex
	ranged      int
	rangedBytes int64
	heldWhole   int
}

func (g *gatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/"+chunksDir+"/") {
		return g.base.RoundTrip(r)
	}
	if r.Header.Get("Range") != "" {
		if g.refuseRanges {
			return &http.Response{StatusCode: http.StatusNotImplemented, Status: "501 Not Implemented",
				Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}
		resp, err := g.base.RoundTrip(r)
		if err == nil {
			g.mu.Lock()
			g.ranged++
			g.rangedBytes += resp.ContentLength
			g.mu.Unlock()
		}
		return resp, err
	}
	if g.holding() {
		g.mu.Lock()
		g.heldWhole++
		g.mu.Unlock()
		select {
		case <-g.gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return g.base.RoundTrip(r)
}

// A read of a lazy memory file waiting on pages of a pack not yet here is
// served by ranged GETs of that pack's frames, while the pack's whole
// download is held back: the range is written before any whole pack of the
// file arrives, from a few hundred KiB rather than the pack's 8 MiB, and
// the image ends whole and equal. A store refusing ranged GETs falls back
// to downloading the pack at once.
func TestGetLazyFetchesFrames(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "frames")
	tmp := t.TempDir()
	store := openStore(t, cfg)
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, randomPages(6000, 11))
	m, err := store.PutImage(ctx, "snapshots/frames", src, nil)
	if err != nil {
		t.Fatal(err)
	}

	for _, refuse := range []bool{false, true} {
		gate := make(chan struct{})
		var begun, opened sync.Once
		var holding bool
		var mu sync.Mutex
		g := &gatedTransport{base: http.DefaultTransport.(*http.Transport).Clone(), gate: gate, refuseRanges: refuse,
			holding: func() bool { mu.Lock(); defer mu.Unlock(); return holding && !refuse }}
		c := cfg
		c.ChunkDir = t.TempDir()
		c.HTTPClient = &http.Client{Transport: g}
		fresh := openStore(t, c)

		// A page in the middle pack: downloaded only after the handover.
		urgentOff, urgentLen := int64(3000*pageSize+100), int64(2*pageSize)
		var (
			wmu       sync.Mutex
			pages     = map[int64]bool{}
			urgentAt  = -1
			writes    int
			size      int64
			timedOut  bool
			timeoutCh = time.After(time.Minute)
		)
		written := func(off, n int64) {
			wmu.Lock()
			defer wmu.Unlock()
			writes++
			for p := off / pageSize; p < (off+n+pageSize-1)/pageSize; p++ {
				pages[p] = true
			}
			if urgentAt < 0 && pages[urgentOff/pageSize] && pages[(urgentOff+urgentLen-1)/pageSize] {
				urgentAt = writes
				opened.Do(func() { close(gate) })
			}
		}
		go func() {
			select {
			case <-gate:
			case <-timeoutCh:
				wmu.Lock()
				timedOut = true
				wmu.Unlock()
				opened.Do(func() { close(gate) })
			}
		}()
		dst := filepath.Join(tmp, "dst-"+map[bool]string{false: "frames", true: "whole"}[refuse])
		_, err := fresh.GetLazy(ctx, "snapshots/frames", m.Digest, dst, LazyFile{Name: "pages.img",
			Begin: func(sz int64, prioritize func(off, n int64)) (func(off, n int64), error) {
				begun.Do(func() {
					mu.Lock()
					holding = true
					mu.Unlock()
				})
				size = sz
				prioritize(urgentOff, urgentLen)
				return written, nil
			}})
		if err != nil {
			t.Fatalf("GetLazy (ranges refused: %v): %v", refuse, err)
		}
		equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
		wmu.Lock()
		for p := int64(0); p*pageSize < size; p++ {
			if !pages[p] {
				t.Fatalf("page %d never said written", p)
			}
		}
		if timedOut || urgentAt < 0 {
			t.Fatalf("ranges refused: %v: the waited-for range was not written while whole packs were held (timed out: %v)", refuse, timedOut)
		}
		wmu.Unlock()
		g.mu.Lock()
		if !refuse {
			if g.ranged < 2 || g.rangedBytes > 2*framePages*pageSize {
				t.Errorf("%d ranged GETs of %d bytes for a 2-page range: want the tail and a frame, well under a pack", g.ranged, g.rangedBytes)
			}
			if g.heldWhole == 0 {
				t.Error("no whole pack download was held: the test did not test the frames")
			}
		} else if g.ranged != 0 {
			t.Errorf("%d ranged GETs counted though refused", g.ranged)
		}
		g.mu.Unlock()
	}
}

// Frame fetches end with the Get: a Get cancelled while its ranged GETs
// wait leaves nothing running and nothing behind.
func TestGetLazyFramesCancelled(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "frames-cancel")
	tmp := t.TempDir()
	store := openStore(t, cfg)
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, randomPages(5000, 12))
	m, err := store.PutImage(testCtx(t), "snapshots/frames", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg
	c.ChunkDir = t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/"+chunksDir+"/") {
			cancel() // the first pack (or frame) asked for: the Get ends here
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	fresh := openStore(t, c)
	dst := filepath.Join(tmp, "dst")
	_, err = fresh.GetLazy(ctx, "snapshots/frames", m.Digest, dst, LazyFile{Name: "pages.img",
		Begin: func(sz int64, prioritize func(off, n int64)) (func(off, n int64), error) {
			prioritize(sz/2, pageSize)
			return func(int64, int64) {}, nil
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("GetLazy cancelled: %v", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cancelled GetLazy left %s", dst)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
