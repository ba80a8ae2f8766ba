package runtime

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"abcdefghij0123456789", true},
		{"abcdefghij012345678", false},
		{"abcdefghij0123456789x", false},
		{"abcdefghij012345678/", false},
		{"abcdefghij012345678.", false},
		{"Abcdefghij0123456789", false},
		{"", false},
	}
	for _, tt := range tests {
		if err := ValidateID(tt.id); (err == nil) != tt.ok {
			t.Errorf("ValidateID(%q) = %v; want ok=%v", tt.id, err, tt.ok)
		}
	}
}

func TestPrepareRootfs(t *testing.T) {
	root := t.TempDir()
	if err := CheckRootfs(root); err == nil {
		t.Fatal("CheckRootfs accepts an unprepared rootfs")
	}
	for range 2 { // idempotent
		if err := PrepareRootfs(root); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckRootfs(root); err != nil {
		t.Fatalf("CheckRootfs after PrepareRootfs: %v", err)
	}
	// A directory (or anything but a regular file) is no mount point for
	// the envd binary.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, EnvdMountPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckRootfs(other); err == nil {
		t.Error("CheckRootfs accepts a directory at the envd mount point")
	}
}

// A template rootfs comes from an image, and an image may plant symlinks
// or files at /.aenv aimed at the host. Preparing the rootfs must only
// ever write inside it, leaving a real directory and a real file there,
// and a rootfs whose mount point leads elsewhere must fail the check.
func TestPrepareRootfsStaysInRoot(t *testing.T) {
	tests := []struct {
		name  string
		plant func(t *testing.T, root, host string)
	}{
		{"absolute symlink", func(t *testing.T, root, host string) {
			mustSymlink(t, host, filepath.Join(root, ".aenv"))
		}},
		{"relative symlink", func(t *testing.T, root, host string) {
			rel, err := filepath.Rel(root, host)
			if err != nil {
				t.Fatal(err)
			}
			mustSymlink(t, rel, filepath.Join(root, ".aenv"))
		}},
		{"dangling symlink", func(t *testing.T, root, host string) {
			mustSymlink(t, filepath.Join(host, "new"), filepath.Join(root, ".aenv"))
		}},
		{"dangling envd symlink", func(t *testing.T, root, host string) {
			mustMkdir(t, filepath.Join(root, ".aenv"))
			mustSymlink(t, filepath.Join(host, "envd"), filepath.Join(root, ".aenv", "envd"))
		}},
		{"envd symlink to a host file", func(t *testing.T, root, host string) {
			mustMkdir(t, filepath.Join(root, ".aenv"))
			mustSymlink(t, filepath.Join(host, "victim"), filepath.Join(root, ".aenv", "envd"))
		}},
		{"file at .aenv", func(t *testing.T, root, host string) {
			mustWrite(t, filepath.Join(root, ".aenv"))
		}},
		{"directory at envd", func(t *testing.T, root, host string) {
			mustMkdir(t, filepath.Join(root, ".aenv", "envd", "sub"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := t.TempDir()
			mustWrite(t, filepath.Join(host, "victim"))
			root := filepath.Join(t.TempDir(), "rootfs")
			mustMkdir(t, root)
			tt.plant(t, root, host)
			if err := PrepareRootfs(root); err != nil {
				t.Fatal(err)
			}
			if got := dirNames(t, host); len(got) != 1 || got[0] != "victim" {
				t.Errorf("host directory holds %v, want only [victim]", got)
			}
			if fi, err := os.Lstat(filepath.Join(host, "victim")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("host file changed: %v, %v", fi, err)
			}
			if fi, err := os.Lstat(filepath.Join(root, ".aenv")); err != nil || !fi.IsDir() {
				t.Errorf("rootfs/.aenv: %v, %v; want a directory", fi, err)
			}
			if fi, err := os.Lstat(filepath.Join(root, ".aenv", "envd")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("rootfs/.aenv/envd: %v, %v; want a regular file", fi, err)
			}
			if err := CheckRootfs(root); err != nil {
				t.Errorf("CheckRootfs after PrepareRootfs: %v", err)
			}
		})
	}
}

func TestCheckRootfsRefusesSymlinks(t *testing.T) {
	host := t.TempDir()
	mustWrite(t, filepath.Join(host, "envd"))
	root := t.TempDir()
	mustSymlink(t, host, filepath.Join(root, ".aenv"))
	if err := CheckRootfs(root); err == nil {
		t.Error("CheckRootfs accepts /.aenv as a symlink to a host directory")
	}
	root = t.TempDir()
	mustMkdir(t, filepath.Join(root, ".aenv"))
	mustSymlink(t, filepath.Join(host, "envd"), filepath.Join(root, ".aenv", "envd"))
	if err := CheckRootfs(root); err == nil {
		t.Error("CheckRootfs accepts /.aenv/envd as a symlink to a host file")
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// An empty or missing /tmp gets a keep file (so gVisor keeps /tmp in the
// root overlay); a non-empty one is left. (A /tmp that is a symlink:
// TestPrepareRootfsTmpSymlink.)
func TestPrepareRootfsKeepsTmpInOverlay(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setup    func(root string) error
		wantKeep bool
	}{
		{"missing", func(string) error { return nil }, true},
		{"empty", func(root string) error { return os.Mkdir(filepath.Join(root, "tmp"), 0o1777) }, true},
		{"not empty", func(root string) error {
			if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(root, "tmp", "x"), nil, 0o644)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := tc.setup(root); err != nil {
				t.Fatal(err)
			}
			if err := PrepareRootfs(root); err != nil {
				t.Fatal(err)
			}
			_, err := os.Lstat(filepath.Join(root, TmpKeepFile))
			if got := err == nil; got != tc.wantKeep {
				t.Fatalf("keep file present %v, want %v (%v)", got, tc.wantKeep, err)
			}
			if err := PrepareRootfs(root); err != nil {
				t.Fatalf("second prepare: %v", err)
			}
		})
	}
}

func TestFileSHA256(t *testing.T) {
	dir := t.TempDir()
	abc := filepath.Join(dir, "abc")
	if err := os.WriteFile(abc, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	// FIPS 180-2's example digest of "abc".
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got, err := FileSHA256(abc); err != nil || got != want || !IsHexSHA256(got) || !IsImageDigest("sha256:"+got) {
		t.Errorf("FileSHA256(abc) = %q, %v; want %s", got, err, want)
	}
	if _, err := FileSHA256(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("FileSHA256 of a missing file: %v; want ErrNotExist", err)
	}
}
