package objectstore

import "github.com/aenv-dev/aenv/internal/diskspace"

// FreeSpace reports the bytes of dir's file system that this process may
// still write (avail) and the file system's size.
type FreeSpace func(dir string) (avail, size int64, err error)

// statFreeSpace is FreeSpace from statfs(2).
func statFreeSpace(dir string) (avail, size int64, err error) {
	a, sz, err := diskspace.Free(dir)
	return int64(a), int64(sz), err
}

// floorFraction caps a free-space floor at this part of the file system's
// size: on a small disk, a floor meant for a large one would leave the
// caches no room at all.
const floorFraction = 10

// spaceShort says how many bytes dir's file system lacks to have minFree
// free (capped at a tenth of its size): what a cache there should give
// back beyond its own budget. 0 when there is enough, when minFree is 0,
// or when the file system cannot be asked (the budget alone then rules).
func spaceShort(free FreeSpace, dir string, minFree int64) int64 {
	if minFree <= 0 {
		return 0
	}
	avail, size, err := free(dir)
	if err != nil {
		return 0
	}
	floor := min(minFree, size/floorFraction)
	return max(0, floor-avail)
}
