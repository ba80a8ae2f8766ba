// Package treetar writes a directory tree as a tar stream and reads one
// back into a directory it cannot leave. It is the one format of the trees
// aenv sends between machines: snapshot and template images in the object
// store, and volumes moved between the nodes of a cluster.
//
// A tree keeps directories, regular files (holes come back as holes),
// symbolic links and hard links, with modes (setuid, setgid and sticky
// included), owners and modification times to the nanosecond (PAX). FIFOs
// and device nodes are kept when asked (a root file system has them; a
// volume's content does not). Sockets are always left out: a socket file
// means nothing once copied. Extended attributes are not kept.
package treetar

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stats describe a tree written or read.
type Stats struct {
	Files int64 // entries of every type, the top directory not counted
	Bytes int64 // regular files' contents, holes included
}

// FileBody writes a regular file's entry: its header (hdr, whose Size is
// the file's) and what stands for its contents. It returns the content
// bytes it read from f.
type FileBody func(tw *tar.Writer, hdr *tar.Header, f *os.File) (int64, error)

// FileFill writes the contents of the regular file hdr names into f, a
// new empty file: from the archive (tr) or from elsewhere. It returns the
// bytes of data written (holes excluded).
type FileFill func(f *os.File, hdr *tar.Header, tr io.Reader, buf []byte) (int64, error)

// Options say what a tree holds and how its files are written.
type Options struct {
	// Special keeps FIFOs and device nodes. Without it they are left out
	// of a tree written and skipped in one read.
	Special bool
	// NoHardLinks writes each name of a hard-linked file as a file of its
	// own, for a reader that would drop link entries.
	NoHardLinks bool
	// Body writes each regular file's entry (nil: its header and its
	// contents). Fill writes each regular file read back (nil: its
	// contents from the archive, runs of zeros as holes).
	Body FileBody
	Fill FileFill
	// Sync makes each regular file read durable (fsync) before the next.
	Sync bool
}

// Write packs the tree under root into w. Names are relative to root and
// use slashes; the top directory is the entry "./", and entries come in
// lexical walk order, so that a directory precedes its contents. The tree
// is read through an os.Root: a file swapped for a symbolic link while it
// is walked is not followed out of root.
func Write(ctx context.Context, root string, w io.Writer, o Options) (Stats, error) {
	var st Stats
	body := o.Body
	if body == nil {
		body = func(tw *tar.Writer, hdr *tar.Header, f *os.File) (int64, error) {
			if err := tw.WriteHeader(hdr); err != nil {
				return 0, err
			}
			return io.Copy(tw, f)
		}
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return st, fmt.Errorf("pack %s: %w", root, err)
	}
	defer r.Close()
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err = walk(ctx, r, ".", func(name string, info fs.FileInfo) error {
		mode := info.Mode()
		target := ""
		switch {
		case mode&fs.ModeSocket != 0:
			return nil
		case mode&(fs.ModeNamedPipe|fs.ModeDevice|fs.ModeCharDevice) != 0 && !o.Special:
			return nil
		case mode&fs.ModeSymlink != 0:
			if target, err = r.Readlink(name); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hdr.Name = name
		if info.IsDir() {
			// The top directory is an entry too ("./"): its mode, owner
			// and time matter (a root file system's "/" must be
			// traversable).
			hdr.Name += "/"
		}
		// PAX keeps nanosecond times and large IDs; user and group names
		// are left out so that a tree read does not depend on the
		// machine's passwd.
		hdr.Format = tar.FormatPAX
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok && mode.IsRegular() && sys.Nlink > 1 && !o.NoHardLinks {
			id := inode{uint64(sys.Dev), sys.Ino}
			if first, seen := links[id]; seen {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[id] = name
			}
		}
		if hdr.Typeflag != tar.TypeReg {
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if name != "." {
				st.Files++
			}
			return nil
		}
		st.Files++
		f, err := r.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := body(tw, hdr, f)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if n != hdr.Size {
			return fmt.Errorf("%s: changed size while packed (%d, now %d)", name, hdr.Size, n)
		}
		st.Bytes += n
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("pack %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("pack %s: %w", root, err)
	}
	return st, nil
}

// walk calls visit for name in r and, for a directory, for everything
// under it, in lexical order (a directory before its entries; names with
// slashes, the top "."). Unlike fs.WalkDir over r.FS(), it takes names
// that are not UTF-8, which file systems hold.
func walk(ctx context.Context, r *os.Root, name string, visit func(name string, info fs.FileInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	info, err := r.Lstat(name)
	if err != nil {
		return err
	}
	if err := visit(name, info); err != nil || !info.IsDir() {
		return err
	}
	d, err := r.Open(name)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	slices.Sort(names)
	for _, n := range names {
		child := n
		if name != "." {
			child = name + "/" + n
		}
		if err := walk(ctx, r, child, visit); err != nil {
			return err
		}
	}
	return nil
}

// Read unpacks the tar r into dir, which must exist and be empty. Every
// path is resolved inside dir (an os.Root), so a hostile archive cannot
// write outside it through "..", absolute names or symbolic links it
// planted earlier. Owners are set when run as root.
func Read(ctx context.Context, r io.Reader, dir string, o Options) (Stats, error) {
	var st Stats
	fill := o.Fill
	if fill == nil {
		fill = func(f *os.File, hdr *tar.Header, tr io.Reader, buf []byte) (int64, error) {
			return writeSparse(f, tr, hdr.Size, buf)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	asRoot := os.Geteuid() == 0
	type dirTime struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirTime
	tr := tar.NewReader(r)
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("read archive: %w", err)
		}
		mode := fs.FileMode(hdr.Mode).Perm() | modeBits(hdr.Mode)
		if hdr.Typeflag == tar.TypeDir && path.Clean(hdr.Name) == "." {
			// The top directory itself (dir): its mode and time are set
			// with the other directories', at the end.
			if asRoot {
				if err := root.Lchown(".", hdr.Uid, hdr.Gid); err != nil {
					return st, err
				}
			}
			dirs = append(dirs, dirTime{".", mode, hdr.ModTime})
			continue
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return st, err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return st, err
			}
			dirs = append(dirs, dirTime{name, mode, hdr.ModTime})
		case tar.TypeReg:
			n, err := fillFile(root, name, hdr, tr, buf, fill, o.Sync)
			if err != nil {
				return st, fmt.Errorf("unpack %s: %w", name, err)
			}
			st.Bytes += n
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return st, err
			}
		case tar.TypeLink:
			target, err := cleanName(hdr.Linkname)
			if err != nil {
				return st, err
			}
			if err := root.Link(target, name); err != nil {
				return st, err
			}
			st.Files++
			continue // the first name carries owner, mode and times
		case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
			if !o.Special {
				continue
			}
			if err := mknodIn(root, name, hdr); err != nil {
				return st, fmt.Errorf("unpack %s: %w", name, err)
			}
		default:
			return st, fmt.Errorf("unpack %s: unsupported entry type %q", name, hdr.Typeflag)
		}
		st.Files++
		if asRoot {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return st, err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeSymlink:
			if err := lutimesIn(root, name, hdr.ModTime); err != nil {
				return st, err
			}
			continue
		}
		// Chmod after chown: chown clears setuid and setgid bits.
		if err := root.Chmod(name, mode); err != nil {
			return st, err
		}
		if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
			return st, err
		}
	}
	// Directory modes and times last, deepest first: a read-only directory
	// must still take its entries, and creating an entry changes the time.
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return st, err
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return st, err
		}
	}
	return st, nil
}

// cleanName turns an archive name into a local relative path and refuses
// names that leave the tree.
func cleanName(name string) (string, error) {
	c := path.Clean(strings.TrimSuffix(name, "/"))
	if c == "." || c == "" || path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("archive entry %q leaves the tree", name)
	}
	return filepath.FromSlash(c), nil
}

// modeBits maps the setuid, setgid and sticky bits of a tar mode.
func modeBits(m int64) fs.FileMode {
	var b fs.FileMode
	if m&0o4000 != 0 {
		b |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		b |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		b |= fs.ModeSticky
	}
	return b
}

// fillFile creates name inside root, has fill write its contents, and
// syncs it when asked.
func fillFile(root *os.Root, name string, hdr *tar.Header, tr io.Reader, buf []byte, fill FileFill, sync bool) (int64, error) {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := fill(f, hdr, tr, buf)
	if err != nil {
		return n, err
	}
	if sync {
		if err := f.Sync(); err != nil {
			return n, err
		}
	}
	return n, f.Close()
}

// writeSparse copies size bytes from r into f, seeking over blocks of
// zeros instead of writing them.
func writeSparse(f *os.File, r io.Reader, size int64, buf []byte) (int64, error) {
	const block = 4096
	var off int64
	for off < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if err != nil {
			return off, err
		}
		chunk := buf[:n]
		for len(chunk) > 0 {
			// Write non-zero blocks in runs, skip zero blocks.
			k := min(block, len(chunk))
			if isZero(chunk[:k]) {
				off += int64(k)
				chunk = chunk[k:]
				continue
			}
			end := k
			for end < len(chunk) && !isZero(chunk[end:min(end+block, len(chunk))]) {
				end = min(end+block, len(chunk))
			}
			if _, err := f.WriteAt(chunk[:end], off); err != nil {
				return off, err
			}
			off += int64(end)
			chunk = chunk[end:]
		}
	}
	// A trailing hole needs the size set explicitly.
	if err := f.Truncate(size); err != nil {
		return off, err
	}
	return off, nil
}

var zeroBlock [4096]byte

func isZero(b []byte) bool {
	return bytes.Equal(b, zeroBlock[:len(b)])
}

// mknodIn creates a FIFO or device node inside root: os.Root has no
// mknod, so the parent is opened through the root and the node made
// relative to it.
func mknodIn(root *os.Root, name string, hdr *tar.Header) error {
	parent, err := root.Open(filepath.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeFifo:
		mode |= unix.S_IFIFO
	case tar.TypeChar:
		mode |= unix.S_IFCHR
	case tar.TypeBlock:
		mode |= unix.S_IFBLK
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	return unix.Mknodat(int(parent.Fd()), filepath.Base(name), mode, int(dev))
}

// lutimesIn sets a symbolic link's own times (os.Root.Chtimes follows
// links).
func lutimesIn(root *os.Root, name string, t time.Time) error {
	parent, err := root.Open(filepath.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	return unix.UtimesNanoAt(int(parent.Fd()), filepath.Base(name), ts, unix.AT_SYMLINK_NOFOLLOW)
}
