package volume

import (
	"fmt"
	"path"
	"strings"
)

// MaxMounts bounds the volumes one sandbox mounts.
const MaxMounts = 16

// refusedMountPaths are where a volume may not be mounted: over the
// root, the system's binaries and configuration, and anything below the
// kernel's file systems and envd's own directory.
var (
	refusedMountPaths = []string{"/", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/etc"}
	refusedMountTrees = []string{"/proc", "/dev", "/sys", "/.aenv"}
)

// CheckMountPath returns p, cleaned of a trailing slash, if a volume may
// be mounted there: an absolute path without "." or ".." segments, not
// over a system path.
func CheckMountPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("mount path %q is not absolute", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "", fmt.Errorf("mount path %q has a %q segment", p, seg)
		}
	}
	if strings.ContainsAny(p, "\x00\n") {
		return "", fmt.Errorf("mount path %q has a control character", p)
	}
	clean := path.Clean(p)
	for _, r := range refusedMountPaths {
		if clean == r {
			return "", fmt.Errorf("mount path %q is a system path", p)
		}
	}
	for _, r := range refusedMountTrees {
		if clean == r || strings.HasPrefix(clean, r+"/") {
			return "", fmt.Errorf("mount path %q is under %s", p, r)
		}
	}
	return clean, nil
}

// CheckMountPaths checks each path as CheckMountPath does, and that no
// two are the same or one inside another (a mount would hide the other).
// It returns the cleaned paths, in order.
func CheckMountPaths(paths []string) ([]string, error) {
	if len(paths) > MaxMounts {
		return nil, fmt.Errorf("%d volume mounts: at most %d", len(paths), MaxMounts)
	}
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		clean, err := CheckMountPath(p)
		if err != nil {
			return nil, err
		}
		for _, prev := range out {
			switch {
			case prev == clean:
				return nil, fmt.Errorf("mount path %q is given twice", clean)
			case strings.HasPrefix(clean, prev+"/"), strings.HasPrefix(prev, clean+"/"):
				return nil, fmt.Errorf("mount paths %q and %q nest: one would hide the other", prev, clean)
			}
		}
		out = append(out, clean)
	}
	return out, nil
}
