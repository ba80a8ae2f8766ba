package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// maxSymlinks is how many symlinks a path walk follows before it fails
// with ELOOP, as in Linux and gVisor.
const maxSymlinks = 40

// resolveInRoot resolves name inside root the way the sandbox's kernel
// will: absolute links start from the root, ".." stops at it, and at most
// maxSymlinks links are followed. Nothing outside the root is ever read.
// With create, directories missing on the way are made (mode 0755, the
// last one mode last). It returns the resolved path relative to the root
// ("." for the root itself). Errors wrap ELOOP, ENOTDIR (a non-directory
// on the way) or, without create, ENOENT.
func resolveInRoot(root *os.Root, name string, create bool, last fs.FileMode) (string, error) {
	rest := strings.Split(name, "/")
	var cur []string
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) > 0 {
				cur = cur[:len(cur)-1]
			}
			continue
		}
		next := path.Join(append(cur, c)...)
		info, err := root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			mode := fs.FileMode(0o755)
			if onlyDots(rest) {
				mode = last
			}
			err := root.Mkdir(next, mode.Perm())
			if errors.Is(err, fs.ErrExist) {
				// Made meanwhile by another preparer: look again.
				rest = append([]string{c}, rest...)
				continue
			}
			if err != nil {
				return "", err
			}
			if err := root.Chmod(next, mode); err != nil {
				return "", err
			}
			cur = append(cur, c)
		case err != nil:
			return "", err
		case info.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", &fs.PathError{Op: "resolve", Path: name, Err: syscall.ELOOP}
			}
			target, err := root.Readlink(next)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				cur = cur[:0]
			}
			rest = append(strings.Split(target, "/"), rest...)
		case !info.IsDir() && len(rest) > 0:
			return "", &fs.PathError{Op: "resolve", Path: name, Err: syscall.ENOTDIR}
		default:
			cur = append(cur, c)
		}
	}
	if len(cur) == 0 {
		return ".", nil
	}
	return path.Join(cur...), nil
}

// onlyDots reports whether the components left after one are only ""
// and ".": that one is the last directory made.
func onlyDots(rest []string) bool {
	for _, c := range rest {
		if c != "" && c != "." {
			return false
		}
	}
	return true
}

// tmpTarget resolves an image's /tmp symlink as gVisor will at sandbox
// start, where it mounts a tmpfs over an empty /tmp and fails when /tmp
// is a link that leads nowhere: a missing target is made (with create),
// a loop is the image's fault. It returns the resolved directory, or ""
// when the link leads to something that is not a directory (which gVisor,
// like Docker, leaves alone).
func tmpTarget(root *os.Root, tmp string, create bool) (string, error) {
	resolved, err := resolveInRoot(root, tmp, create, 0o777|fs.ModeSticky)
	if errors.Is(err, syscall.ENOTDIR) {
		return "", nil
	}
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, fs.ErrNotExist) {
		target, _ := root.Readlink(tmp)
		why := "loops"
		if !errors.Is(err, syscall.ELOOP) {
			why = "does not exist (rebuild the template: building it makes the missing directory)"
		}
		return "", fmt.Errorf("%w: /tmp is a symlink to %q, which %s; gVisor mounts a tmpfs at /tmp and needs it to resolve",
			errdefs.ErrInvalidArgument, target, why)
	}
	if err != nil {
		return "", fmt.Errorf("/tmp: %w", err)
	}
	info, err := root.Lstat(resolved)
	if err != nil {
		return "", err
	}
	if !info.IsDir() {
		return "", nil
	}
	return resolved, nil
}
