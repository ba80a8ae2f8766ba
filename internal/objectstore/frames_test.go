package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
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

// gatedTransport holds whole-object GETs of packs while holding says so,
// until gate closes, and counts the ranged GETs of packs and their bytes.
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
	refused     int
	heldWhole   int
	// asked counts the ranged GETs of each range of each pack.
	asked map[string]int
}

// askedTwice is a range of a pack asked for more than once, "" if none.
func (g *gatedTransport) askedTwice() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	for r, n := range g.asked {
		if n > 1 {
			return r
		}
	}
	return ""
}

func (g *gatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/"+chunksDir+"/") {
		return g.base.RoundTrip(r)
	}
	if r.Header.Get("Range") != "" {
		g.mu.Lock()
		if g.asked == nil {
			g.asked = map[string]int{}
		}
		g.asked[r.URL.Path+" "+r.Header.Get("Range")]++
		refuse := g.refuseRanges
		if refuse {
			g.refused++
		}
		g.mu.Unlock()
		if refuse {
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

// Reads of a lazy memory file waiting on pages of a pack not yet here:
//   - framed packs: the frames holding them come by ranged GETs while
//     every whole download of the file's packs is held back, so the ranges
//     are written before any whole pack arrives, from the pack's tail and
//     two frames rather than its 8 MiB;
//   - a store refusing ranged GETs, and packs from before frames: the
//     pack is asked for its tail once (not once a fault), then fetched
//     whole; the ranges still arrive.
//
// Every time the image ends whole and equal, each page said written.
func TestGetLazyFetchesFrames(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	tmp := t.TempDir()
	pages := randomPages(6000, 11)
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, pages)

	for _, tc := range []struct {
		name     string
		unframed bool // the image's packs written as before frames
		refuse   bool // the store refuses ranged GETs
	}{
		{name: "frames"},
		{name: "ranges-refused", refuse: true},
		{name: "packs-before-frames", unframed: true},
	} {
		cfg := testConfig(srv, "frames-"+tc.name)
		writer := openStore(t, cfg)
		writer.unframedPacks = tc.unframed
		m, err := writer.PutImage(ctx, "snapshots/frames", src, nil)
		if err != nil {
			t.Fatal(err)
		}
		hold := !tc.refuse && !tc.unframed // only frames can serve the ranges then
		gate := make(chan struct{})
		var opened sync.Once
		var mu sync.Mutex
		var begun bool
		g := &gatedTransport{base: http.DefaultTransport.(*http.Transport).Clone(), gate: gate, refuseRanges: tc.refuse,
			holding: func() bool { mu.Lock(); defer mu.Unlock(); return begun && hold }}
		c := cfg
		c.ChunkDir = t.TempDir()
		c.HTTPClient = &http.Client{Transport: g}
		fresh := openStore(t, c)

		// Two ranges in the middle pack (downloaded only after the
		// handover), in different frames. Then the in-order load's first
		// read (the first pack, downloaded before the handover), and a
		// range of the middle pack near enough to count as that load's: it
		// waits for its pack's download, and is hedged by a frame fetch
		// once that is late (here never coming).
		ranges := [][2]int64{{3000*pageSize + 100, 2 * pageSize}, {3100 * pageSize, pageSize}, {0, 1000 * pageSize}, {2100 * pageSize, pageSize}}
		var (
			wmu      sync.Mutex
			said     = map[int64]bool{}
			served   bool
			size     int64
			timedOut bool
		)
		servedAll := func() bool {
			for _, r := range ranges {
				for p := r[0] / pageSize; p*pageSize < r[0]+r[1]; p++ {
					if !said[p] {
						return false
					}
				}
			}
			return true
		}
		written := func(off, n int64) {
			wmu.Lock()
			defer wmu.Unlock()
			for p := off / pageSize; p < (off+n+pageSize-1)/pageSize; p++ {
				said[p] = true
			}
			if !served && servedAll() {
				served = true
				opened.Do(func() { close(gate) })
			}
		}
		go func() {
			select {
			case <-gate:
			case <-time.After(time.Minute):
				wmu.Lock()
				timedOut = true
				wmu.Unlock()
				opened.Do(func() { close(gate) })
			}
		}()
		dst := filepath.Join(tmp, "dst-"+tc.name)
		_, err = fresh.GetLazy(ctx, "snapshots/frames", m.Digest, dst, LazyFile{Name: "pages.img",
			Begin: func(sz int64, prioritize func(off, n int64)) (func(off, n int64), error) {
				mu.Lock()
				begun = true
				mu.Unlock()
				size = sz
				for _, r := range ranges {
					prioritize(r[0], r[1])
				}
				return written, nil
			}})
		if err != nil {
			t.Fatalf("%s: GetLazy: %v", tc.name, err)
		}
		equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
		wmu.Lock()
		for p := int64(0); p*pageSize < size; p++ {
			if !said[p] {
				t.Fatalf("%s: page %d never said written", tc.name, p)
			}
		}
		if hold && (timedOut || !served) {
			t.Fatalf("%s: the ranges read were not written while whole packs were held (timed out: %v)", tc.name, timedOut)
		}
		wmu.Unlock()
		// Each pack's tail is asked for once at most (by the fault's frame
		// fetch or by the pack's streamed download, whichever is first),
		// and nothing is asked twice.
		if r := g.askedTwice(); r != "" {
			t.Errorf("%s: %s asked for more than once", tc.name, r)
		}
		packs := len(m.Packs)
		tail := tableBytes(packTarget) + packTarget/pageSize*hashSize
		g.mu.Lock()
		switch {
		case hold:
			if g.ranged > packs+3 || g.rangedBytes > int64(packs)*tail+4*framePages*pageSize {
				t.Errorf("%s: %d ranged GETs of %d bytes for three ranges in three frames: want the tails (%d packs) and three frames, well under a pack",
					tc.name, g.ranged, g.rangedBytes, packs)
			}
			if g.heldWhole == 0 {
				t.Errorf("%s: no whole pack download was held: the test did not test the frames", tc.name)
			}
		case tc.refuse:
			if g.refused < 1 || g.refused > packs || g.ranged != 0 {
				t.Errorf("%s: %d ranged GETs refused, %d answered; want one refused for a pack at most (its tail)", tc.name, g.refused, g.ranged)
			}
		case tc.unframed:
			if g.ranged < 1 || g.ranged > packs {
				t.Errorf("%s: %d ranged GETs; want one for a pack at most (its tail, found without a frame table)", tc.name, g.ranged)
			}
		}
		g.mu.Unlock()
	}
}

// Frame fetches end with the Get: a Get cancelled while a ranged GET of a
// frame waits ends, and leaves its image for a resumed fetch.
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
	defer cancel()
	var ranged atomic.Int32
	c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
			cancel() // the first ranged GET (a pack's tail): the Get ends here
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	fresh := openStore(t, c)
	dst := filepath.Join(tmp, "dst")
	begun := false
	_, err = fresh.GetLazy(ctx, "snapshots/frames", m.Digest, dst, LazyFile{Name: "pages.img",
		Begin: func(sz int64, prioritize func(off, n int64)) (func(off, n int64), error) {
			begun = true
			prioritize(sz/2, pageSize)
			return func(int64, int64) {}, nil
		}})
	if !errors.Is(err, context.Canceled) || !begun || ranged.Load() == 0 {
		t.Fatalf("GetLazy cancelled at a ranged GET: %v (begun: %v, ranged GETs: %d)", err, begun, ranged.Load())
	}
	// Handed over, then cancelled (a node stopping): readers may hold the
	// memory file, so dst stays for a resumed fetch, the file at its
	// partial name.
	if _, err := os.Lstat(filepath.Join(dst, "pages.img"+PartialSuffix)); err != nil {
		t.Errorf("a GetLazy cancelled after its handover did not leave its partial file: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// wholeAnswers answers a GET of an object of bucket in srv with the whole
// object, as a server that ignores Range does (Range is signed: the
// request cannot just drop it).
func wholeAnswers(srv *s3test.Server, bucket string) func(r *http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		key := strings.TrimPrefix(r.URL.Path, "/"+bucket+"/")
		out, err := srv.Client().GetObject(r.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			return nil, err
		}
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{},
			ContentLength: aws.ToInt64(out.ContentLength), Body: out.Body, Request: r}, nil
	}
}

// A store that ignores Range answers whole objects: a ranged read (a
// pack's tail, a frame, a parent's hash list) is cut from the answer.
func TestGetRangeWholeAnswer(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "range-ignored")
	src := filepath.Join(t.TempDir(), "src")
	memoryImage(t, src, randomPages(300, 13))
	m, err := openStore(t, cfg).PutImage(ctx, "snapshots/whole", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg
	whole := wholeAnswers(srv, cfg.Bucket)
	c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("Range") == "" {
			return http.DefaultTransport.RoundTrip(r)
		}
		return whole(r)
	})}
	s := openStore(t, c)
	ix, err := s.readIndex(ctx, "snapshots/whole", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	p := ix.packs[0]
	list, err := s.packHashes(ctx, p)
	if err != nil || int64(len(list)) != p.hashBytes() {
		t.Fatalf("hash list from a whole answer: %d bytes, %v", len(list), err)
	}
	tail, err := s.fetchTail(ctx, p)
	if err != nil {
		t.Fatalf("tail from a whole answer: %v", err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	frames, err := s.fetchFrames(ctx, p, tail, []int{1}, dec)
	if err != nil {
		t.Fatal(err)
	}
	if got := frames[1][:pageSize]; !tail.check(framePages, got) {
		t.Fatal("frame 1 cut from a whole answer does not check against the hash list")
	}
}

// stallingTransport stops every whole-object GET of a pack made once
// stalling is set after its first cut bytes until gate closes, as a slow
// download would be midway.
type stallingTransport struct {
	base     http.RoundTripper
	cut      int64
	gate     chan struct{}
	stalling atomic.Bool

	mu sync.Mutex
	// ends are the last bytes of the ranged GETs of each pack.
	ends map[string][]int64
}

// frameFetches counts the ranged GETs that were not of a pack's tail (the
// range ending furthest in its pack).
func (s *stallingTransport) frameFetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ends := range s.ends {
		last := slices.Max(ends)
		for _, e := range ends {
			if e < last {
				n++
			}
		}
	}
	return n
}

func (s *stallingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if rg := r.Header.Get("Range"); rg != "" {
		var from, to int64
		if _, err := fmt.Sscanf(rg, "bytes=%d-%d", &from, &to); err == nil {
			s.mu.Lock()
			if s.ends == nil {
				s.ends = map[string][]int64{}
			}
			s.ends[r.URL.Path] = append(s.ends[r.URL.Path], to)
			s.mu.Unlock()
		}
	}
	resp, err := s.base.RoundTrip(r)
	if err != nil || !s.stalling.Load() || r.Method != http.MethodGet || r.Header.Get("Range") != "" ||
		!strings.Contains(r.URL.Path, "/"+chunksDir+"/") {
		return resp, err
	}
	resp.Body = &spoiledBody{ReadCloser: resp.Body, left: s.cut, stall: true, gate: s.gate, ctx: r.Context()}
	return resp, nil
}

// The memory file's packs are written frame by frame as their bytes come:
// with every download after the handover stalled after its first two
// frames, pages of the file are said written. A read of a page a stream
// has written fetches nothing (no frame is fetched alone). A pack altered in the bucket fails the Get, which leaves
// nothing, and no page of the altered frame is said written.
func TestGetLazyStreamsPacks(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, randomPages(6000, 13))
	cfg := testConfig(srv, "streams")
	m, err := openStore(t, cfg).PutImage(ctx, "snapshots/streams", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Packs) < 2 {
		t.Fatalf("image of %d packs; the test needs several", len(m.Packs))
	}
	fresh := func(rt http.RoundTripper) *Store {
		c := cfg
		c.ChunkDir = t.TempDir()
		c.HTTPClient = &http.Client{Transport: rt}
		return openStore(t, c)
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	// The packs only the memory file uses: those that are streamed.
	ix, err := fresh(base).readIndex(ctx, "snapshots/streams", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	first, count, _, _, err := lazyPages(ix, "pages.img")
	if err != nil {
		t.Fatal(err)
	}
	streamed := map[uint32]bool{}
	for _, pg := range ix.pages[first : first+count] {
		streamed[pg.pack] = true
	}
	for p, pg := range ix.pages {
		if p < first || p >= first+count {
			delete(streamed, pg.pack)
		}
	}

	gate := make(chan struct{})
	var mu sync.Mutex
	said := map[int64]bool{}
	saidWhileStalled := 0
	var prioritize func(off, n int64)
	asked := false // a page a stream wrote, read
	written := func(off, n int64) {
		mu.Lock()
		defer mu.Unlock()
		for p := off / pageSize; p < (off+n+pageSize-1)/pageSize; p++ {
			said[p] = true
		}
		if off >= 6000*pageSize {
			return // the zero run at the end, said at once
		}
		// Past the slack within which a read counts as the load's in order
		// (inOrderSlack), so that it is one a fault makes.
		if !asked && off > inOrderSlack && streamed[ix.pages[first+int(off/pageSize)].pack] {
			asked = true
			prioritize(off, pageSize)
		}
		select {
		case <-gate:
		default:
			saidWhileStalled++
			if saidWhileStalled == 4 {
				close(gate) // pages of more than one frame came mid-pack
			}
		}
	}
	go func() { // the test fails below, rather than hangs, if none come
		select {
		case <-gate:
		case <-time.After(time.Minute):
			mu.Lock()
			if saidWhileStalled < 4 {
				saidWhileStalled = -1000
				close(gate)
			}
			mu.Unlock()
		}
	}()
	// Two frames of random pages, compressed, and a little of the third.
	st := &stallingTransport{base: base, cut: 2*framePages*pageSize + 8192, gate: gate}
	dst := filepath.Join(tmp, "dst")
	if _, err := fresh(st).GetLazy(ctx, "snapshots/streams", m.Digest, dst, LazyFile{Name: "pages.img",
		Begin: func(_ int64, prio func(off, n int64)) (func(off, n int64), error) {
			mu.Lock()
			prioritize = prio
			mu.Unlock()
			st.stalling.Store(true)
			return written, nil
		}}); err != nil {
		t.Fatalf("GetLazy: %v", err)
	}
	if n := st.frameFetches(); !asked || n != 0 {
		t.Errorf("a page a stream wrote read (%v): %d frames fetched, want none", asked, n)
	}
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
	mu.Lock()
	if saidWhileStalled < 4 {
		t.Errorf("no pages said written while every pack's download was midway (%d): packs are written only whole", saidWhileStalled)
	}
	for p := int64(0); p < 6000; p++ {
		if !said[p] {
			t.Fatalf("page %d never said written", p)
		}
	}
	mu.Unlock()
}

// A streamed pack whose frame decodes well but to a page other than the
// one its hash list (pinned by the index) names: the Get fails, leaves
// nothing, and that page of the file is never said written.
func TestGetLazyStreamChecksPages(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "stream-check")
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, randomPages(6000, 23))
	store := openStore(t, cfg)
	m, err := store.PutImage(ctx, "snapshots/check", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := store.readIndex(ctx, "snapshots/check", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// The last pack, its slot 69 (in frame 1) holding another page, framed
	// again, its hash list as it was: of the same size, as random pages
	// do not compress.
	pack := uint32(len(ix.packs))
	p := ix.packs[pack-1]
	key := aws.String(store.packKey(p.name()))
	out, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(cfg.Bucket), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(stored[:p.stored-p.hashBytes()], nil)
	if err != nil {
		t.Fatal(err)
	}
	const slot = framePages + 5
	copy(raw[slot*pageSize:], randomPages(1, 99)[0])
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	altered := append(encodeFrames(enc, raw, nil), stored[p.stored-p.hashBytes():]...)
	if int64(len(altered)) != p.stored {
		t.Fatalf("the altered pack is %d bytes, not %d: the test needs its size kept", len(altered), p.stored)
	}
	if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: key, Body: bytes.NewReader(altered)}); err != nil {
		t.Fatal(err)
	}
	first, _, _, _, err := lazyPages(ix, "pages.img")
	if err != nil {
		t.Fatal(err)
	}
	bad := int64(-1) // the file's page in the altered slot
	for fp, pg := range ix.pages[first:] {
		if pg.pack == pack && int(pg.off)/pageSize == slot {
			bad = int64(fp)
		}
	}
	if bad < 0 {
		t.Fatal("no page of the memory file in the altered slot")
	}

	c := cfg
	c.ChunkDir = t.TempDir()
	var mu sync.Mutex
	saidBad, saidAny := false, false
	dst := filepath.Join(tmp, "dst")
	_, err = openStore(t, c).GetLazy(ctx, "snapshots/check", m.Digest, dst, LazyFile{Name: "pages.img",
		Begin: func(int64, func(off, n int64)) (func(off, n int64), error) {
			return func(off, n int64) {
				mu.Lock()
				defer mu.Unlock()
				saidAny = true
				if off <= bad*pageSize && bad*pageSize < off+n {
					saidBad = true
				}
			}, nil
		}})
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("GetLazy with a page altered = %v, want ErrCorrupt", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !saidAny {
		t.Error("no page said written: the Get did not get as far as the file")
	}
	if saidBad {
		t.Errorf("page %d of the file, altered in its pack, was said written", bad)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed GetLazy left %s", dst)
	}
}
