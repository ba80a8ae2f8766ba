// Package volume implements the host side of the volume content API: file
// operations on one volume's directory, as users reach it without a sandbox.
//
// Paths come from users, and the directory is also mounted into sandboxes
// whose processes can plant symlinks in it at any moment, so a check of a
// path followed by a use of it would race. Every filesystem access therefore
// goes through an *os.Root opened on the volume directory: the kernel
// resolves each path component relative to the root's descriptor and
// refuses any "..", absolute or relative symlink that would lead outside it,
// at the moment of use rather than at the moment of a check.
package volume

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Error kinds. Every error returned by this package that a user can cause
// wraps exactly one of them, so that callers can choose a status with errors.Is.
var (
	ErrNotFound   = errors.New("no such file or directory")
	ErrExists     = errors.New("already exists")
	ErrIsDir      = errors.New("is a directory")
	ErrNotDir     = errors.New("not a directory")
	ErrNotRegular = errors.New("not a regular file")
	ErrInvalid    = errors.New("invalid path")
	ErrNoSpace    = errors.New("no space left on the volume")
)

// Entry types, as E2B's VolumeEntryStat names them.
const (
	TypeFile      = "file"
	TypeDirectory = "directory"
	TypeSymlink   = "symlink"
	TypeUnknown   = "unknown"
)

const (
	defaultFileMode = 0o644
	defaultDirMode  = 0o755

	// tempPrefix marks upload files in flight, so that one left behind by a
	// crash can be recognised.
	tempPrefix = ".aenv-upload-"

	// maxSymlinks bounds symlink resolution in WriteFile, as the kernel's
	// ELOOP limit does for its own.
	maxSymlinks = 40
)

// MaxListEntries bounds one listing's answer, which is built whole.
const MaxListEntries = 100_000

// ErrTooMany is a listing past MaxListEntries.
var ErrTooMany = errors.New("too many entries")

// IsUploadReadError reports whether err is the upload's reader failing
// (the client's body cut short), not the volume.
func IsUploadReadError(err error) bool {
	var re *readError
	return errors.As(err, &re)
}

// Dir is one volume's content: the directory root, opened as an *os.Root so
// that no path, symlink or ".." can reach outside it. It is safe for
// concurrent use.
type Dir struct {
	root *os.Root
	// onClose, if set, is called once by Close (Service.Open's hold).
	onClose func()
}

// Entry is what E2B's VolumeEntryStat carries.
type Entry struct {
	Name string // base name; "/" for the volume root
	Path string // absolute, cleaned path inside the volume; the root is "/"
	Type string // TypeFile, TypeDirectory, TypeSymlink or TypeUnknown
	Size int64
	// Mode is the unix st_mode & 07777: permission bits plus setuid, setgid
	// and sticky.
	Mode                uint32
	UID, GID            uint32
	Atime, Mtime, Ctime time.Time
	Target              string // a symlink's target as stored; "" otherwise
}

// Options are the optional parts of a create request.
type Options struct {
	UID, GID *uint32
	// Mode is unix permission bits (up to 07777); nil means 0644 for files
	// and 0755 for directories.
	Mode *uint32
	// Force creates missing parent directories, and makes MakeDir succeed
	// when the directory already exists.
	Force bool
}

// Metadata holds the attributes UpdateMetadata changes; nil leaves one as it is.
type Metadata struct {
	UID, GID, Mode *uint32
}

// Open opens the volume whose content lives in the directory root.
func Open(root string) (*Dir, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", root, err)
	}
	fi, err := r.Stat(".")
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("open volume %s: %w", root, err)
	}
	if !fi.IsDir() {
		r.Close()
		return nil, fmt.Errorf("open volume %s: %w", root, ErrNotDir)
	}
	return &Dir{root: r}, nil
}

// Close releases the volume's directory descriptor.
func (d *Dir) Close() error {
	err := d.root.Close()
	if d.onClose != nil {
		d.onClose()
		d.onClose = nil
	}
	return err
}

// Stat describes p without following a final symlink.
func (d *Dir) Stat(p string) (Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return Entry{}, opErr("stat", p, err)
	}
	e, err := d.lstat(rel, display)
	if err != nil {
		return Entry{}, opErr("stat", p, err)
	}
	return e, nil
}

// List returns the entries under directory p, down to depth levels (1 when
// depth <= 0), sorted by Path. A symlink named by p itself is followed, as
// "ls dir" would; symlinks found inside are listed but never descended into,
// so that a loop or a link elsewhere in the volume cannot multiply the work.
func (d *Dir) List(p string, depth int) ([]Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return nil, opErr("list", p, err)
	}
	if depth <= 0 {
		depth = 1
	}
	var entries []Entry
	if err := d.list(rel, display, depth, &entries); err != nil {
		return nil, opErr("list", p, err)
	}
	if len(entries) > MaxListEntries {
		return nil, opErr("list", p, fmt.Errorf("%w: more than %d entries; list a smaller depth or a deeper path", ErrTooMany, MaxListEntries))
	}
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return entries, nil
}

func (d *Dir) list(rel, display string, depth int, out *[]Entry) error {
	dirents, err := d.readDir(rel)
	if err != nil {
		return err
	}
	for _, de := range dirents {
		childRel := path.Join(rel, de.Name())
		childDisplay := path.Join(display, de.Name())
		fi, err := de.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed while we listed
			}
			return err
		}
		e := entryFrom(fi, childDisplay)
		if e.Type == TypeSymlink {
			e.Target, err = d.root.Readlink(childRel)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		*out = append(*out, e)
		if len(*out) > MaxListEntries {
			return nil // List refuses it; no need to read the rest
		}
		if depth > 1 && e.Type == TypeDirectory {
			err := d.list(childRel, childDisplay, depth-1, out)
			// A directory removed or replaced while we listed is not an error
			// of the listing as a whole.
			if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
				return err
			}
		}
	}
	return nil
}

// readDir reads the directory rel completely and closes it before returning,
// so that recursion holds no descriptor per level. O_DIRECTORY makes the open
// fail instead of blocking should a FIFO have been swapped in. The entries'
// Info comes from fstatat on the directory's descriptor (os does so for
// files opened in a Root), so it is confined too.
func (d *Dir) readDir(rel string) ([]fs.DirEntry, error) {
	f, err := d.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

// MakeDir creates the directory p with o's mode (default 0755) and owner.
// Without o.Force the parent must exist and p must not. With it, missing
// parents are created (mode 0755, o's owner, so that the owner can use the
// whole new branch) and an existing directory is success, left unchanged.
func (d *Dir) MakeDir(p string, o Options) (Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return Entry{}, opErr("mkdir", p, err)
	}
	mode, err := fileMode(o.Mode, defaultDirMode)
	if err != nil {
		return Entry{}, opErr("mkdir", p, err)
	}
	uid, gid := owner(o.UID, o.GID)
	if rel == "." {
		if !o.Force {
			return Entry{}, opErr("mkdir", p, ErrExists)
		}
		return d.Stat(p)
	}
	if o.Force {
		if err := d.mkdirParents(path.Dir(rel), uid, gid); err != nil {
			return Entry{}, opErr("mkdir", p, err)
		}
	}
	err = d.mkdir(rel, mode, uid, gid)
	if errors.Is(err, fs.ErrExist) && o.Force {
		fi, serr := d.root.Stat(rel)
		if serr != nil {
			return Entry{}, opErr("mkdir", p, serr)
		}
		if !fi.IsDir() {
			return Entry{}, opErr("mkdir", p, ErrExists)
		}
		err = nil
	}
	if err != nil {
		return Entry{}, opErr("mkdir", p, err)
	}
	e, err := d.lstat(rel, display)
	if err != nil {
		return Entry{}, opErr("mkdir", p, err)
	}
	return e, nil
}

// mkdir creates one directory and gives it its owner and mode. It is created
// 0700 and widened only after the chown, so that no other user can get into
// it while it still belongs to us; the explicit chmod also overrides umask.
// A directory that cannot be set up is removed rather than left half made.
func (d *Dir) mkdir(rel string, mode fs.FileMode, uid, gid int) error {
	if err := d.root.Mkdir(rel, 0o700); err != nil {
		return err
	}
	err := d.chown(rel, uid, gid)
	if err == nil {
		err = d.root.Chmod(rel, mode)
	}
	if err != nil {
		d.root.Remove(rel)
		return err
	}
	return nil
}

// mkdirParents creates every missing directory of dir (a cleaned relative
// path) with the default mode and the given owner. Components are created one
// at a time, instead of with MkdirAll, to know which ones are new: only those
// get the owner.
func (d *Dir) mkdirParents(dir string, uid, gid int) error {
	if dir == "." {
		return nil
	}
	cur := ""
	for part := range strings.SplitSeq(dir, "/") {
		cur = path.Join(cur, part)
		err := d.mkdir(cur, defaultDirMode, uid, gid)
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Stat follows a symlink, which os.Root keeps inside the volume.
		fi, err := d.root.Stat(cur)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return ErrNotDir
		}
	}
	return nil
}

// ReadFile opens the regular file p for reading, following a symlink that
// stays inside the volume. The Entry describes the opened file, so that its
// Size matches what the reader yields.
func (d *Dir) ReadFile(p string) (io.ReadCloser, Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return nil, Entry{}, opErr("read", p, err)
	}
	fi, err := d.root.Lstat(rel)
	if err == nil && fi.Mode().Type() == fs.ModeSymlink {
		fi, err = d.root.Stat(rel)
	}
	if err != nil {
		return nil, Entry{}, opErr("read", p, err)
	}
	if err := requireRegular(fi); err != nil {
		return nil, Entry{}, opErr("read", p, err)
	}
	// The checks above keep us from opening a device or FIFO at all; a
	// sandbox may still swap one in before the open, so O_NONBLOCK keeps
	// a FIFO from blocking and the fstat below refuses it.
	f, err := d.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Entry{}, opErr("read", p, err)
	}
	fi, err = f.Stat()
	if err == nil {
		err = requireRegular(fi)
	}
	if err != nil {
		f.Close()
		return nil, Entry{}, opErr("read", p, err)
	}
	return f, entryFrom(fi, display), nil
}

func requireRegular(fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return ErrIsDir
	case !fi.Mode().IsRegular():
		return ErrNotRegular
	}
	return nil
}

// WriteFile replaces the file p with r's content. The content goes to a
// temporary file in the target's directory that is renamed over p only once
// complete, so that a failed or aborted upload leaves the old file as it
// was. A symlink at p is followed (inside the volume only) and its target
// replaced, as writing through it would. When p exists and o leaves mode or
// owner unset, the old file's are kept, as truncating it would; a new file
// gets 0644 and our owner.
func (d *Dir) WriteFile(p string, r io.Reader, o Options) (Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return Entry{}, opErr("write", p, err)
	}
	if rel == "." {
		return Entry{}, opErr("write", p, ErrIsDir)
	}
	if o.Mode != nil {
		if _, err := fileMode(o.Mode, defaultFileMode); err != nil {
			return Entry{}, opErr("write", p, err)
		}
	}
	target, err := d.resolve(rel)
	if err != nil {
		return Entry{}, opErr("write", p, err)
	}
	dir := path.Dir(target)
	if o.Force {
		uid, gid := owner(o.UID, o.GID)
		if err := d.mkdirParents(dir, uid, gid); err != nil {
			return Entry{}, opErr("write", p, err)
		}
	} else {
		fi, err := d.root.Stat(dir)
		if err != nil {
			return Entry{}, opErr("write", p, err)
		}
		if !fi.IsDir() {
			return Entry{}, opErr("write", p, ErrNotDir)
		}
	}

	modeBits := o.Mode
	uidp, gidp := o.UID, o.GID
	old, err := d.root.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return Entry{}, opErr("write", p, err)
	case old.IsDir():
		return Entry{}, opErr("write", p, ErrIsDir)
	case !old.Mode().IsRegular():
		return Entry{}, opErr("write", p, ErrNotRegular)
	default:
		if st, ok := old.Sys().(*syscall.Stat_t); ok {
			if modeBits == nil {
				m := st.Mode & 0o7777
				modeBits = &m
			}
			if uidp == nil {
				uidp = &st.Uid
			}
			if gidp == nil {
				gidp = &st.Gid
			}
		}
	}
	mode, err := fileMode(modeBits, defaultFileMode)
	if err != nil {
		return Entry{}, opErr("write", p, err)
	}
	uid, gid := owner(uidp, gidp)

	fi, err := d.writeTemp(target, r, mode, uid, gid)
	if err != nil {
		return Entry{}, opErr("write", p, err)
	}
	return entryFrom(fi, display), nil
}

// readError marks an error from the upload's reader, so that it is reported
// as the client's failure, not mapped as if the volume had failed.
type readError struct{ err error }

func (e *readError) Error() string { return "reading upload: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

type trackingReader struct {
	r   io.Reader
	err error
}

func (t *trackingReader) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// writeTemp writes r to a new temporary file beside target, gives it its
// owner and mode, and renames it over target. It returns the file's final
// attributes. The temporary file never outlives a failure.
func (d *Dir) writeTemp(target string, r io.Reader, mode fs.FileMode, uid, gid int) (_ fs.FileInfo, err error) {
	tmp := path.Join(path.Dir(target), tempPrefix+rand.Text())
	f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if err != nil {
			if !closed {
				f.Close()
			}
			d.root.Remove(tmp)
		}
	}()

	tr := &trackingReader{r: r}
	if _, err := io.Copy(f, tr); err != nil {
		if tr.err != nil {
			return nil, &readError{err: tr.err}
		}
		return nil, err
	}
	// Chown before chmod: chown clears setuid and setgid bits.
	if uid != -1 || gid != -1 {
		if err := f.Chown(uid, gid); err != nil {
			return nil, err
		}
	}
	if err := f.Chmod(mode); err != nil {
		return nil, err
	}
	// Without the sync, a crash soon after the rename can leave an empty
	// file where the old content was.
	if err := f.Sync(); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	closed = true
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := d.root.Rename(tmp, target); err != nil {
		return nil, err
	}
	return fi, nil
}

// resolve returns rel with every symlink in it replaced by its target, the
// way the kernel would resolve it, failing if that leads outside the volume.
// WriteFile needs the real location of the file because renaming over a
// symlink would replace the link instead of writing through it. The result
// is only used through os.Root, so a link changed after this check still
// cannot lead outside. Once a component is missing, the rest is returned
// unresolved: nothing can be a symlink below a missing directory.
func (d *Dir) resolve(rel string) (string, error) {
	var done []string
	todo := splitRel(rel)
	links := 0
	for len(todo) > 0 {
		part := todo[0]
		todo = todo[1:]
		switch part {
		case ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", fmt.Errorf("symlink leads outside the volume: %w", ErrInvalid)
			}
			done = done[:len(done)-1]
			continue
		}
		cur := path.Join(append(done, part)...)
		fi, err := d.root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			if slices.Contains(todo, "..") {
				return "", err
			}
			return path.Join(append([]string{cur}, todo...)...), nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode().Type() != fs.ModeSymlink {
			done = append(done, part)
			continue
		}
		links++
		if links > maxSymlinks {
			return "", syscall.ELOOP
		}
		target, err := d.root.Readlink(cur)
		if err != nil {
			return "", err
		}
		// An absolute target names a host path; os.Root refuses those too.
		if path.IsAbs(target) {
			return "", fmt.Errorf("symlink to an absolute path: %w", ErrInvalid)
		}
		todo = append(splitRel(target), todo...)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

func splitRel(p string) []string {
	var parts []string
	for part := range strings.SplitSeq(p, "/") {
		if part != "" {
			parts = append(parts, part)
		}
	}
	return parts
}

// UpdateMetadata changes the owner and mode that m gives. The owner of a
// symlink itself is changed (lchown); a symlink has no mode of its own, so
// asking for one is ErrInvalid.
func (d *Dir) UpdateMetadata(p string, m Metadata) (Entry, error) {
	rel, display, err := clean(p)
	if err != nil {
		return Entry{}, opErr("chmod", p, err)
	}
	fi, err := d.root.Lstat(rel)
	if err != nil {
		return Entry{}, opErr("chmod", p, err)
	}
	if m.Mode != nil && fi.Mode().Type() == fs.ModeSymlink {
		return Entry{}, opErr("chmod", p, fmt.Errorf("mode of a symlink: %w", ErrInvalid))
	}
	var mode fs.FileMode
	if m.Mode != nil {
		mode, err = fileMode(m.Mode, 0)
		if err != nil {
			return Entry{}, opErr("chmod", p, err)
		}
	}
	// Chown before chmod: chown clears setuid and setgid bits.
	uid, gid := owner(m.UID, m.GID)
	if err := d.chown(rel, uid, gid); err != nil {
		return Entry{}, opErr("chown", p, err)
	}
	if m.Mode != nil {
		if err := d.root.Chmod(rel, mode); err != nil {
			return Entry{}, opErr("chmod", p, err)
		}
	}
	e, err := d.lstat(rel, display)
	if err != nil {
		return Entry{}, opErr("stat", p, err)
	}
	return e, nil
}

func (d *Dir) chown(rel string, uid, gid int) error {
	if uid == -1 && gid == -1 {
		return nil
	}
	return d.root.Lchown(rel, uid, gid)
}

// Remove deletes the file, symlink (not its target) or directory tree p.
// Removing the volume root is refused: the volume itself is deleted elsewhere.
func (d *Dir) Remove(p string) error {
	rel, _, err := clean(p)
	if err != nil {
		return opErr("remove", p, err)
	}
	if rel == "." {
		return opErr("remove", p, fmt.Errorf("the volume root: %w", ErrInvalid))
	}
	// RemoveAll succeeds on a missing path; the API reports it instead.
	fi, err := d.root.Lstat(rel)
	if err != nil {
		return opErr("remove", p, err)
	}
	if fi.IsDir() {
		err = d.root.RemoveAll(rel)
	} else {
		err = d.root.Remove(rel)
	}
	if err != nil {
		return opErr("remove", p, err)
	}
	return nil
}

// Usage returns the bytes allocated to regular files in the volume and the
// number of entries of every type in it, the root excluded. Allocated bytes
// (st_blocks) rather than sizes are summed, because that is what the disk
// pays for: sparse files count for little, small files for a whole block.
// Entries removed during the walk are skipped.
func (d *Dir) Usage() (bytes int64, files int64, err error) {
	todo := []string{"."}
	for len(todo) > 0 {
		dir := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		dirents, err := d.readDir(dir)
		if err != nil {
			if dir != "." && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				continue
			}
			return 0, 0, opErr("usage", displayOf(dir), err)
		}
		for _, de := range dirents {
			fi, err := de.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return 0, 0, opErr("usage", displayOf(path.Join(dir, de.Name())), err)
			}
			files++
			switch {
			case fi.Mode().IsRegular():
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					bytes += st.Blocks * 512
				} else {
					bytes += fi.Size()
				}
			case fi.IsDir():
				todo = append(todo, path.Join(dir, de.Name()))
			}
		}
	}
	return bytes, files, nil
}

func (d *Dir) lstat(rel, display string) (Entry, error) {
	fi, err := d.root.Lstat(rel)
	if err != nil {
		return Entry{}, err
	}
	e := entryFrom(fi, display)
	if e.Type == TypeSymlink {
		if e.Target, err = d.root.Readlink(rel); err != nil {
			return Entry{}, err
		}
	}
	return e, nil
}

func entryFrom(fi fs.FileInfo, display string) Entry {
	e := Entry{
		Name:  path.Base(display),
		Path:  display,
		Type:  entryType(fi.Mode()),
		Size:  fi.Size(),
		Mode:  uint32(fi.Mode().Perm()),
		Mtime: fi.ModTime(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777
		e.UID = st.Uid
		e.GID = st.Gid
		e.Atime = time.Unix(st.Atim.Unix())
		e.Mtime = time.Unix(st.Mtim.Unix())
		e.Ctime = time.Unix(st.Ctim.Unix())
	}
	return e
}

func entryType(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return TypeFile
	case fs.ModeDir:
		return TypeDirectory
	case fs.ModeSymlink:
		return TypeSymlink
	}
	return TypeUnknown
}

// clean turns a user's path into one relative to the volume root ("." for
// the root) and the absolute form shown back to users. Every path is taken
// as relative to the volume, with or without a leading "/"; one that climbs
// above it is refused rather than clamped, since it is most likely a mistake
// or an attack.
func clean(p string) (rel, display string, err error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", "", fmt.Errorf("NUL byte in path: %w", ErrInvalid)
	}
	rel = path.Clean(strings.TrimLeft(p, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", "", fmt.Errorf("path leaves the volume: %w", ErrInvalid)
	}
	return rel, displayOf(rel), nil
}

// displayOf is the absolute form of a cleaned relative path.
func displayOf(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}

// fileMode converts unix mode bits, or def when m is nil, to an fs.FileMode,
// whose setuid, setgid and sticky bits are not the unix ones.
func fileMode(m *uint32, def uint32) (fs.FileMode, error) {
	bits := def
	if m != nil {
		bits = *m
	}
	if bits&^0o7777 != 0 {
		return 0, fmt.Errorf("mode %#o has bits outside 07777: %w", bits, ErrInvalid)
	}
	mode := fs.FileMode(bits & 0o777)
	if bits&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if bits&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if bits&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode, nil
}

// owner converts optional ids to chown's arguments, -1 meaning unchanged.
func owner(uid, gid *uint32) (int, int) {
	u, g := -1, -1
	if uid != nil {
		u = int(*uid)
	}
	if gid != nil {
		g = int(*gid)
	}
	return u, g
}

// opErr wraps err with the operation and the path as the user gave it, and
// with the error kind it belongs to. The underlying *PathError is not kept in
// the message: os puts root-relative or host paths in it, and the message
// may reach the user.
func opErr(op, p string, err error) error {
	var re *readError
	if errors.As(err, &re) {
		// The client's failure, whatever it wraps; kept whole so that the
		// caller can tell a cancelled request from a volume fault.
		return fmt.Errorf("%s %q: %w", op, p, re)
	}
	if isEscape(err) {
		return fmt.Errorf("%s %q: path leads outside the volume: %w", op, p, ErrInvalid)
	}
	if kind := kindOf(err); kind != nil {
		if errors.Is(err, kind) {
			// Already one of ours, with its context.
			return fmt.Errorf("%s %q: %w", op, p, err)
		}
		cause := bareCause(err)
		if kind == ErrNoSpace || kind == ErrInvalid {
			// Which quota or which limit is worth telling.
			return fmt.Errorf("%s %q: %w: %w", op, p, kind, cause)
		}
		return fmt.Errorf("%s %q: %w", op, p, kind)
	}
	return fmt.Errorf("%s %q: %w", op, p, bareCause(err))
}

func kindOf(err error) error {
	for _, kind := range []error{ErrNotFound, ErrExists, ErrIsDir, ErrNotDir, ErrNotRegular, ErrInvalid, ErrNoSpace} {
		if errors.Is(err, kind) {
			return kind
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ErrNotFound
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return ErrExists
	case errors.Is(err, syscall.ENOTDIR):
		return ErrNotDir
	case errors.Is(err, syscall.EISDIR):
		return ErrIsDir
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ErrNoSpace
	case errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.ENAMETOOLONG):
		return ErrInvalid
	}
	return nil
}

// isEscape reports whether err is os.Root refusing a path that leads outside
// it. os does not export that error, so its text is all there is to match.
func isEscape(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}

// bareCause strips the path that os errors carry, keeping the errno.
func bareCause(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// SweepUploads removes the temporary files of uploads last written before
// before (cut short by a process that died mid-upload) anywhere in the
// volume, and returns how many. It walks through the volume's root and never
// follows a symbolic link.
func (d *Dir) SweepUploads(ctx context.Context, before time.Time) (int, error) {
	n := 0
	err := fs.WalkDir(d.root.FS(), ".", func(p string, de fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil || !de.Type().IsRegular() || !strings.HasPrefix(de.Name(), tempPrefix) {
			return nil // an entry removed while we walked is no error
		}
		if fi, err := de.Info(); err == nil && fi.ModTime().Before(before) && d.root.Remove(p) == nil {
			n++
		}
		return nil
	})
	return n, err
}
