// Package diskspace tells how much of a file system is free: what a node's
// parts that write to disk (images, volumes, checkpoints) look at before
// they take more of it.
package diskspace

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Free returns the bytes of dir's file system that this process may still
// write (avail: blocks free to unprivileged users) and the file system's
// size.
func Free(dir string) (avail, size uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	// Bsize's type differs between architectures.
	bsize := uint64(st.Bsize)
	return st.Bavail * bsize, st.Blocks * bsize, nil
}
