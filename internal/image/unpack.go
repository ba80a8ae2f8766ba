package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// OCI whiteout markers.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Unpack applies the image's layers, base first, to dir (created if
// missing). dir should be empty: Unpack builds a root filesystem, it does not
// update one.
func (img *Image) Unpack(ctx context.Context, dir string) error {
	return img.UnpackWithProgress(ctx, dir, nil)
}

// UnpackWithProgress is Unpack calling progress (if not nil) before each
// layer with its index (from 0), the layer count and the layer.
func (img *Image) UnpackWithProgress(ctx context.Context, dir string, progress func(i, n int, l Layer)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Reference, err)
	}
	for i, l := range img.Layers {
		if progress != nil {
			progress(i, len(img.Layers), l)
		}
		if err := unpackStored(ctx, img.LayerDir, l.Digest, dir); err != nil {
			return fmt.Errorf("unpack %s: %w", img.Reference, err)
		}
	}
	return nil
}

func unpackStored(ctx context.Context, layerDir, digest, dir string) error {
	p, err := layerPath(layerDir, digest)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	defer f.Close()
	if err := UnpackLayer(ctx, f, dir); err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	return nil
}

// UnpackLayer applies one layer tar (plain, gzip or zstd) to the root
// filesystem at dir, honouring whiteouts. Entries that would land outside
// dir are refused with an error wrapping ErrUnsafePath.
func UnpackLayer(ctx context.Context, r io.Reader, dir string) error {
	tr, closeFn, err := tarReader(r)
	if err != nil {
		return err
	}
	defer closeFn()
	u := &unpacker{created: map[string]bool{}, asRoot: os.Geteuid() == 0}
	u.root = rootfs{dir: dir, onCreate: func(rel string) { u.created[rel] = true }}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		if err := u.apply(hdr, tr); err != nil {
			return err
		}
	}
	return u.finish()
}

// tarReader detects the layer's compression from its first bytes.
func tarReader(r io.Reader) (*tar.Reader, func(), error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("read layer: %w", err)
		}
		return tar.NewReader(gz), func() { gz.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("read layer: %w", err)
		}
		return tar.NewReader(zr), zr.Close, nil
	}
	return tar.NewReader(br), func() {}, nil
}

// unpacker applies the entries of one layer.
type unpacker struct {
	root rootfs
	// created holds the resolved paths this layer wrote, which an opaque
	// whiteout in the same layer must keep.
	created map[string]bool
	// dirTimes are set last: writing into a directory changes its mtime.
	dirTimes []entryTime
	asRoot   bool
}

type entryTime struct {
	path         string
	atime, mtime time.Time
}

func (u *unpacker) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil || rel == "" {
		return err // the root's own entry keeps the caller's directory as is
	}
	base := path.Base(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(parentOf(rel), base)
	}
	parent, parentResolved, err := u.root.resolveDir(parentOf(rel), true)
	if err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	target := filepath.Join(parent, base)
	u.created[path.Join(parentResolved, base)] = true
	if err := u.clear(target, hdr.Typeflag == tar.TypeDir); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	made, err := u.create(hdr, r, target)
	if err != nil || !made {
		return err
	}
	if err := u.setMetadata(hdr, target); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	return nil
}

// clear removes what a lower layer left at target, except a directory that
// the entry redeclares (its contents stay).
func (u *unpacker) clear(target string, keepDir bool) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() && keepDir {
		return nil
	}
	return os.RemoveAll(target)
}

// create makes the filesystem object for hdr at target. It reports false
// for entries it skips (unsupported types, devices when not root), which
// get no metadata.
func (u *unpacker) create(hdr *tar.Header, r io.Reader, target string) (bool, error) {
	var err error
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = os.Mkdir(target, 0o700)
		if errors.Is(err, os.ErrExist) {
			err = nil
		}
	case tar.TypeReg: // the reader turns old-style TypeRegA into TypeReg
		err = writeFile(target, r)
	case tar.TypeSymlink:
		err = os.Symlink(hdr.Linkname, target)
	case tar.TypeLink:
		return false, u.hardlink(hdr, target) // shares the target's metadata
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return u.mknod(hdr, target)
	default:
		return false, nil // e.g. PAX global headers: nothing on disk
	}
	if err != nil {
		return false, fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	return true, nil
}

func writeFile(target string, r io.Reader) error {
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (u *unpacker) hardlink(hdr *tar.Header, target string) error {
	linkRel, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	if linkRel == "" {
		return fmt.Errorf("entry %s: hard link to the root", hdr.Name)
	}
	dir, _, err := u.root.resolveDir(parentOf(linkRel), false)
	if err != nil {
		return fmt.Errorf("entry %s: link target: %w", hdr.Name, err)
	}
	if err := os.Link(filepath.Join(dir, path.Base(linkRel)), target); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	return nil
}

func (u *unpacker) mknod(hdr *tar.Header, target string) (bool, error) {
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode |= unix.S_IFCHR
	case tar.TypeBlock:
		mode |= unix.S_IFBLK
	case tar.TypeFifo:
		mode |= unix.S_IFIFO
	}
	if hdr.Typeflag != tar.TypeFifo && !u.asRoot {
		return false, nil // only root makes device nodes; gVisor supplies /dev anyway
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := unix.Mknod(target, mode, int(dev)); err != nil {
		return false, fmt.Errorf("entry %s: mknod: %w", hdr.Name, err)
	}
	return true, nil
}

// setMetadata applies ownership, mode, xattrs and times. Ownership comes
// first because chown clears setuid bits.
func (u *unpacker) setMetadata(hdr *tar.Header, target string) error {
	if u.asRoot {
		if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(unix.AT_FDCWD, target, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := setXattrs(hdr, target); err != nil {
		return err
	}
	t := entryTime{path: target, atime: hdr.AccessTime, mtime: hdr.ModTime}
	if t.atime.IsZero() {
		t.atime = t.mtime
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirTimes = append(u.dirTimes, t)
		return nil
	}
	return setTimes(t)
}

func setXattrs(hdr *tar.Header, target string) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		err := unix.Lsetxattr(target, name, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
			continue // the filesystem or our privileges do not allow it: best effort
		}
		if err != nil {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

func setTimes(t entryTime) error {
	ts := []unix.Timespec{unix.NsecToTimespec(t.atime.UnixNano()), unix.NsecToTimespec(t.mtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, t.path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", t.path, err)
	}
	return nil
}

func (u *unpacker) finish() error {
	for _, t := range u.dirTimes {
		if err := setTimes(t); err != nil {
			return err
		}
	}
	return nil
}

// whiteout applies ".wh.NAME" (remove NAME from lower layers) or the opaque
// marker (hide the directory's lower contents) found in dirRel.
func (u *unpacker) whiteout(dirRel, base string) error {
	dir, resolved, err := u.root.resolveDir(dirRel, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing below to hide
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", path.Join(dirRel, base), err)
	}
	if base == whiteoutOpaque {
		return u.opaque(dir, resolved)
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: whiteout %q", ErrUnsafePath, path.Join(dirRel, base))
	}
	if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("whiteout %s: %w", path.Join(dirRel, base), err)
	}
	return nil
}

// opaque removes everything in dir that this layer did not write.
func (u *unpacker) opaque(dir, rel string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("opaque whiteout %s: %w", rel, err)
	}
	for _, e := range entries {
		childRel := path.Join(rel, e.Name())
		child := filepath.Join(dir, e.Name())
		if !u.created[childRel] {
			if err := os.RemoveAll(child); err != nil {
				return fmt.Errorf("opaque whiteout %s: %w", rel, err)
			}
			continue
		}
		if e.IsDir() {
			if err := u.opaque(child, childRel); err != nil {
				return err
			}
		}
	}
	return nil
}
