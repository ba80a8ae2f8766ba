package gvisor

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/aenv-dev/aenv/internal/mountinfo"
)

// mountsUnder lists the mount points at or below dir, deepest first so that
// they can be unmounted in order.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	var out []string
	prefix := filepath.Clean(dir) + "/"
	for i := len(mounts) - 1; i >= 0; i-- {
		p := mounts[i].Point
		if p == filepath.Clean(dir) || strings.HasPrefix(p, prefix) {
			out = append(out, p)
		}
	}
	return out, nil
}

// unmountAll detaches every mount at or below dir. Stacked mounts on one
// point (runsc may stack its null network namespace) are all removed.
func unmountAll(dir string) error {
	for range 100 {
		points, err := mountsUnder(dir)
		if err != nil || len(points) == 0 {
			return err
		}
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	return fmt.Errorf("unmount under %s: mounts keep coming back", dir)
}
