package gvisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// mountEntry is the part of a /proc/self/mountinfo line the driver needs.
type mountEntry struct {
	point        string
	fstype       string
	superOptions string
}

func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if m, ok := parseMountinfoLine(sc.Text()); ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// parseMountinfoLine parses one line as documented in proc(5):
// id parent major:minor root point options [optional...] - fstype source superoptions
func parseMountinfoLine(line string) (mountEntry, bool) {
	before, after, ok := strings.Cut(line, " - ")
	if !ok {
		return mountEntry{}, false
	}
	left, right := strings.Fields(before), strings.Fields(after)
	if len(left) < 5 || len(right) < 3 {
		return mountEntry{}, false
	}
	return mountEntry{point: unescapeMountPath(left[4]), fstype: right[0], superOptions: right[2]}, true
}

// unescapeMountPath undoes the octal escapes (\040 for space, ...) the
// kernel uses in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder lists the mount points at or below dir, deepest first so that
// they can be unmounted in order.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	var out []string
	prefix := filepath.Clean(dir) + "/"
	for i := len(mounts) - 1; i >= 0; i-- {
		p := mounts[i].point
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
