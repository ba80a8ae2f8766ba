package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

func TestSpaceShort(t *testing.T) {
	const mib = 1 << 20
	disk := func(avail, size int64) FreeSpace {
		return func(string) (int64, int64, error) { return avail, size, nil }
	}
	for _, tc := range []struct {
		name    string
		free    FreeSpace
		minFree int64
		want    int64
	}{
		{"no floor", disk(0, 100*mib), 0, 0},
		{"enough free", disk(50*mib, 1000*mib), 20 * mib, 0},
		{"just enough", disk(20*mib, 1000*mib), 20 * mib, 0},
		{"short", disk(5*mib, 1000*mib), 20 * mib, 15 * mib},
		{"nothing free", disk(0, 1000*mib), 20 * mib, 20 * mib},
		{"a small disk caps the floor at a tenth", disk(5*mib, 100*mib), 20 * mib, 5 * mib},
		{"statfs fails: the budget alone", func(string) (int64, int64, error) { return 0, 0, errors.New("EIO") }, 20 * mib, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := spaceShort(tc.free, "/", tc.minFree); got != tc.want {
				t.Errorf("spaceShort = %d MiB, want %d MiB", got/mib, tc.want/mib)
			}
		})
	}
	// The real statfs answers for a real directory.
	avail, size, err := statFreeSpace(t.TempDir())
	if err != nil || size <= 0 || avail < 0 || avail > size {
		t.Errorf("statfs of a temporary directory: avail %d, size %d, %v", avail, size, err)
	}
}

// diskOf is a file system of size bytes on which *other bytes are taken
// by something else and the rest by the trees under dirs.
func diskOf(size int64, other *atomic.Int64, dirs ...string) FreeSpace {
	return func(string) (int64, int64, error) {
		used := other.Load()
		for _, d := range dirs {
			used += usageOf(d)
		}
		return size - used, size, nil
	}
}

// usageOf sums the blocks a tree occupies, as diskUsage does, skipping
// what the caches remove during the walk.
func usageOf(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // removed meanwhile
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// putChunked stores n chunked images of size bytes of random data each, as
// images/0..n-1, and returns their source directories and digests.
func putChunked(t *testing.T, store *Store, n int, size int64) (srcs, digests []string) {
	return putRandom(t, n, size, func(ctx context.Context, key, dir string) (Manifest, error) {
		return store.PutImage(ctx, key, dir, nil)
	})
}

// TestCachesGiveWayToAFullDisk: on a disk running full, the image cache and
// the chunk cache evict beyond their budgets to leave the free space asked
// for, no more than that, sparing images in use, images fetched in the last
// seconds (freshFor: the creates that waited for them take them) and the
// packs of fetches running; every image is still served whole, each fetched
// once.
func TestCachesGiveWayToAFullDisk(t *testing.T) {
	t.Parallel()
	const (
		mib     = 1 << 20
		size    = 2 * mib // each image: as much again in packs (chunked)
		images  = 8
		disk    = 100 * mib
		minFree = 10 * mib
	)
	srv := s3test.Start(t)
	ctx := testCtx(t)
	srcs, digests := putChunked(t, openStore(t, testConfig(srv, "cache-disk")), images, size)
	type caches struct {
		cache              *Cache
		store              *Store
		free               FreeSpace
		other              *atomic.Int64
		cacheDir, chunkDir string
		requests           *countingTransport
		clock              *testClock
	}
	// open opens both caches on a disk of which other is taken, with the
	// floor or without.
	open := func(t *testing.T, other int64, floor bool) caches {
		c := caches{cacheDir: t.TempDir(), chunkDir: t.TempDir(), other: &atomic.Int64{}, requests: newCountingTransport()}
		c.other.Store(other)
		c.free = diskOf(disk, c.other, c.cacheDir, c.chunkDir)
		cfg := testConfig(srv, "cache-disk")
		cfg.ChunkDir, cfg.ChunkBytes, cfg.FreeSpace = c.chunkDir, 1<<30, c.free
		cfg.HTTPClient = &http.Client{Transport: c.requests}
		opts := CacheOptions{FreeSpace: c.free}
		if floor {
			cfg.ChunkMinFree, opts.MinFree = minFree, minFree
		}
		var err error
		c.store = openStore(t, cfg)
		if c.cache, err = OpenCache(c.cacheDir, 1<<30, c.store, opts); err != nil {
			t.Fatal(err)
		}
		c.clock = &testClock{t: time.Now()}
		c.cache.now = c.clock.now
		t.Cleanup(c.cache.Close)
		return c
	}
	acquire := func(t *testing.T, c caches, i int) *Handle {
		h, err := c.cache.Acquire(ctx, fmt.Sprintf("images/%d", i), digests[i])
		if err != nil {
			t.Fatal(err)
		}
		equalFiles(t, filepath.Join(srcs[i], "mem"), filepath.Join(h.Path(), "mem"))
		return h
	}

	// One image after another, images/0 held throughout, on a disk with
	// room for about three above the floor.
	for _, floor := range []bool{false, true} {
		t.Run(fmt.Sprintf("in turn, floor=%v", floor), func(t *testing.T) {
			c := open(t, 84*mib, floor)
			held := acquire(t, c, 0)
			defer held.Release()
			for i := 1; i < 6; i++ {
				key := fmt.Sprintf("images/%d", i)
				acquire(t, c, i).Release()
				// The image held is never evicted, and stays whole.
				equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(held.Path(), "mem"))
				avail, _, _ := c.free(c.cacheDir)
				packs, _ := os.ReadDir(c.chunkDir)
				keys := c.cache.Keys()
				t.Logf("after %s: %d KiB free, cached %v, %d packs", key, avail>>10, keys, len(packs))
				if !floor {
					// The budgets alone keep everything.
					if len(keys) != i+1 {
						t.Fatalf("without a floor, after %s the cache holds %v", key, keys)
					}
					continue
				}
				if !slices.Contains(keys, "images/0") {
					t.Fatalf("after %s the image held is gone: %v", key, keys)
				}
				// Below the floor, nothing is left but the image held, the
				// one just fetched (fresh) and its pack (its fetch ran at
				// the last trim; the next trims it).
				if avail < minFree && (len(packs) > 1 || len(keys) > 2) {
					t.Fatalf("after %s: %d KiB free, floor %d MiB, yet the caches hold %v and %d packs",
						key, avail>>10, minFree/mib, keys, len(packs))
				}
				// Nor are more evicted than the floor asks: one image and its
				// pack past it at most.
				if avail > minFree+2*size+mib {
					t.Fatalf("after %s: %d KiB free, floor %d MiB: evicted past the floor", key, avail>>10, minFree/mib)
				}
				// The image just fetched stays a while: the creates that
				// waited for it take it then.
				c.clock.advance(freshFor)
			}
			if avail, _, _ := c.free(c.cacheDir); !floor && avail >= minFree {
				t.Fatalf("without a floor the disk kept %d MiB free: the test's disk is too large to show anything", avail/mib)
			}
		})
	}

	// Four images cached, then the disk fills by 3 MiB beyond the floor:
	// the two least recently used go (2 MiB each), not all four.
	t.Run("just enough", func(t *testing.T) {
		c := open(t, 0, true)
		for i := range 4 {
			acquire(t, c, i).Release()
		}
		if keys := c.cache.Keys(); len(keys) != 4 {
			t.Fatalf("with the disk empty the cache holds %v", keys)
		}
		c.clock.advance(freshFor)
		avail, _, _ := c.free(c.cacheDir)
		c.other.Store(avail - minFree + 3*mib)
		acquire(t, c, 3).Release() // a release looks at the floor
		if keys, want := c.cache.Keys(), []string{"images/3", "images/2"}; !slices.Equal(keys, want) {
			t.Fatalf("3 MiB short, the cache holds %v, want %v", keys, want)
		}
	})

	// Nothing fetched, uploaded or released while the disk fills from
	// elsewhere: the look on a clock (Reclaim, ReclaimChunks) evicts, and
	// leaves the caches alone while the disk has room.
	t.Run("on a clock", func(t *testing.T) {
		c := open(t, 0, true)
		for i := range 3 {
			acquire(t, c, i).Release()
		}
		c.clock.advance(freshFor)
		packs, _ := os.ReadDir(c.chunkDir)
		c.cache.Reclaim()
		c.store.ReclaimChunks()
		if after, _ := os.ReadDir(c.chunkDir); len(c.cache.Keys()) != 3 || len(after) != len(packs) {
			t.Fatalf("with room on the disk a look evicted: %v cached, %d of %d packs", c.cache.Keys(), len(after), len(packs))
		}
		c.other.Store(disk) // the sandboxes fill the disk
		c.cache.Reclaim()
		c.store.ReclaimChunks()
		if keys := c.cache.Keys(); len(keys) != 0 {
			t.Errorf("on a full disk a look left %v cached", keys)
		}
		if after, _ := os.ReadDir(c.chunkDir); len(after) != 0 {
			t.Errorf("on a full disk a look left %d packs", len(after))
		}
	})

	// The floor leaves the packs of a fetch running to it.
	t.Run("packs in use", func(t *testing.T) {
		c := open(t, 0, true)
		acquire(t, c, 0).Release()
		var first []string
		entries, _ := os.ReadDir(c.chunkDir)
		for _, e := range entries {
			first = append(first, e.Name())
		}
		for i := 1; i < 4; i++ {
			acquire(t, c, i).Release()
		}
		if entries, _ := os.ReadDir(c.chunkDir); len(first) == 0 || len(entries) <= len(first) {
			t.Fatalf("packs: %d of the first image, %d in all", len(first), len(entries))
		}
		c.store.usePacks(first, 1) // a fetch of the first image runs
		c.other.Store(disk)        // the disk is full
		c.store.trimChunks()
		var left []string
		entries, _ = os.ReadDir(c.chunkDir)
		for _, e := range entries {
			left = append(left, e.Name())
		}
		if !slices.Equal(left, first) {
			t.Fatalf("on a full disk the packs left are %v, want those in use %v", left, first)
		}
		c.store.usePacks(first, -1) // the fetch ends
		c.store.trimChunks()
		if entries, _ := os.ReadDir(c.chunkDir); len(entries) != 0 {
			t.Fatalf("%d packs left on a full disk, none in use", len(entries))
		}
	})

	// A disk short all along, eight creates of eight images at once: each
	// is served, each image fetched once (not evicted between its fetch
	// and its callers, nor its packs under a fetch running).
	t.Run("at once on a full disk", func(t *testing.T) {
		c := open(t, disk-minFree/2, true)
		var wg sync.WaitGroup
		for i := range images {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, err := c.cache.Acquire(ctx, fmt.Sprintf("images/%d", i), digests[i])
				if err != nil {
					t.Errorf("images/%d: %v", i, err)
					return
				}
				defer h.Release()
				equalFiles(t, filepath.Join(srcs[i], "mem"), filepath.Join(h.Path(), "mem"))
			}()
		}
		wg.Wait()
		if n := c.requests.count("GET " + indexName); n != images {
			t.Errorf("%d images fetched with %d index reads, want one each", images, n)
		}
		// One pack each (2 MiB): none downloaded twice.
		if n := c.requests.count("GET /" + chunksDir + "/"); n != images {
			t.Errorf("%d images of a pack each fetched with %d pack downloads, want one each", images, n)
		}
		// Once no longer fresh, released images go at the next look.
		c.clock.advance(freshFor)
		acquire(t, c, 0).Release()
		if keys := c.cache.Keys(); len(keys) > 0 {
			t.Errorf("on a full disk, released images stay cached: %v", keys)
		}
	})
}

// testClock is a clock tests move by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
