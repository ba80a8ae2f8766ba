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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// putImages stores n images of size bytes of random data each, as
// images/0..n-1, and returns their source directories and digests.
func putImages(t *testing.T, store *Store, n int, size int64) (dirs, digests []string) {
	return putRandom(t, n, size, store.Put)
}

// putRandom stores n images of size bytes of random data each with put, as
// images/0..n-1, and returns their source directories and digests.
func putRandom(t *testing.T, n int, size int64, put func(ctx context.Context, key, dir string) (Manifest, error)) (dirs, digests []string) {
	t.Helper()
	ctx := testCtx(t)
	for i := range n {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeRandom(t, filepath.Join(dir, "mem"), size, uint64(i+1))
		m, err := put(ctx, fmt.Sprintf("images/%d", i), dir)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
		digests = append(digests, m.Digest)
	}
	return dirs, digests
}

func TestCacheEvictionSparesEntriesInUse(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "cache-evict"))
	ctx := testCtx(t)
	const size = 1 << 20
	srcs, digests := putImages(t, store, 5, size)
	dir := t.TempDir()
	// Room for two and a half images.
	cache, err := OpenCache(dir, 5*size/2, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()

	held, err := cache.Acquire(ctx, "images/0", digests[0])
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 5; i++ {
		h, err := cache.Acquire(ctx, fmt.Sprintf("images/%d", i), digests[i])
		if err != nil {
			t.Fatal(err)
		}
		equalFiles(t, filepath.Join(srcs[i], "mem"), filepath.Join(h.Path(), "mem"))
		h.Release()
		// The held image survives every eviction, whole.
		equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(held.Path(), "mem"))
		if got := cache.Size(); got > 5*size/2+size/4 {
			t.Fatalf("cache holds %d bytes, limit %d", got, 5*size/2)
		}
	}
	if got, want := cache.Keys(), []string{"images/4", "images/0"}; !slices.Equal(got, want) {
		t.Fatalf("cached %v, want %v", got, want)
	}
	// Released, the held image is the least recently used and goes next.
	held.Release()
	h, err := cache.Acquire(ctx, "images/1", digests[1])
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if got, want := cache.Keys(), []string{"images/1", "images/4"}; !slices.Equal(got, want) {
		t.Fatalf("cached %v, want %v", got, want)
	}
	cache.Close()

	// A restart keeps complete entries and their order, and drops debris
	// of an interrupted download.
	if err := os.MkdirAll(filepath.Join(dir, tmpPrefix+"interrupted", entryImage), 0o755); err != nil {
		t.Fatal(err)
	}
	cache2, err := OpenCache(dir, 5*size/2, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache2.Close()
	if got, want := cache2.Keys(), []string{"images/1", "images/4"}; !slices.Equal(got, want) {
		t.Fatalf("after restart cached %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, tmpPrefix+"interrupted")); !os.IsNotExist(err) {
		t.Fatalf("temporary dir survived the restart: %v", err)
	}
	counter := newCountingTransport()
	cfg := testConfig(srv, "cache-evict")
	cfg.HTTPClient = &http.Client{Transport: counter}
	cache3, err := OpenCache(dir, 5*size/2, openStore(t, cfg), CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache3.Close()
	h, err = cache3.Acquire(ctx, "images/4", digests[4])
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	equalFiles(t, filepath.Join(srcs[4], "mem"), filepath.Join(h.Path(), "mem"))
	if n := counter.count("GET " + dataName); n != 0 {
		t.Fatalf("a cached image was downloaded again after restart (%d requests)", n)
	}
}

func TestCacheConcurrentColdAcquireDownloadsOnce(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	counter := newCountingTransport()
	cfg := testConfig(srv, "cache-once")
	cfg.HTTPClient = &http.Client{Transport: counter}
	store := openStore(t, cfg)
	srcs, digests := putImages(t, store, 1, 8<<20)
	ctx := testCtx(t)
	cache, err := OpenCache(t.TempDir(), 1<<30, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()

	const n = 8
	var wg sync.WaitGroup
	handles := make([]*Handle, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			handles[i], errs[i] = cache.Acquire(ctx, "images/0", digests[0])
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if handles[i].Path() != handles[0].Path() {
			t.Fatalf("handles disagree: %s, %s", handles[i].Path(), handles[0].Path())
		}
		defer handles[i].Release()
	}
	equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(handles[0].Path(), "mem"))
	if got := counter.count("GET " + dataName); got != 1 {
		t.Fatalf("%d concurrent cold acquires downloaded the image %d times, want 1", n, got)
	}
}

func TestCachePurgeWaitsForRelease(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	counter := newCountingTransport()
	cfg := testConfig(srv, "cache-purge")
	cfg.HTTPClient = &http.Client{Transport: counter}
	store := openStore(t, cfg)
	srcs, digests := putImages(t, store, 1, 1<<20)
	ctx := testCtx(t)
	cache, err := OpenCache(t.TempDir(), 1<<30, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	h, err := cache.Acquire(ctx, "images/0", digests[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Purge("images/0"); err != nil {
		t.Fatal(err)
	}
	// In use: still there, though no longer cached.
	equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(h.Path(), "mem"))
	if keys := cache.Keys(); len(keys) != 0 {
		t.Fatalf("purged key still cached: %v", keys)
	}
	// A new acquire fetches again, beside the old copy.
	h2, err := cache.Acquire(ctx, "images/0", digests[0])
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release()
	if h2.Path() == h.Path() {
		t.Fatal("a fresh download reused the purged entry's directory")
	}
	if n := counter.count("GET " + dataName); n != 2 {
		t.Fatalf("%d downloads, want 2", n)
	}
	h.Release()
	if _, err := os.Stat(h.Path()); !os.IsNotExist(err) {
		t.Fatalf("purged entry survived its release: %v", err)
	}
	equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(h2.Path(), "mem"))
}

// testStreamer records what the cache does with a lazy entry; its first
// Written blocks until gate closes, so the test sees the entry mid-fill.
type testStreamer struct {
	gate    chan struct{}
	started chan struct{} // closed by Start, if set
	onStart func()        // called by Start, if set

	mu       sync.Mutex
	dir      string
	resumed  string
	written  int64
	finished chan error
	closed   bool
}

func (s *testStreamer) File() string { return "pages.img" }

func (s *testStreamer) Start(dir string, size int64, prioritize func(off, n int64), resumed string) (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(dir); err != nil {
		return nil, err // the real one writes its options there
	}
	s.dir, s.resumed = dir, resumed
	if s.onStart != nil {
		s.onStart()
	}
	if s.started != nil {
		close(s.started)
	}
	return s, nil
}

func (s *testStreamer) Written(off, n int64) {
	<-s.gate
	s.mu.Lock()
	s.written += n
	s.mu.Unlock()
}

func (s *testStreamer) Finish(err error) error {
	s.finished <- err
	return nil
}

func (s *testStreamer) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *testStreamer) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// A lazy entry is acquired before its memory file is written, shared by a
// second Acquire meanwhile, recorded only once complete (and so kept by
// the next open), and dropped if the fetch fails after the handover.
func TestCacheLazyEntries(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "cache-lazy")
	store := openStore(t, cfg)
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	memoryImage(t, src, randomPages(4000, 11))
	m, err := store.PutImage(ctx, "templates/lazy", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st := &testStreamer{gate: make(chan struct{}), finished: make(chan error, 1)}
	cache, err := OpenCache(dir, 1<<30, store, CacheOptions{Streamer: st, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}

	h1, err := cache.Acquire(ctx, "templates/lazy", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Handed over: every other file there, the memory file at its size,
	// nothing recorded yet.
	equalFiles(t, filepath.Join(src, "checkpoint.img"), filepath.Join(h1.Path(), "checkpoint.img"))
	if fi, err := os.Stat(filepath.Join(h1.Path(), "pages.img"+PartialSuffix)); err != nil || fi.Size() != int64(4064*pageSize) {
		t.Fatalf("pages.img at the handover: %v, %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(h1.Path()), entryMetaF)); err == nil {
		t.Fatal("the entry was recorded before its memory file was complete")
	}
	h2, err := cache.Acquire(ctx, "templates/lazy", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Path() != h1.Path() {
		t.Fatalf("a second Acquire mid-fill got %s, want the same entry %s", h2.Path(), h1.Path())
	}
	close(st.gate)
	if err := <-st.finished; err != nil {
		t.Fatalf("Finish(%v)", err)
	}
	h1.Release()
	h2.Release()
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(h1.Path(), "pages.img"))
	waitUntil(t, "the entry recorded", func() bool { return cache.Size() > 0 })
	if _, err := os.Stat(filepath.Join(filepath.Dir(h1.Path()), entryMetaF)); err != nil {
		t.Fatalf("complete entry not recorded: %v", err)
	}
	cache.Close()
	reopened, err := OpenCache(dir, 1<<30, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	if got := reopened.Keys(); !slices.Equal(got, []string{"templates/lazy"}) {
		t.Fatalf("after reopening: %v", got)
	}

	// A pack of the memory file missing, found so only after the handover
	// (its download held until then): the Acquire is handed the image, the
	// fill fails, the entry goes once released.
	m2, err := store.PutImage(ctx, "templates/broken", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := store.fetchIndex(ctx, m2, m2.Digest)
	if err != nil {
		t.Fatal(err)
	}
	first, count, _, _, err := lazyPages(ix, "pages.img")
	if err != nil {
		t.Fatal(err)
	}
	// The pack of the memory file's last stored page, if no other file
	// uses it.
	last := ix.pages[first+count-65].pack
	for p, pg := range ix.pages {
		if (p < first || p >= first+count) && pg.pack == last {
			t.Fatal("the memory file's last pack holds another file's page; the test needs another layout")
		}
	}
	bst := &testStreamer{gate: make(chan struct{}), started: make(chan struct{}), finished: make(chan error, 1)}
	close(bst.gate)
	lastKey := store.packKey(ix.packs[last-1].name())
	ocfg := cfg
	ocfg.ChunkDir = t.TempDir() // no packs on its disk
	ocfg.HTTPClient = &http.Client{Transport: &hookTransport{base: http.DefaultTransport, method: http.MethodGet, suffix: lastKey, hook: func() {
		<-bst.started
		if _, err := srv.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(lastKey)}); err != nil {
			t.Error(err)
		}
	}}}
	other := openStore(t, ocfg)
	broken, err := OpenCache(t.TempDir(), 1<<30, other, CacheOptions{Streamer: bst, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer broken.Close()
	h, err := broken.Acquire(ctx, "templates/broken", m2.Digest)
	if err != nil {
		t.Fatalf("Acquire: %v (the missing pack is the memory file's: the image is handed over first)", err)
	}
	if err := <-bst.finished; !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Finish(%v), want ErrCorrupt", err)
	}
	waitUntil(t, "the failed entry dropped", func() bool { return len(broken.Keys()) == 0 })
	h.Release()
	if _, err := os.Stat(filepath.Dir(h.Path())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed entry's directory stayed: %v", err)
	}
	if !bst.isClosed() {
		t.Fatal("the failed entry's stream was not closed")
	}
}

// waitUntil polls cond for up to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stallTransport holds every GET of a pack, once stall is set, until its
// request is cancelled: a fetch stopped midway.
type stallTransport struct {
	base  http.RoundTripper
	stall atomic.Bool
}

func (s *stallTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/chunks/") && s.stall.Load() {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return s.base.RoundTrip(r)
}

// A lazy fetch handed over and stopped by Close (a node stopping) is left
// as it is, its readers not failed; the next open resumes it into the same
// file (which a reader holds open), hands it to a stream told of the
// fetch it resumes, and completes it, even where new fetches are no
// longer lazy. Debris of fetches never handed over goes, and so does a
// resume that crashed before its own handover.
func TestCacheResumesLazyFetch(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "cache-resume")
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	memoryImage(t, src, randomPages(4000, 17))
	m, err := openStore(t, cfg).PutImage(ctx, "snapshots/resume", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, oldImage, held := stoppedLazyFetch(t, cfg, "snapshots/resume", m.Digest)
	gate := make(chan struct{})
	close(gate)
	// Debris: a fetch that never got as far as its lazy file.
	debris := filepath.Join(dir, entryName("snapshots/other")+"-1")
	if err := os.MkdirAll(filepath.Join(debris, entryImage), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(debris, entryFetchF), []byte(`{"key":"snapshots/other","digest":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A resume that crashed before its own handover: newer, its file
	// linked in, but no stream told the readers of it. The fetch it
	// resumed is the one to resume again.
	crashed := filepath.Join(dir, entryName("snapshots/resume")+"-9")
	if err := os.MkdirAll(filepath.Join(crashed, entryImage), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(oldImage, "pages.img"+PartialSuffix), filepath.Join(crashed, entryImage, "pages.img"+PartialSuffix)); err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(filepath.Dir(oldImage), entryFetchF))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crashed, entryFetchF), meta, 0o600); err != nil {
		t.Fatal(err)
	}

	// Resumed by a node that no longer restores lazily itself, whose
	// store does not answer at first.
	var failing atomic.Int32
	rcfg := cfg
	rcfg.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if failing.Add(-1) >= 0 {
			return nil, errors.New("the store is not reachable yet")
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	unreachable := openStore(t, rcfg)
	failing.Store(4) // more than the SDK's own attempts of one request (three)
	second := &testStreamer{gate: gate, started: make(chan struct{}), finished: make(chan error, 1)}
	resumed, err := OpenCache(dir, 1<<30, unreachable, CacheOptions{Streamer: second})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	select {
	case err := <-second.finished:
		if err != nil {
			t.Fatalf("the resumed fetch: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the resumed fetch never finished (its first attempt failed: was it tried again?)")
	}
	if n := failing.Load(); n >= 0 {
		t.Fatalf("%d of the store's failures left: the resume's first attempt did not fail", n+1)
	}
	second.mu.Lock()
	from := second.resumed
	second.mu.Unlock()
	if from != oldImage {
		t.Fatalf("the resumed stream was told of %q, want %q", from, oldImage)
	}
	// The file the reader held has every page now.
	want, err := os.ReadFile(filepath.Join(src, "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(held)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the memory file a reader held is not the image's")
	}
	for _, gone := range []string{filepath.Dir(oldImage), debris, crashed} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s stayed: %v", gone, err)
		}
	}
	waitUntil(t, "the resumed entry recorded", func() bool { return resumed.Size() > 0 })
	h, err := resumed.Acquire(ctx, "snapshots/resume", m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(h.Path(), "pages.img"))
	equalFiles(t, filepath.Join(src, "checkpoint.img"), filepath.Join(h.Path(), "checkpoint.img"))
}

// stoppedLazyFetch acquires image key (digest) lazily, through a store
// whose downloads stall from the handover on, has a reader (a restored
// sandbox's gofer) hold its memory file open, and closes the cache: the
// fetch is left for the next open to resume. It returns the cache's
// directory, the stopped fetch's image and the reader's file.
func stoppedLazyFetch(t *testing.T, cfg Config, key, digest string) (dir, image string, held *os.File) {
	t.Helper()
	stalling := &stallTransport{base: http.DefaultTransport.(*http.Transport).Clone()}
	scfg := cfg
	scfg.ChunkDir = t.TempDir()
	scfg.HTTPClient = &http.Client{Transport: stalling}
	stalled := openStore(t, scfg)

	dir = t.TempDir()
	gate := make(chan struct{})
	close(gate)
	first := &testStreamer{gate: gate, finished: make(chan error, 1),
		onStart: func() { stalling.stall.Store(true) }} // the memory file's packs never come
	cache, err := OpenCache(dir, 1<<30, stalled, CacheOptions{Streamer: first, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	h, err := cache.Acquire(testCtx(t), key, digest)
	if err != nil {
		t.Fatal(err)
	}
	image = h.Path()
	held, err = os.Open(filepath.Join(image, "pages.img"+PartialSuffix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	h.Release()
	cache.Close()
	if !first.isClosed() {
		t.Fatal("the stopped fetch's stream was not closed")
	}
	if len(first.finished) != 0 {
		t.Fatalf("the stopped fetch was finished (%v): its readers would fail", <-first.finished)
	}
	if _, err := os.Stat(filepath.Join(image, "pages.img"+PartialSuffix)); err != nil {
		t.Fatalf("the stopped fetch's directory went: %v", err)
	}
	return dir, image, held
}

// TestCacheResumeOfDeletedImage: an image deleted from the store while a
// node was stopped mid-fetch cannot be resumed; the next open fails the
// readers of its memory file at once (their sandboxes end) rather than
// retrying for minutes while they wait, and leaves nothing of it.
func TestCacheResumeOfDeletedImage(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "cache-resume-deleted")
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	memoryImage(t, src, randomPages(4000, 18))
	store := openStore(t, cfg)
	m, err := store.PutImage(ctx, "snapshots/gone", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, oldImage, _ := stoppedLazyFetch(t, cfg, "snapshots/gone", m.Digest)
	if err := store.Delete(ctx, "snapshots/gone"); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	close(gate)
	second := &testStreamer{gate: gate, finished: make(chan error, 1)}
	start := time.Now()
	resumed, err := OpenCache(dir, 1<<30, store, CacheOptions{Streamer: second})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	select {
	case err := <-second.finished:
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("the readers were failed with %v, want ErrNotFound", err)
		}
	case <-time.After(time.Minute): // the retries of a store unreachable last 4 minutes
		t.Fatal("the readers of a deleted image were not failed within a minute")
	}
	t.Logf("readers failed %v after the open", time.Since(start))
	second.mu.Lock()
	from := second.resumed
	second.mu.Unlock()
	if from != oldImage {
		t.Fatalf("the failing stream was told of %q, want %q (whose readers wait)", from, oldImage)
	}
	waitUntil(t, "the stopped fetch removed", func() bool {
		_, err := os.Stat(filepath.Dir(oldImage))
		return errors.Is(err, os.ErrNotExist)
	})
	waitUntil(t, "the failing stream closed", second.isClosed)
	if resumed.Size() != 0 {
		t.Fatalf("the cache holds %d bytes of a failed resume", resumed.Size())
	}
}
