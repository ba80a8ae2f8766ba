package image

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxSymlinkHops bounds symlink resolution, as the kernel's ELOOP does.
const maxSymlinkHops = 40

// cleanName turns a tar entry name into a clean path relative to the root
// ("" for the root itself), refusing names that climb above it.
func cleanName(name string) (string, error) {
	c := path.Clean(strings.TrimLeft(name, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// rootfs is a directory being filled from layers. Paths inside it are
// resolved the way a process in the container would see them: absolute
// symlink targets start at the rootfs, not at the host's root. A ".." that
// would leave the rootfs is refused rather than clamped, since only a
// hostile layer writes through such a link.
type rootfs struct {
	dir string
	// onCreate is told of directories resolveDir creates.
	onCreate func(rel string)
}

// resolveDir follows rel, a clean relative path, through symlinks to a
// directory inside the rootfs. It returns the host path and the resolved
// relative path. With create, missing components become 0755 directories;
// without, a missing component gives an error wrapping os.ErrNotExist.
func (r *rootfs) resolveDir(rel string, create bool) (host, resolved string, err error) {
	pending := splitPath(rel)
	cur := ""
	for hops := 0; len(pending) > 0; {
		c := pending[0]
		pending = pending[1:]
		if c == ".." {
			if cur == "" {
				return "", "", fmt.Errorf("%w: %q climbs out through a symlink", ErrUnsafePath, rel)
			}
			cur = parentOf(cur)
			continue
		}
		next := path.Join(cur, c)
		hostNext := filepath.Join(r.dir, filepath.FromSlash(next))
		fi, err := os.Lstat(hostNext)
		switch {
		case errors.Is(err, os.ErrNotExist) && create:
			if err := os.Mkdir(hostNext, 0o755); err != nil {
				return "", "", fmt.Errorf("create parent %s: %w", next, err)
			}
			if r.onCreate != nil {
				r.onCreate(next)
			}
			cur = next
		case err != nil:
			return "", "", fmt.Errorf("resolve %s: %w", next, err)
		case fi.Mode()&os.ModeSymlink != 0:
			if hops++; hops > maxSymlinkHops {
				return "", "", fmt.Errorf("resolve %s: too many levels of symbolic links", rel)
			}
			target, err := os.Readlink(hostNext)
			if err != nil {
				return "", "", fmt.Errorf("resolve %s: %w", next, err)
			}
			if strings.HasPrefix(target, "/") {
				cur = ""
			}
			pending = append(splitPath(target), pending...)
		case fi.IsDir():
			cur = next
		default:
			return "", "", fmt.Errorf("resolve %s: %s is not a directory", rel, next)
		}
	}
	return filepath.Join(r.dir, filepath.FromSlash(cur)), cur, nil
}

// splitPath splits p into its components, dropping empty ones and ".".
func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

func parentOf(rel string) string {
	p := path.Dir(rel)
	if p == "." {
		return ""
	}
	return p
}
