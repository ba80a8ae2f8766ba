package objectstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

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

// diskOf is a file system of size bytes on which other bytes are taken by
// something else and the rest by the trees under dirs.
func diskOf(t *testing.T, size, other int64, dirs ...string) FreeSpace {
	return func(string) (int64, int64, error) {
		used := other
		for _, d := range dirs {
			n, err := diskUsage(d)
			if err != nil {
				t.Errorf("disk usage of %s: %v", d, err)
			}
			used += n
		}
		return size - used, size, nil
	}
}

// TestCachesGiveWayToAFullDisk: on a disk running full, the image cache and
// the chunk cache evict beyond their budgets to leave the free space asked
// for, sparing entries in use, and still serve every image whole.
func TestCachesGiveWayToAFullDisk(t *testing.T) {
	t.Parallel()
	const (
		mib     = 1 << 20
		size    = 2 * mib // each image: as much again in packs (chunked)
		images  = 6
		disk    = 100 * mib
		other   = 84 * mib // room for about three images above the floor
		minFree = 10 * mib
	)
	srv := s3test.Start(t)
	ctx := testCtx(t)
	up := openStore(t, testConfig(srv, "cache-disk"))
	var srcs, digests []string
	for i := range images {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeRandom(t, filepath.Join(dir, "mem"), size, uint64(i+1))
		m, err := up.PutImage(ctx, fmt.Sprintf("images/%d", i), dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		srcs, digests = append(srcs, dir), append(digests, m.Digest)
	}

	for _, floor := range []bool{false, true} {
		t.Run(fmt.Sprintf("floor=%v", floor), func(t *testing.T) {
			cacheDir, chunkDir := t.TempDir(), t.TempDir()
			free := diskOf(t, disk, other, cacheDir, chunkDir)
			cfg := testConfig(srv, "cache-disk")
			cfg.ChunkDir, cfg.ChunkBytes, cfg.FreeSpace = chunkDir, 1<<30, free
			opts := CacheOptions{FreeSpace: free}
			if floor {
				cfg.ChunkMinFree, opts.MinFree = minFree, minFree
			}
			cache, err := OpenCache(cacheDir, 1<<30, openStore(t, cfg), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer cache.Close()
			held, err := cache.Acquire(ctx, "images/0", digests[0])
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			for i := 1; i < images; i++ {
				key := fmt.Sprintf("images/%d", i)
				h, err := cache.Acquire(ctx, key, digests[i])
				if err != nil {
					t.Fatal(err)
				}
				equalFiles(t, filepath.Join(srcs[i], "mem"), filepath.Join(h.Path(), "mem"))
				h.Release()
				// The image held is never evicted, and stays whole.
				equalFiles(t, filepath.Join(srcs[0], "mem"), filepath.Join(held.Path(), "mem"))
				avail, _, _ := free(cacheDir)
				packs, _ := os.ReadDir(chunkDir)
				keys := cache.Keys()
				t.Logf("after %s: %d KiB free, cached %v, %d packs", key, avail>>10, keys, len(packs))
				if !floor {
					// The budgets alone keep everything.
					if len(keys) != i+1 {
						t.Fatalf("without a floor, after %s the cache holds %v", key, keys)
					}
					continue
				}
				// Either the floor holds, or nothing evictable is left:
				// the image held and the one just used.
				if avail < minFree && (len(packs) > 0 || !slices.Equal(keys, []string{key, "images/0"})) {
					t.Fatalf("after %s: %d MiB free, floor %d MiB, yet the caches hold %v and %d packs",
						key, avail/mib, minFree/mib, keys, len(packs))
				}
				if !slices.Contains(keys, "images/0") || keys[0] != key {
					t.Fatalf("after %s the cache holds %v, want it first and images/0 kept", key, keys)
				}
			}
			if avail, _, _ := free(cacheDir); !floor && avail >= minFree {
				t.Fatalf("without a floor the disk kept %d MiB free: the test's disk is too large to show anything", avail/mib)
			}
			if floor && len(cache.Keys()) == images {
				t.Fatal("with a floor nothing was evicted")
			}
		})
	}
}
