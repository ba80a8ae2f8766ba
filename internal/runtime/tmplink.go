package runtime

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// maxSymlinks is how many symlinks a path walk follows before it fails
// with ELOOP, as in Linux and gVisor.
const maxSymlinks = 40

// tree is what a path walk reads of a filesystem: an *os.Root, or a
// sandbox's files over its template (layered).
type tree interface {
	Lstat(name string) (fs.FileInfo, error)
	Readlink(name string) (string, error)
}

// resolveInRoot resolves name inside root the way the sandbox's kernel
// will: absolute links start from the root, ".." stops at it, and at most
// maxSymlinks links are followed. Nothing outside the root is ever read.
// With create, directories missing on the way are made (mode 0755, the
// last one mode last). It returns the resolved path relative to the root
// ("." for the root itself). Errors wrap ELOOP, ENOTDIR (a non-directory
// on the way) or, without create, ENOENT.
func resolveInRoot(root *os.Root, name string, create bool, last fs.FileMode) (string, error) {
	if !create {
		return resolveIn(root, name, nil)
	}
	return resolveIn(root, name, func(next string, lastOne bool) error {
		mode := fs.FileMode(0o755)
		if lastOne {
			mode = last
		}
		if err := root.Mkdir(next, mode.Perm()); err != nil {
			return err
		}
		return root.Chmod(next, mode)
	})
}

// resolveIn is resolveInRoot over any tree; mkdir, if not nil, makes a
// missing directory (lastOne: the walk's last), and a directory made
// meanwhile by someone else (fs.ErrExist) is looked at again.
func resolveIn(root tree, name string, mkdir func(next string, lastOne bool) error) (string, error) {
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
		case errors.Is(err, fs.ErrNotExist) && mkdir != nil:
			err := mkdir(next, onlyDots(rest))
			if errors.Is(err, fs.ErrExist) {
				// Made meanwhile by another preparer: look again.
				rest = append([]string{c}, rest...)
				continue
			}
			if err != nil {
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

// CheckTmpOver says whether a sandbox can boot over upper, the tar of a
// sandbox's file changes (ExportRootfs; deletions as ".wh." whiteouts) on
// the template rootfs: a sandbox that replaced /tmp with a link that
// leads nowhere, or loops, cannot, since gVisor mounts a tmpfs at /tmp
// at every start. Such a sandbox must not be paused without its memory:
// no resume could boot it. The error is a conflict naming the link.
func CheckTmpOver(rootfs, upper string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("template rootfs: %w", err)
	}
	defer root.Close()
	// Most sandboxes leave /tmp a directory: one pass over the headers,
	// keeping nothing, says so. Only a /tmp the sandbox made a link needs
	// the layer's index to follow it.
	if linked, err := tmpLinkedIn(upper); err != nil || !linked {
		return err
	}
	files, err := readLayer(upper)
	if err != nil {
		return err
	}
	t := layered{upper: files, lower: root}
	info, err := t.Lstat("tmp")
	if err != nil || info.Mode()&fs.ModeSymlink == 0 {
		return nil // no /tmp (gVisor makes it) or a directory: fine
	}
	_, err = resolveIn(t, "tmp", nil)
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, fs.ErrNotExist) {
		target, _ := t.Readlink("tmp")
		why := "does not exist"
		if errors.Is(err, syscall.ELOOP) {
			why = "loops"
		}
		return fmt.Errorf("%w: /tmp is a symbolic link to %q, which %s; a sandbox cannot boot over that "+
			"(gVisor mounts a tmpfs at /tmp), so it cannot be paused without its memory: restore /tmp, or keep the memory",
			errdefs.ErrConflict, target, why)
	}
	if err != nil && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("/tmp: %w", err)
	}
	return nil
}

// layerName is a tar entry's path, cleaned and relative to the root
// ("../" and absolute names cannot leave it).
func layerName(h *tar.Header) string { return strings.TrimPrefix(path.Clean("/"+h.Name), "/") }

// eachHeader calls fn with each header of the tar file.
func eachHeader(file string, fn func(h *tar.Header)) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("read saved files: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read saved files %s: %w", file, err)
		}
		fn(h)
	}
}

// tmpLinkedIn says whether the layer makes /tmp a symbolic link.
func tmpLinkedIn(file string) (bool, error) {
	linked := false
	err := eachHeader(file, func(h *tar.Header) {
		if layerName(h) == "tmp" {
			linked = h.Typeflag == tar.TypeSymlink // the last entry of a name wins
		}
	})
	return linked, err
}

// layerEntry is what a walk needs of one entry: its type, and a link's
// target.
type layerEntry struct {
	typ  byte
	link string
}

// layerFiles is a layer's tar read into what a walk needs: its entries by
// path, and the paths it deletes from the layers below.
type layerFiles struct {
	entries map[string]layerEntry
	deleted map[string]bool // whited out
	opaque  map[string]bool // directories hiding what is below them
}

func readLayer(file string) (*layerFiles, error) {
	l := &layerFiles{entries: map[string]layerEntry{}, deleted: map[string]bool{}, opaque: map[string]bool{}}
	err := eachHeader(file, func(h *tar.Header) {
		name := layerName(h)
		dir, base := path.Split(name)
		switch {
		case base == ".wh..wh..opq":
			l.opaque[path.Clean(dir)] = true
		case strings.HasPrefix(base, ".wh."):
			l.deleted[path.Join(dir, strings.TrimPrefix(base, ".wh."))] = true
		case h.Typeflag == tar.TypeSymlink:
			l.entries[name] = layerEntry{typ: tar.TypeSymlink, link: h.Linkname}
		default:
			l.entries[name] = layerEntry{typ: h.Typeflag}
		}
	})
	if err != nil {
		return nil, err
	}
	// A directory with entries under it exists, listed or not.
	var implied []string
	for name := range l.entries {
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if _, ok := l.entries[p]; ok {
				break
			}
			implied = append(implied, p)
		}
	}
	for _, p := range implied {
		l.entries[p] = layerEntry{typ: tar.TypeDir}
	}
	return l, nil
}

// entryInfo is a layerEntry as the walk's fs.FileInfo.
type entryInfo struct {
	name string
	e    layerEntry
}

func (i entryInfo) Name() string       { return path.Base(i.name) }
func (i entryInfo) Size() int64        { return 0 }
func (i entryInfo) ModTime() time.Time { return time.Time{} }
func (i entryInfo) IsDir() bool        { return i.e.typ == tar.TypeDir }
func (i entryInfo) Sys() any           { return nil }
func (i entryInfo) Mode() fs.FileMode {
	switch i.e.typ {
	case tar.TypeDir:
		return fs.ModeDir | 0o755
	case tar.TypeSymlink:
		return fs.ModeSymlink | 0o777
	}
	return 0o644
}

// layered is a sandbox's files: a layer over the template rootfs.
type layered struct {
	upper *layerFiles
	lower *os.Root
}

// hidden says whether the layer hides name in the rootfs below: it, or a
// directory above it, is whited out, or a directory above it is opaque.
func (t layered) hidden(name string) bool {
	for p := name; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if t.upper.deleted[p] || (p != name && t.upper.opaque[p]) {
			return true
		}
	}
	return false
}

func (t layered) Lstat(name string) (fs.FileInfo, error) {
	if e, ok := t.upper.entries[name]; ok {
		return entryInfo{name: name, e: e}, nil
	}
	if t.hidden(name) {
		return nil, &fs.PathError{Op: "lstat", Path: name, Err: fs.ErrNotExist}
	}
	return t.lower.Lstat(name)
}

func (t layered) Readlink(name string) (string, error) {
	if e, ok := t.upper.entries[name]; ok {
		if e.typ != tar.TypeSymlink {
			return "", &fs.PathError{Op: "readlink", Path: name, Err: syscall.EINVAL}
		}
		return e.link, nil
	}
	if t.hidden(name) {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrNotExist}
	}
	return t.lower.Readlink(name)
}
