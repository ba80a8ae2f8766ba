package backup

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

// ErrCorrupt marks an archive that is not a whole aenv backup.
var ErrCorrupt = errors.New("not a whole aenv backup")

// stagingName is where a restore unpacks inside the data dir before the
// archive is known whole; partialSuffix marks an external root unpacked
// beside where it goes.
const (
	stagingName   = ".aenv-restore-partial"
	partialSuffix = ".aenv-restore-partial"
)

// maxMetaBytes bounds the header and trailer entries.
const maxMetaBytes = 1 << 20

// RestoreSummary says what a restore wrote.
type RestoreSummary struct {
	Entries int
	Bytes   int64
	// From is the data dir the backup was made of.
	From string
	// External are the roots outside the data dir restored; Kept those
	// already there, left as they were.
	External, Kept []string
}

// Restore unpacks the archive r into dataDir, which must be empty or not
// exist. Everything is unpacked into a staging directory and checked
// whole (trailer, counts, zstd's checksum) before it is moved into place;
// on any error nothing is left. Records naming files of the old data dir
// are rewritten to the new one. Root filesystems outside the data dir are
// put back where they are missing; one already there (a template cache
// shared with other data dirs) is kept.
func Restore(ctx context.Context, r io.Reader, dataDir string) (sum RestoreSummary, err error) {
	dataDir, err = filepath.Abs(dataDir)
	if err != nil {
		return sum, fmt.Errorf("data dir: %w", err)
	}
	u := &unpacker{stage: filepath.Join(dataDir, stagingName), dirs: map[string]bool{}, files: map[string]string{},
		euid: os.Geteuid(), egid: os.Getegid()}
	defer func() {
		if err == nil {
			return
		}
		os.RemoveAll(u.stage)
		for _, p := range u.partials {
			os.RemoveAll(p)
		}
		// Directories it made on the way, deepest first, if still empty.
		for i := len(u.made) - 1; i >= 0; i-- {
			os.Remove(u.made[i])
		}
	}()
	if err := u.claimEmpty(dataDir); err != nil {
		return sum, err
	}
	if err := os.Mkdir(u.stage, 0o700); err != nil {
		return sum, fmt.Errorf("restore: %w", err)
	}
	u.dirs[u.stage] = true

	zr, err := zstd.NewReader(r)
	if err != nil {
		return sum, fmt.Errorf("restore: %w", err)
	}
	defer zr.Close()
	hdr, err := u.unpack(ctx, tar.NewReader(zr))
	if err != nil {
		return sum, err
	}
	// What follows the tar stream up to the end of the zstd frame is read
	// too: its checksum is checked there.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return sum, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err := u.finishDirs(); err != nil {
		return sum, err
	}
	db := filepath.Join(u.stage, dbName)
	if err := sqlite.Relocate(ctx, db, hdr.DataDir, dataDir); err != nil {
		return sum, err
	}
	if err := u.sync(); err != nil {
		return sum, err
	}
	sum = RestoreSummary{Entries: u.entries, Bytes: u.bytes, From: hdr.DataDir, Kept: u.kept}
	for i, p := range u.partials {
		dst := strings.TrimSuffix(p, partialSuffix)
		if err := os.Rename(p, dst); err != nil {
			return sum, fmt.Errorf("restore %s: %w", dst, err)
		}
		u.partials[i] = "" // in place: no longer ours to remove
		sum.External = append(sum.External, dst)
	}
	if err := u.commit(dataDir); err != nil {
		return sum, err
	}
	return sum, nil
}

// claimEmpty checks that dir is an empty directory, or makes it.
func (u *unpacker) claimEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := u.mkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("restore into %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("restore into %s: the directory is not empty (%d entries, e.g. %s): a restore "+
			"never merges into or replaces a data dir; give an empty or new directory: %w",
			dir, len(entries), entries[0].Name(), errdefs.ErrConflict)
	}
	return nil
}

// mkdirAll makes dir and its missing parents (those 0755), and keeps
// what it made for a failed restore to remove.
func (u *unpacker) mkdirAll(dir string, mode fs.FileMode) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := u.mkdirAll(parent, 0o755); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		return err
	}
	u.made = append(u.made, dir)
	return nil
}

// unpacker writes an archive's entries under the staging directory and
// the partial directories of external roots.
type unpacker struct {
	stage    string
	partials []string
	kept     []string
	// made are the directories made on the way to the data dir and the
	// external roots, removed again should the restore fail.
	made []string
	// dirs are the directories this restore made: an entry goes only
	// into one of them, never through a link the archive made.
	dirs map[string]bool
	// dirMeta are their headers, applied once their contents are in.
	dirMeta []dirMeta
	// files maps an entry name to where its regular file went (targets
	// of hard links).
	files      map[string]string
	euid, egid int
	entries    int
	bytes      int64
	// rootfs are the root filesystems the archive's database names, read
	// when the first external root comes: only those are put back.
	rootfs []string
}

type dirMeta struct {
	path string
	hdr  *tar.Header
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// unpack reads the entries up to the trailer and checks it.
func (u *unpacker) unpack(ctx context.Context, tr *tar.Reader) (header, error) {
	var hdr header
	roots := map[int]string{} // external root n -> where its entries go; "" skips them
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return hdr, err
		}
		th, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdr, corrupt("it ends before its trailer (cut short?)")
		}
		if err != nil {
			return hdr, corrupt("%v", err)
		}
		switch {
		case first:
			if th.Name != headerName {
				return hdr, corrupt("it does not start with %s", headerName)
			}
			if err := readJSON(tr, th, &hdr); err != nil {
				return hdr, err
			}
			if hdr.Format != formatV1 {
				return hdr, fmt.Errorf("backup format %d is not one this aenv reads (%d; made by aenv %s): %w",
					hdr.Format, formatV1, hdr.Version, errdefs.ErrInvalidArgument)
			}
			if !filepath.IsAbs(hdr.DataDir) {
				return hdr, corrupt("its data dir %q is not absolute", hdr.DataDir)
			}
			u.entries++
			u.bytes += th.Size
			continue
		case th.Name == trailerName:
			var tl trailer
			if err := readJSON(tr, th, &tl); err != nil {
				return hdr, err
			}
			if tl.Entries != u.entries || tl.Bytes != u.bytes {
				return hdr, corrupt("its trailer counts %d entries and %d bytes, the archive %d and %d",
					tl.Entries, tl.Bytes, u.entries, u.bytes)
			}
			if _, err := tr.Next(); !errors.Is(err, io.EOF) {
				return hdr, corrupt("entries follow its trailer")
			}
			if _, ok := u.files[dataPrefix+dbName]; !ok {
				return hdr, corrupt("it holds no database")
			}
			return hdr, nil
		}
		target, err := u.target(ctx, th.Name, hdr, roots)
		if err != nil {
			return hdr, err
		}
		u.entries++
		if th.Typeflag == tar.TypeReg {
			u.bytes += th.Size
		}
		if target == "" {
			continue // an external root already on this machine
		}
		if err := u.write(tr, th, target); err != nil {
			return hdr, err
		}
	}
}

// checkRoot refuses an external root that holds no root filesystem the
// archive's own database names: a restore runs as root, and an altered
// archive must not put files anywhere it likes.
func (u *unpacker) checkRoot(ctx context.Context, root string) error {
	if u.rootfs == nil {
		db, ok := u.files[dataPrefix+dbName]
		if !ok {
			return corrupt("external root %q comes before the database", root)
		}
		paths, err := sqlite.TemplateRootfsPaths(ctx, db)
		if err != nil {
			return corrupt("its database: %v", err)
		}
		u.rootfs = append(paths, "") // read: not again
	}
	for _, p := range u.rootfs {
		if p != "" && (p == root || strings.HasPrefix(p, root+"/")) {
			return nil
		}
	}
	return corrupt("external root %q holds no template's root filesystem", root)
}

// target is where entry name goes: under the staging directory, or
// beside an external root; "" when it is skipped.
func (u *unpacker) target(ctx context.Context, name string, hdr header, roots map[int]string) (string, error) {
	if err := cleanName(name); err != nil {
		return "", corrupt("%v", err)
	}
	if rel, ok := strings.CutPrefix(name, dataPrefix); ok {
		return filepath.Join(u.stage, filepath.FromSlash(rel)), nil
	}
	rest, ok := strings.CutPrefix(name, extPrefix)
	if !ok {
		return "", corrupt("unexpected entry %q", name)
	}
	num, rel, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n >= len(hdr.External) || strconv.Itoa(n) != num {
		return "", corrupt("entry %q names no external root of its header", name)
	}
	dest, seen := roots[n]
	if !seen {
		if rel != "" {
			return "", corrupt("entry %q comes before its root", name)
		}
		root := filepath.Clean(hdr.External[n])
		if !filepath.IsAbs(root) || root == "/" {
			return "", corrupt("external root %q", hdr.External[n])
		}
		if err := u.checkRoot(ctx, root); err != nil {
			return "", err
		}
		if _, err := os.Lstat(root); err == nil {
			u.kept = append(u.kept, root)
			roots[n] = ""
			return "", nil
		}
		dest = root + partialSuffix
		os.RemoveAll(dest) // an earlier restore's, cut short
		if err := u.mkdirAll(filepath.Dir(root), 0o755); err != nil {
			return "", fmt.Errorf("restore %s: %w", root, err)
		}
		u.partials = append(u.partials, dest)
		u.dirs[filepath.Dir(dest)] = true
		roots[n] = dest
		return dest, nil
	}
	if dest == "" {
		return "", nil
	}
	if rel == "" {
		return "", corrupt("external root %d twice", n)
	}
	return filepath.Join(dest, filepath.FromSlash(rel)), nil
}

// write makes one entry at target, whose parent must be a directory this
// restore made.
func (u *unpacker) write(tr *tar.Reader, th *tar.Header, target string) error {
	if !u.dirs[filepath.Dir(target)] {
		return corrupt("entry %q is not inside a directory of the archive", th.Name)
	}
	mode := th.FileInfo().Mode()
	switch th.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		u.dirs[target] = true
		u.dirMeta = append(u.dirMeta, dirMeta{target, th})
		return nil
	case tar.TypeReg:
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		n, err := io.Copy(f, tr)
		if err == nil && n != th.Size {
			err = corrupt("entry %q is short", th.Name)
		}
		if err == nil {
			err = u.owner(f.Name(), th)
		}
		if err == nil {
			err = f.Chmod(mode.Perm() | mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return corrupt("entry %q is cut short", th.Name)
			}
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		u.files[th.Name] = target
		return u.times(target, th)
	case tar.TypeLink:
		src, ok := u.files[th.Linkname]
		if !ok {
			return corrupt("hard link %q to %q, not a file before it", th.Name, th.Linkname)
		}
		if err := os.Link(src, target); err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		return nil
	case tar.TypeSymlink:
		if err := os.Symlink(th.Linkname, target); err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		if err := u.owner(target, th); err != nil {
			return err
		}
		return u.times(target, th)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[th.Typeflag]
		dev := unix.Mkdev(uint32(th.Devmajor), uint32(th.Devminor))
		if err := unix.Mknod(target, kind|0o600, int(dev)); err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		if err := u.owner(target, th); err != nil {
			return err
		}
		if err := os.Chmod(target, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fmt.Errorf("restore %s: %w", th.Name, err)
		}
		return u.times(target, th)
	}
	return corrupt("entry %q has a type (%q) a backup never holds", th.Name, th.Typeflag)
}

// owner gives path the entry's owner; ownership other than the restoring
// user's needs root.
func (u *unpacker) owner(path string, th *tar.Header) error {
	if th.Uid == u.euid && th.Gid == u.egid {
		return nil
	}
	if err := os.Lchown(path, th.Uid, th.Gid); err != nil {
		return fmt.Errorf("restore %s (restore as root to keep its owner %d:%d): %w", th.Name, th.Uid, th.Gid, err)
	}
	return nil
}

func (u *unpacker) times(path string, th *tar.Header) error {
	ts := []unix.Timespec{unix.NsecToTimespec(th.ModTime.UnixNano()), unix.NsecToTimespec(th.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("restore %s: %w", th.Name, err)
	}
	return nil
}

// finishDirs gives directories their owner, mode and time, deepest first,
// now that nothing more is written into them.
func (u *unpacker) finishDirs() error {
	for i := len(u.dirMeta) - 1; i >= 0; i-- {
		d := u.dirMeta[i]
		if err := u.owner(d.path, d.hdr); err != nil {
			return err
		}
		mode := d.hdr.FileInfo().Mode()
		if err := os.Chmod(d.path, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fmt.Errorf("restore %s: %w", d.hdr.Name, err)
		}
		if err := u.times(d.path, d.hdr); err != nil {
			return err
		}
	}
	return nil
}

// sync writes what was unpacked to disk before it is moved into place.
func (u *unpacker) sync() error {
	for _, dir := range append([]string{u.stage}, u.partials...) {
		f, err := os.Open(dir)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		err = unix.Syncfs(int(f.Fd()))
		f.Close()
		if err != nil {
			return fmt.Errorf("restore: sync %s: %w", dir, err)
		}
	}
	return nil
}

// commit moves the staged entries into the data dir, the database last:
// a data dir without its database is no node's, should this be cut.
func (u *unpacker) commit(dataDir string) error {
	entries, err := os.ReadDir(u.stage)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Name() != dbName {
			names = append(names, e.Name())
		}
	}
	names = append(names, dbName)
	for _, name := range names {
		if err := os.Rename(filepath.Join(u.stage, name), filepath.Join(dataDir, name)); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	if err := os.Remove(u.stage); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

func readJSON(r io.Reader, th *tar.Header, v any) error {
	if th.Typeflag != tar.TypeReg || th.Size > maxMetaBytes {
		return corrupt("entry %s is not a small file", th.Name)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return corrupt("%s: %v", th.Name, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return corrupt("%s: %v", th.Name, err)
	}
	return nil
}
