package objectstore

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestArchiveRoundTripLocal(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, false)
	var buf bytes.Buffer
	st, err := writeTar(src, &buf)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	got, err := readTar(&buf, dst)
	if err != nil {
		t.Fatal(err)
	}
	if got != st {
		t.Fatalf("unpacked %+v, packed %+v", got, st)
	}
	compareTrees(t, snapshotTree(t, src), snapshotTree(t, dst))
}

// The top directory keeps its own mode and time: unpacked into a fresh
// private directory, a root filesystem's "/" must become 0755 again.
func TestArchiveKeepsTopDirectory(t *testing.T) {
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
	if _, err := writeTar(src, &buf); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := readTar(&buf, dst); err != nil {
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
func TestArchiveRefusesEscapes(t *testing.T) {
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
			if _, err := readTar(&buf, dir); err == nil {
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
