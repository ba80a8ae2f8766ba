package backup

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

// What of the data dir a backup leaves out, by top-level name: the live
// database (its copy goes in instead), the server's lock, the runtime's
// state of running sandboxes (sockets, mounts, scratch), and caches the
// node fills again on demand (object-store downloads, image layers,
// build uploads).
var excluded = map[string]bool{
	dbName: true, dbName + "-wal": true, dbName + "-shm": true, dbName + "-journal": true,
	"lock": true, "runtime": true, "shared": true, "layers": true, "build-files": true,
}

// Directories of the data dir whose entries are kept only when a record
// refers to them: root filesystems and checkpoint images are large, and
// those no record names are debris the next start removes anyway.
var referencedOnly = map[string]bool{"templates": true, "images": true, "cache": true}

// Options of Create.
type Options struct {
	// DataDir is the node's data dir (--data-dir).
	DataDir string
	// Version is written into the header.
	Version string
	// TempDir holds the database's copy while it is archived ("": the
	// system's).
	TempDir string
	// Warn reports what the backup cannot hold (nil: dropped).
	Warn func(msg string)
}

// Summary says what an archive holds.
type Summary struct {
	Entries   int
	Bytes     int64
	Templates int
	// Paused are the sandboxes paused to disk, whose images the archive
	// holds.
	Paused   int
	External []string
}

// Create writes a backup of the data dir to w while its server may run:
// first a consistent copy of the database, then the files its records
// name and the data dir's other durable files. A file removed between the
// two (a snapshot deleted, a paused sandbox resumed) is missing from the
// archive; the restored node treats its record as it would after a crash
// (the snapshot is dropped, the sandbox is dead). Sandboxes running or
// paused in memory have no image to hold: their records come back dead.
func Create(ctx context.Context, w io.Writer, opts Options) (Summary, error) {
	warn := opts.Warn
	if warn == nil {
		warn = func(string) {}
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return Summary{}, fmt.Errorf("data dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, dbName)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Summary{}, fmt.Errorf("%s holds no %s: not the data dir of a single node (a cluster's database is "+
				"PostgreSQL: back it up with pg_dump): %w", dataDir, dbName, errdefs.ErrNotFound)
		}
		return Summary{}, fmt.Errorf("data dir: %w", err)
	}
	tmp, err := os.MkdirTemp(opts.TempDir, "aenv-backup-")
	if err != nil {
		return Summary{}, fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(tmp)
	dbCopy := filepath.Join(tmp, dbName)
	if err := sqlite.Snapshot(ctx, filepath.Join(dataDir, dbName), dbCopy); err != nil {
		return Summary{}, err
	}
	sum := Summary{}
	refs, err := referenced(ctx, dbCopy, dataDir, &sum, warn)
	if err != nil {
		return Summary{}, err
	}

	zw, err := zstd.NewWriter(w)
	if err != nil {
		return Summary{}, fmt.Errorf("backup: %w", err)
	}
	a := &archiver{tw: tar.NewWriter(zw), links: map[fileID]string{}}
	hdr := header{Format: formatV1, Version: opts.Version, DataDir: dataDir, Created: time.Now().UTC(),
		External: refs.external}
	if err := a.writeBytes(headerName, encodeJSON(hdr)); err != nil {
		return Summary{}, err
	}
	if err := a.writeFile(ctx, dbCopy, dataPrefix+dbName); err != nil {
		return Summary{}, err
	}
	keep := func(rel string) walkChoice {
		top, _, _ := strings.Cut(rel, "/")
		switch {
		case excluded[top]:
			return skip
		case !referencedOnly[top] || rel == top:
			return include
		}
		for _, k := range refs.inside {
			if rel == k || strings.HasPrefix(rel, k+"/") {
				return include
			}
			if strings.HasPrefix(k, rel+"/") {
				return include // a directory on the way to one
			}
		}
		return skip
	}
	a.imagesDir = filepath.Join(dataDir, "images")
	if err := a.writeTree(ctx, dataDir, strings.TrimSuffix(dataPrefix, "/"), keep, false); err != nil {
		return Summary{}, err
	}
	if err := a.writeMarkers(ctx); err != nil {
		return Summary{}, err
	}
	a.imagesDir = ""
	for i, root := range refs.external {
		a.links = map[fileID]string{} // links never cross roots: a restore may skip one
		if err := a.writeTree(ctx, root, extPrefix+strconv.Itoa(i), func(string) walkChoice { return include }, true); err != nil {
			return Summary{}, err
		}
	}
	sum.Entries, sum.Bytes, sum.External = a.entries, a.bytes, refs.external
	if err := a.writeBytes(trailerName, encodeJSON(trailer{Entries: a.entries, Bytes: a.bytes})); err != nil {
		return Summary{}, err
	}
	if err := a.tw.Close(); err != nil {
		return Summary{}, fmt.Errorf("backup: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Summary{}, fmt.Errorf("backup: %w", err)
	}
	return sum, nil
}

// references are the files the database's records name: paths relative
// to the data dir, and absolute roots outside it.
type references struct {
	inside   []string
	external []string
}

// referenced lists what the records of the database copy at dbPath need
// on disk: each template's root filesystem (the directory holding it) and
// checkpoint image, and the image of each sandbox paused to disk. It warns
// of sandboxes whose state is in memory only.
func referenced(ctx context.Context, dbPath, dataDir string, sum *Summary, warn func(string)) (references, error) {
	// Opening applies this binary's migrations to the copy, as the
	// restored node's start would.
	db, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		return references{}, fmt.Errorf("read the database copy: %w", err)
	}
	defer db.Close()
	templates, err := db.ListTemplates(ctx)
	if err != nil {
		return references{}, fmt.Errorf("read the database copy: %w", err)
	}
	sandboxes, err := db.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return references{}, fmt.Errorf("read the database copy: %w", err)
	}
	var refs references
	seen := map[string]bool{}
	add := func(p string) {
		p = filepath.Clean(p)
		if p == "" || !filepath.IsAbs(p) || seen[p] {
			return
		}
		seen[p] = true
		if rel, err := filepath.Rel(dataDir, p); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			refs.inside = append(refs.inside, filepath.ToSlash(rel))
			return
		}
		if _, err := os.Stat(p); err != nil {
			warn(fmt.Sprintf("%s, which a record names, is not on this machine: not in the backup", p))
			return
		}
		refs.external = append(refs.external, p)
	}
	for _, t := range templates {
		sum.Templates++
		if t.RootfsPath != "" {
			add(rootfsHome(t.RootfsPath))
		}
		if t.ImageDir != "" {
			add(t.ImageDir)
		}
	}
	for _, sb := range sandboxes {
		switch {
		case sb.State == store.StateDead:
		case sb.ImageDir != "":
			sum.Paused++
			add(sb.ImageDir)
		case sb.State == store.StatePaused:
			// Its image may be at the fixed path, its record update cut by
			// a crash (see internal/sandbox's pauseImageDir).
			pause := filepath.Join(dataDir, "images", "pause-"+sb.ID)
			if _, err := os.Stat(pause); err == nil {
				sum.Paused++
				add(pause)
				continue
			}
			warn(fmt.Sprintf("sandbox %s is paused in memory: not in the backup (pause it to disk first)", sb.ID))
		default:
			warn(fmt.Sprintf("sandbox %s is %s: not in the backup (pause it to disk first)", sb.ID, sb.State))
		}
	}
	return refs, nil
}

// rootfsHome is the directory a root filesystem lives in with what goes
// with it (templates/<id>/rootfs and its identity file; a cache's
// base-<key>/rootfs), or the root filesystem itself when its parent is a
// shared directory.
func rootfsHome(rootfs string) string {
	rootfs = filepath.Clean(rootfs)
	if filepath.Base(rootfs) == "rootfs" {
		return filepath.Dir(rootfs)
	}
	return rootfs
}

type walkChoice int

const (
	include walkChoice = iota
	skip
)

// fileID names a file across hard links.
type fileID struct{ dev, ino uint64 }

// imageCompleteMarker is the file the node writes last into a checkpoint
// image: an image without it is incomplete (internal/sandbox).
const imageCompleteMarker = "aenv-complete"

// archiver writes entries and counts them for the trailer.
type archiver struct {
	tw      *tar.Writer
	links   map[fileID]string
	entries int
	bytes   int64
	// markers are the images' completion markers, written after the
	// whole walk (see writeMarkers); vanished, the directories a file
	// disappeared from while the walk read them.
	markers  []marker
	vanished map[string]bool
	// imagesDir is where the data dir keeps checkpoint images: only
	// there is a file named imageCompleteMarker a marker.
	imagesDir string
}

type marker struct{ path, name string }

// vanish notes that path disappeared while the walk read it, for every
// directory above it.
func (a *archiver) vanish(path string) {
	if a.vanished == nil {
		a.vanished = map[string]bool{}
	}
	for d := filepath.Dir(path); d != "/" && d != "."; d = filepath.Dir(d) {
		a.vanished[d] = true
	}
}

// writeMarkers archives the completion markers of the images whose files
// were all archived: an image deleted (a sandbox resumed) while the walk
// read it goes into the archive without its marker, so that the restored
// node sees it incomplete rather than restoring a part of it.
func (a *archiver) writeMarkers(ctx context.Context) error {
	for _, m := range a.markers {
		if a.vanished[filepath.Dir(m.path)] {
			continue
		}
		info, err := os.Lstat(m.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if _, err := a.writeEntry(ctx, m.path, m.name, info); err != nil {
			return err
		}
	}
	return nil
}

func (a *archiver) writeBytes(name string, b []byte) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(b)), Mode: 0o600,
		ModTime: time.Now().UTC(), Format: tar.FormatPAX}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := a.tw.Write(b); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	a.entries++
	a.bytes += int64(len(b))
	return nil
}

// writeFile archives the regular file at path as name.
func (a *archiver) writeFile(ctx context.Context, path, name string) error {
	info, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	_, err = a.writeEntry(ctx, path, name, info)
	return err
}

// writeTree archives root as prefix (the root itself with withRoot) and
// what is under it that choose includes. Files removed while it walks
// are left out: their records were removed first.
func (a *archiver) writeTree(ctx context.Context, root, prefix string, choose func(rel string) walkChoice, withRoot bool) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != root {
				a.vanish(path)
				return nil
			}
			return fmt.Errorf("backup: %w", err)
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		name := prefix + "/" + rel
		if rel == "." {
			if !withRoot {
				return nil
			}
			name = prefix
		} else if choose(rel) == skip {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == imageCompleteMarker && !d.IsDir() && a.imagesDir != "" &&
			strings.HasPrefix(path, a.imagesDir+string(filepath.Separator)) {
			a.markers = append(a.markers, marker{path, name}) // last: see writeMarkers
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			a.vanish(path)
			return nil
		}
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		written, err := a.writeEntry(ctx, path, name, info)
		if err != nil {
			return err
		}
		if !written && d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
}

// writeEntry archives one file of any kind tar holds, and reports whether
// it did: sockets are skipped, and a file removed meanwhile is.
func (a *archiver) writeEntry(ctx context.Context, path, name string, info fs.FileInfo) (bool, error) {
	if info.Mode()&fs.ModeSocket != 0 {
		return false, nil
	}
	var link string
	if info.Mode()&fs.ModeSymlink != 0 {
		l, err := os.Readlink(path)
		if errors.Is(err, fs.ErrNotExist) {
			a.vanish(path)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("backup: %w", err)
		}
		link = l
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return false, fmt.Errorf("backup %s: %w", path, err)
	}
	hdr.Name, hdr.Uname, hdr.Gname, hdr.Format = name, "", "", tar.FormatPAX
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() && st.Nlink > 1 {
		id := fileID{uint64(st.Dev), st.Ino}
		if first, ok := a.links[id]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return true, a.header(hdr)
		}
		a.links[id] = name
	}
	if !info.Mode().IsRegular() {
		return true, a.header(hdr)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		a.vanish(path)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	if err := a.header(hdr); err != nil {
		return false, err
	}
	n, err := io.CopyN(a.tw, readerCtx{ctx, f}, hdr.Size)
	a.bytes += n
	if errors.Is(err, io.EOF) {
		return false, fmt.Errorf("backup: %s shrank while it was read: files the records name must not change", path)
	}
	if err != nil {
		return false, fmt.Errorf("backup %s: %w", path, err)
	}
	return true, nil
}

func (a *archiver) header(hdr *tar.Header) error {
	if err := a.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("backup %s: %w", hdr.Name, err)
	}
	a.entries++
	return nil
}

// readerCtx ends a long copy when its context ends.
type readerCtx struct {
	ctx context.Context
	r   io.Reader
}

func (r readerCtx) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
