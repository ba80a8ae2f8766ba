package image

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// maxSymlinkHops bounds the dangling symlinks followed while creating
// parent directories, as the kernel's ELOOP does for lookups.
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

// OpenInRoot opens name, a path inside the root filesystem at root, as a
// process chrooted there would: symlinks are followed, but absolute ones
// start at root and ".." stops at it, so the file opened is always inside
// root whatever links the image planted. The kernel does the resolution
// (openat2 with RESOLVE_IN_ROOT). flags are open(2) flags.
func OpenInRoot(root, name string, flags int) (*os.File, error) {
	dir, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return openInRoot(dir, name, uint64(flags))
}

// openInRoot is OpenInRoot relative to an open root directory.
func openInRoot(root *os.File, name string, flags uint64) (*os.File, error) {
	if name == "" {
		name = "."
	}
	how := &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(int(root.Fd()), name, how)
		// EAGAIN: a concurrent rename anywhere on the system may make the
		// kernel refuse to vouch for the lookup; it asks for a retry.
		if (errors.Is(err, unix.EAGAIN) && tries < 32) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "openat2", Path: path.Join(root.Name(), name), Err: err}
		}
		return os.NewFile(uintptr(fd), path.Join(root.Name(), name)), nil
	}
}

// rootfs is a directory being filled from layers. Paths inside it are
// resolved by the kernel the way a process in the sandbox would see them
// (openat2 RESOLVE_IN_ROOT), and every change is then made relative to the
// resolved parent directory on a single name that is never followed. No
// symlink a layer plants can direct a write to the host.
type rootfs struct {
	dir *os.File
	// onCreate is told of the directories openDir creates.
	onCreate func(parent *os.File, name string) error
}

// openDir opens the directory rel (a clean relative path, "" for the root)
// inside the rootfs, as an O_PATH descriptor for *at calls. With create,
// missing components become 0755 directories (through dangling symlinks
// too, as `mkdir -p` does); without, a missing component gives an error
// wrapping os.ErrNotExist.
func (r *rootfs) openDir(rel string, create bool) (*os.File, error) {
	return r.openDirHops(rel, create, 0)
}

func (r *rootfs) openDirHops(rel string, create bool, hops int) (*os.File, error) {
	d, err := openInRoot(r.dir, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || !create || rel == "" || !errors.Is(err, unix.ENOENT) {
		return d, err
	}
	parentRel, name := parentOf(rel), path.Base(rel)
	parent, err := r.openDirHops(parentRel, true, hops)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	err = unix.Mkdirat(int(parent.Fd()), name, 0o755)
	if errors.Is(err, unix.EEXIST) {
		// name is a symlink to a missing directory: make its target.
		target, lerr := readlinkAt(parent, name)
		if lerr != nil {
			return nil, fmt.Errorf("create parent %s: %w", rel, lerr)
		}
		if hops++; hops > maxSymlinkHops {
			return nil, fmt.Errorf("create parent %s: %w", rel, unix.ELOOP)
		}
		if !strings.HasPrefix(target, "/") {
			target = path.Join("/", parentRel, target)
		}
		// Cleaning from "/" stops ".." at the root, as the kernel does.
		if _, err := r.openDirHops(strings.TrimPrefix(path.Clean(target), "/"), true, hops); err != nil {
			return nil, err
		}
		return openInRoot(r.dir, rel, unix.O_PATH|unix.O_DIRECTORY)
	}
	if err != nil {
		return nil, fmt.Errorf("create parent %s: %w", rel, err)
	}
	if r.onCreate != nil {
		if err := r.onCreate(parent, name); err != nil {
			return nil, err
		}
	}
	return openInRoot(r.dir, rel, unix.O_PATH|unix.O_DIRECTORY)
}

func readlinkAt(dir *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// entryKey names a directory entry by its directory's identity, which
// stays the same whichever symlinked path led to it.
type entryKey struct {
	dev, ino uint64
	name     string
}

func keyOf(dir *os.File, name string) (entryKey, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		return entryKey{}, fmt.Errorf("stat %s: %w", dir.Name(), err)
	}
	return entryKey{dev: st.Dev, ino: st.Ino, name: name}, nil
}

// lstatAt stats name in dir without following it; ok is false if it does
// not exist.
func lstatAt(dir *os.File, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	return st, err == nil, err
}

// removeAllAt removes name from dir and, if it is a directory, everything
// in it. Nothing is followed: a symlink is removed, not its target.
func removeAllAt(dir *os.File, name string) error {
	st, ok, err := lstatAt(dir, name)
	if err != nil || !ok {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(int(dir.Fd()), name, 0)
	}
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	child := os.NewFile(uintptr(fd), path.Join(dir.Name(), name))
	defer child.Close()
	names, err := child.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAllAt(child, n); err != nil {
			return err
		}
	}
	return unix.Unlinkat(int(dir.Fd()), name, unix.AT_REMOVEDIR)
}

func parentOf(rel string) string {
	p := path.Dir(rel)
	if p == "." {
		return ""
	}
	return p
}
