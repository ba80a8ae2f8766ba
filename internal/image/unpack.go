package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
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
// missing), within limits. dir should be empty: Unpack builds a root
// filesystem, it does not update one. On failure dir holds part of the
// image; the caller removes it.
func (img *Image) Unpack(ctx context.Context, dir string, limits Limits) error {
	return img.UnpackWithProgress(ctx, dir, limits, nil)
}

// UnpackWithProgress is Unpack calling progress (if not nil) before each
// layer with its index (from 0), the layer count and the layer.
func (img *Image) UnpackWithProgress(ctx context.Context, dir string, limits Limits, progress func(i, n int, l Layer)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Reference, err)
	}
	b := &budget{limits: limits}
	for i, l := range img.Layers {
		if progress != nil {
			progress(i, len(img.Layers), l)
		}
		if err := unpackStored(ctx, img.LayerDir, l.Digest, dir, b); err != nil {
			return fmt.Errorf("unpack %s: %w", img.Reference, err)
		}
	}
	return nil
}

// unpackStored applies the stored layer digest to dir, hashing the blob
// as it is read: a blob that fails to unpack, or unpacks, with another
// digest was damaged on this disk, which is not the image's fault.
func unpackStored(ctx context.Context, layerDir, digest, dir string, b *budget) error {
	p, err := layerPath(layerDir, digest)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	b.startLayer(fi.Size())
	sum := sha256.New()
	err = unpackLayer(ctx, io.TeeReader(f, sum), dir, b)
	if err != nil && !errors.Is(err, ErrInvalidLayer) {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	// The tar stream may end before the blob does (padding, a
	// compressor's trailer): the rest is hashed too.
	if _, herr := io.Copy(sum, f); herr != nil {
		return fmt.Errorf("layer %s: %w", digest, herr)
	}
	if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != digest {
		if rerr := os.Remove(p); rerr != nil {
			return fmt.Errorf("layer %s: %w (content has digest %s); removing it: %w", digest, ErrCorruptLayer, got, rerr)
		}
		return fmt.Errorf("layer %s: %w (content has digest %s); it was removed: pull the image again", digest, ErrCorruptLayer, got)
	}
	if err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	return nil
}

// tarBlock is the size of a tar header, charged for every entry.
const tarBlock = 512

// budget counts what an image's layers write against its Limits.
type budget struct {
	limits    Limits
	used      int64 // all layers so far
	layerUsed int64
	layerMax  int64 // 0: no ratio bound
}

// startLayer begins a layer whose stored (compressed) size is stored.
func (b *budget) startLayer(stored int64) {
	b.layerUsed, b.layerMax = 0, 0
	if b.limits.MaxRatio > 0 {
		b.layerMax = max(b.limits.RatioFloor, stored*b.limits.MaxRatio)
	}
}

// charge counts hdr's entry, before anything of it is written. Contents
// of entries that are skipped count too: they are decompressed all the same.
func (b *budget) charge(hdr *tar.Header) error {
	n := tarBlock + max(hdr.Size, 0)
	b.used += n
	b.layerUsed += n
	if b.limits.MaxBytes > 0 && b.used > b.limits.MaxBytes {
		return fmt.Errorf("%w: with entry %q the image unpacks to more than %d MiB, the server's limit",
			ErrTooLarge, hdr.Name, b.limits.MaxBytes>>20)
	}
	if b.layerMax > 0 && b.layerUsed > b.layerMax {
		return fmt.Errorf("%w: with entry %q the layer unpacks to more than %d MiB, over %d times its compressed size",
			ErrTooLarge, hdr.Name, b.layerMax>>20, b.limits.MaxRatio)
	}
	return nil
}

// UnpackLayer applies one layer tar (plain, gzip or zstd) to the root
// filesystem at dir, honouring whiteouts, with no bound on its size.
// Entry names that climb out of dir are refused with an error wrapping
// ErrUnsafePath; symlinks resolve inside dir as they would in the sandbox,
// so nothing outside dir is ever touched. Device nodes are skipped: gVisor
// provides the sandbox's /dev.
func UnpackLayer(ctx context.Context, r io.Reader, dir string) error {
	return unpackLayer(ctx, r, dir, &budget{})
}

func unpackLayer(ctx context.Context, r io.Reader, dir string, b *budget) error {
	tr, closeFn, err := tarReader(r)
	if err != nil {
		return err
	}
	defer closeFn()
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	u := &unpacker{created: map[entryKey]bool{}, asRoot: os.Geteuid() == 0}
	u.root = rootfs{dir: d, onCreate: u.markCreated}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: read layer: %w", ErrInvalidLayer, err)
		}
		if err := b.charge(hdr); err != nil {
			return err
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
			return nil, nil, fmt.Errorf("%w: read layer: %w", ErrInvalidLayer, err)
		}
		return tar.NewReader(gz), func() { gz.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: read layer: %w", ErrInvalidLayer, err)
		}
		return tar.NewReader(zr), zr.Close, nil
	}
	return tar.NewReader(br), func() {}, nil
}

// unpacker applies the entries of one layer.
type unpacker struct {
	root rootfs
	// created holds the entries this layer wrote, which an opaque whiteout
	// in the same layer must keep.
	created map[entryKey]bool
	// dirTimes are set last: writing into a directory changes its mtime.
	dirTimes []entryTime
	asRoot   bool
}

// entryTime is a directory's times, to set once the layer is applied. The
// directory is found again by its parent's path in the layer and its name.
type entryTime struct {
	parentRel, name string
	atime, mtime    time.Time
}

func (u *unpacker) markCreated(parent *os.File, name string) error {
	k, err := keyOf(parent, name)
	if err != nil {
		return err
	}
	u.created[k] = true
	return nil
}

func (u *unpacker) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil || rel == "" {
		return err // the root's own entry keeps the caller's directory as is
	}
	parentRel, base := parentOf(rel), path.Base(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(parentRel, base)
	}
	parent, err := u.root.openDir(parentRel, true)
	if isLayerPathError(err) {
		return fmt.Errorf("%w: entry %s: parent directory: %v", ErrInvalidLayer, hdr.Name, errnoOf(err))
	}
	if err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	defer parent.Close()
	if err := u.markCreated(parent, base); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	if err := clearEntry(parent, base, hdr.Typeflag == tar.TypeDir); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	made, err := u.create(hdr, r, parent, base)
	if err != nil || !made {
		return err
	}
	if err := u.setMetadata(hdr, parent, parentRel, base); err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	return nil
}

// clearEntry removes what a lower layer left at name in dir, except a directory
// that the entry redeclares (its contents stay).
func clearEntry(dir *os.File, name string, keepDir bool) error {
	st, ok, err := lstatAt(dir, name)
	if err != nil || !ok {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && keepDir {
		return nil
	}
	return removeAllAt(dir, name)
}

// create makes the filesystem object for hdr at name in dir. It reports
// false for entries it skips (devices, unsupported types), which get no
// metadata.
func (u *unpacker) create(hdr *tar.Header, r io.Reader, dir *os.File, name string) (bool, error) {
	var err error
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = unix.Mkdirat(int(dir.Fd()), name, 0o700)
		if errors.Is(err, unix.EEXIST) {
			err = nil
		}
	case tar.TypeReg: // the reader turns old-style TypeRegA into TypeReg
		err = writeFile(dir, name, r)
	case tar.TypeSymlink:
		err = unix.Symlinkat(hdr.Linkname, int(dir.Fd()), name)
	case tar.TypeLink:
		return false, u.hardlink(hdr, dir, name) // shares the target's metadata
	case tar.TypeFifo:
		err = unix.Mknodat(int(dir.Fd()), name, unix.S_IFIFO|uint32(hdr.Mode&0o7777), 0)
	default:
		// Device nodes would be real devices on the host (a raw disk,
		// /dev/mem) for anyone who can reach the rootfs; gVisor supplies
		// the sandbox's /dev itself. PAX global headers have nothing on disk.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	return true, nil
}

func writeFile(dir *os.File, name string, r io.Reader) error {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path.Join(dir.Name(), name))
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// hardlink makes name in dir a hard link to an entry unpacked before it
// (in this layer or a lower one), found inside the rootfs as the sandbox
// would find it. A link to nothing, or to a directory, is the layer's
// error; the link never reaches outside the rootfs.
func (u *unpacker) hardlink(hdr *tar.Header, dir *os.File, name string) error {
	linkRel, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("entry %s: %w", hdr.Name, err)
	}
	if linkRel == "" {
		return fmt.Errorf("%w: entry %s: hard link to the root", ErrInvalidLayer, hdr.Name)
	}
	src, err := u.root.openDir(parentOf(linkRel), false)
	if isLayerPathError(err) {
		return fmt.Errorf("%w: entry %s: hard link to %s, which no earlier entry made: %v", ErrInvalidLayer, hdr.Name, hdr.Linkname, errnoOf(err))
	}
	if err != nil {
		return fmt.Errorf("entry %s: link target: %w", hdr.Name, err)
	}
	defer src.Close()
	st, ok, err := lstatAt(src, path.Base(linkRel))
	switch {
	case err != nil:
		return fmt.Errorf("entry %s: link target: %w", hdr.Name, err)
	case !ok:
		return fmt.Errorf("%w: entry %s: hard link to %s, which no earlier entry made", ErrInvalidLayer, hdr.Name, hdr.Linkname)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("%w: entry %s: hard link to %s, a directory", ErrInvalidLayer, hdr.Name, hdr.Linkname)
	}
	// Without AT_SYMLINK_FOLLOW a symlink target is linked itself.
	if err := unix.Linkat(int(src.Fd()), path.Base(linkRel), int(dir.Fd()), name, 0); err != nil {
		return fmt.Errorf("entry %s: link to %s: %w", hdr.Name, hdr.Linkname, err)
	}
	return nil
}

// isLayerPathError reports whether err, from resolving a path inside the
// rootfs, comes from what the layers made: a missing component, a file
// where a directory should be, a symlink loop.
func isLayerPathError(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// errnoOf is the system error in err without the host path that a
// *os.PathError names: messages about a layer go back to the client.
func errnoOf(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// setMetadata applies ownership, mode, xattrs and times to name in dir
// (never following it). Ownership comes first because chown clears setuid
// bits.
func (u *unpacker) setMetadata(hdr *tar.Header, dir *os.File, parentRel, name string) error {
	if u.asRoot {
		if err := unix.Fchownat(int(dir.Fd()), name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	// fchmodat follows a symlink, so symlinks are skipped; anything else
	// at name was made by this entry (or is the directory it redeclares).
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(int(dir.Fd()), name, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := setXattrs(hdr, dir, name); err != nil {
		return err
	}
	t := entryTime{parentRel: parentRel, name: name, atime: hdr.AccessTime, mtime: hdr.ModTime}
	if t.atime.IsZero() {
		t.atime = t.mtime
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirTimes = append(u.dirTimes, t)
		return nil
	}
	return setTimes(dir, t)
}

func setXattrs(hdr *tar.Header, dir *os.File, name string) error {
	// There is no lsetxattrat: the path goes through the directory's
	// descriptor, so only the last name is looked up, and not followed.
	p := fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name)
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		err := unix.Lsetxattr(p, attr, []byte(v), 0)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
			continue // the filesystem or our privileges do not allow it: best effort
		}
		if err != nil {
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	return nil
}

func setTimes(dir *os.File, t entryTime) error {
	ts := []unix.Timespec{unix.NsecToTimespec(t.atime.UnixNano()), unix.NsecToTimespec(t.mtime.UnixNano())}
	if err := unix.UtimesNanoAt(int(dir.Fd()), t.name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", path.Join(t.parentRel, t.name), err)
	}
	return nil
}

func (u *unpacker) finish() error {
	for _, t := range u.dirTimes {
		dir, err := u.root.openDir(t.parentRel, false)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed later in the layer
		}
		if err != nil {
			return fmt.Errorf("set times of %s: %w", path.Join(t.parentRel, t.name), err)
		}
		err = setTimes(dir, t)
		dir.Close()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// whiteout applies ".wh.NAME" (remove NAME from lower layers) or the opaque
// marker (hide the directory's lower contents) found in dirRel.
func (u *unpacker) whiteout(dirRel, base string) error {
	dir, err := u.root.openDir(dirRel, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing below to hide
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", path.Join(dirRel, base), err)
	}
	defer dir.Close()
	if base == whiteoutOpaque {
		return u.opaque(dir, dirRel)
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: whiteout %q", ErrUnsafePath, path.Join(dirRel, base))
	}
	if err := removeAllAt(dir, name); err != nil {
		return fmt.Errorf("whiteout %s: %w", path.Join(dirRel, base), err)
	}
	return nil
}

// opaque removes everything in dir that this layer did not write.
func (u *unpacker) opaque(dir *os.File, rel string) error {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opaque whiteout %s: %w", rel, err)
	}
	list := os.NewFile(uintptr(fd), dir.Name())
	names, err := list.Readdirnames(-1)
	list.Close()
	if err != nil {
		return fmt.Errorf("opaque whiteout %s: %w", rel, err)
	}
	for _, name := range names {
		k, err := keyOf(dir, name)
		if err != nil {
			return fmt.Errorf("opaque whiteout %s: %w", rel, err)
		}
		if !u.created[k] {
			if err := removeAllAt(dir, name); err != nil {
				return fmt.Errorf("opaque whiteout %s: %w", rel, err)
			}
			continue
		}
		st, ok, err := lstatAt(dir, name)
		if err != nil {
			return fmt.Errorf("opaque whiteout %s: %w", rel, err)
		}
		if !ok || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := unix.Openat(int(dir.Fd()), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opaque whiteout %s: %w", rel, err)
		}
		child := os.NewFile(uintptr(cfd), path.Join(dir.Name(), name))
		err = u.opaque(child, path.Join(rel, name))
		child.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
