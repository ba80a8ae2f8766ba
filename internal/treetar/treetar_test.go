package treetar

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The top directory keeps its own mode and time: unpacked into a fresh
// private directory, a root filesystem's "/" must become 0755 again.
func TestKeepsTopDirectory(t *testing.T) {
	src := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(src, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o751); err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1700000000, 0)
	if err := os.Chtimes(src, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(t.Context(), src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(t.Context(), &buf, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o751 || !info.ModTime().Equal(mtime) {
		t.Errorf("top directory: mode %v, time %v; want 0751, %v", info.Mode().Perm(), info.ModTime(), mtime)
	}
}

// A tampered archive must not write outside the directory it unpacks into.
func TestRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	tests := []struct {
		name    string
		entries []tar.Header
	}{
		{"dotdot", []tar.Header{{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"nested-dotdot", []tar.Header{{Name: "a/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644}}},
		{"through-symlink", []tar.Header{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		}},
		{"hardlink-out", []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../escaped"}}},
		{"hardlink-through-symlink", []tar.Header{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "h", Typeflag: tar.TypeLink, Linkname: "link/victim"},
		}},
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tt.entries {
				if err := tw.WriteHeader(&h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			dir := filepath.Join(t.TempDir(), "d")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if _, err := Read(t.Context(), &buf, dir, Options{Special: true}); err == nil {
				t.Fatal("hostile archive unpacked without error")
			}
			if _, err := os.Stat(filepath.Join(outside, "escaped")); err == nil {
				t.Fatal("archive wrote outside its directory")
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escaped")); err == nil {
				t.Fatal("archive wrote outside its directory")
			}
		})
	}
}

// A volume's content (no Special): FIFOs, sockets and device nodes are
// left out when written and skipped when read; hard links stay links and
// holes stay holes; owners, modes and nanosecond times come back.
func TestContentRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/file"), []byte("data"), 0o640))
	must(os.Chmod(filepath.Join(src, "a/b"), os.ModeSetgid|0o2775))
	must(os.Link(filepath.Join(src, "a/file"), filepath.Join(src, "a/b/link")))
	must(os.Symlink("../file", filepath.Join(src, "a/b/sym")))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	sparse, err := os.Create(filepath.Join(src, "sparse"))
	must(err)
	must(sparse.Truncate(8 << 20))
	_, err = sparse.WriteAt([]byte("end"), 8<<20-3)
	must(err)
	must(sparse.Close())
	when := time.Date(2021, 3, 4, 5, 6, 7, 123456789, time.UTC)
	must(os.Chtimes(filepath.Join(src, "a/file"), when, when))

	var buf bytes.Buffer
	wrote, err := Write(t.Context(), src, &buf, Options{})
	must(err)
	// Directories a, a/b; files a/file, sparse; the link and the symlink.
	if wrote.Files != 6 || wrote.Bytes != 4+8<<20 {
		t.Errorf("wrote %+v, want 6 entries and %d bytes", wrote, 4+8<<20)
	}
	dst := t.TempDir()
	read, err := Read(t.Context(), bytes.NewReader(buf.Bytes()), dst, Options{})
	must(err)
	if read.Files != wrote.Files {
		t.Errorf("read %+v, wrote %+v", read, wrote)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("a FIFO was carried: %v", err)
	}
	var a, b syscall.Stat_t
	must(syscall.Stat(filepath.Join(dst, "a/file"), &a))
	must(syscall.Stat(filepath.Join(dst, "a/b/link"), &b))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("the hard link became a copy: inodes %d and %d, %d links", a.Ino, b.Ino, a.Nlink)
	}
	if info, err := os.Stat(filepath.Join(dst, "a/file")); err != nil || !info.ModTime().Equal(when) || info.Mode().Perm() != 0o640 {
		t.Errorf("a/file: %v %v", info, err)
	}
	if info, err := os.Stat(filepath.Join(dst, "a/b")); err != nil || info.Mode()&os.ModeSetgid == 0 {
		t.Errorf("a/b lost its setgid bit: %v %v", info, err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "a/b/sym")); err != nil || target != "../file" {
		t.Errorf("symlink: %q %v", target, err)
	}
	var sp syscall.Stat_t
	must(syscall.Stat(filepath.Join(dst, "sparse"), &sp))
	if sp.Size != 8<<20 || sp.Blocks*512 > 1<<20 {
		t.Errorf("sparse file: size %d, %d bytes allocated; want its holes kept", sp.Size, sp.Blocks*512)
	}

	// A device node in the stream is skipped without Special.
	var dev bytes.Buffer
	tw := tar.NewWriter(&dev)
	must(tw.WriteHeader(&tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}))
	must(tw.Close())
	dir := t.TempDir()
	if _, err := Read(t.Context(), &dev, dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "null")); !os.IsNotExist(err) {
		t.Errorf("a device node was made from a content stream: %v", err)
	}
}

// A canceled context stops a write and a read.
func TestCanceled(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Write(ctx, src, io.Discard, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("write: %v, want canceled", err)
	}
	var buf bytes.Buffer
	if _, err := Write(t.Context(), src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, &buf, t.TempDir(), Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("read: %v, want canceled", err)
	}
}

// Names need not be UTF-8 (file systems take any bytes but "/" and NUL):
// a directory and a file so named come back.
func TestNamesNotUTF8(t *testing.T) {
	src := t.TempDir()
	dir := filepath.Join(src, "dir\xff")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f\xfe"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(t.Context(), src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := Read(t.Context(), &buf, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "dir\xff", "f\xfe")); err != nil || string(b) != "x" {
		t.Errorf("a file under a name that is not UTF-8: %q %v", b, err)
	}
}

// NoHardLinks writes every name of a hard-linked file as a file.
func TestNoHardLinks(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a"), filepath.Join(src, "b")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Write(t.Context(), src, &buf, Options{NoHardLinks: true}); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == "b" && (hdr.Typeflag != tar.TypeReg || hdr.Size != 4) {
			t.Errorf("the second name: type %q, %d bytes; want a file of 4", hdr.Typeflag, hdr.Size)
		}
	}
}
