package objectstore

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// putImages stores n images of size bytes of random data each, as
// images/0..n-1, and returns their source directories and digests.
func putImages(t *testing.T, store *Store, n int, size int64) (dirs, digests []string) {
	t.Helper()
	ctx := testCtx(t)
	for i := range n {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeRandom(t, filepath.Join(dir, "mem"), size, uint64(i+1))
		m, err := store.Put(ctx, fmt.Sprintf("images/%d", i), dir)
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
	cache, err := OpenCache(dir, 5*size/2, store)
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
	cache2, err := OpenCache(dir, 5*size/2, store)
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
	cache3, err := OpenCache(dir, 5*size/2, openStore(t, cfg))
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
	cache, err := OpenCache(t.TempDir(), 1<<30, store)
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
	cache, err := OpenCache(t.TempDir(), 1<<30, store)
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
