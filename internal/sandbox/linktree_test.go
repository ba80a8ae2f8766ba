package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestLinkTree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "image")
	must(t, os.MkdirAll(filepath.Join(src, "sub"), 0o750))
	must(t, os.WriteFile(filepath.Join(src, "pages.img"), []byte("pages"), 0o600))
	must(t, os.WriteFile(filepath.Join(src, "sub", "meta"), []byte("meta"), 0o644))
	must(t, os.Symlink("pages.img", filepath.Join(src, "current")))

	dst := filepath.Join(t.TempDir(), "copy")
	if err := linkTree(context.Background(), src, dst); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pages.img", "sub/meta"} {
		a, _ := os.Stat(filepath.Join(src, name))
		b, err := os.Stat(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(a, b) {
			t.Errorf("%s is a copy, not a hard link", name)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dst, "sub")); fi.Mode().Perm() != 0o750 {
		t.Errorf("sub has mode %v, want 0750", fi.Mode().Perm())
	}
	if link, err := os.Readlink(filepath.Join(dst, "current")); err != nil || link != "pages.img" {
		t.Errorf("symlink: %q, %v", link, err)
	}

	// An existing destination is refused with its errno, not text.
	if err := linkTree(context.Background(), src, dst); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("second link into the same place: %v, want EEXIST", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
