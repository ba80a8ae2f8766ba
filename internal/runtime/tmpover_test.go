package runtime

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

func TestCheckTmpOver(t *testing.T) {
	rootfs := t.TempDir()
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}
	}
	dir := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
	file := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644} }
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		wantErr bool
	}{
		{"no change to /tmp", []*tar.Header{file("./etc/motd")}, false},
		{"/tmp still a directory", []*tar.Header{dir("./tmp/"), file("./tmp/x")}, false},
		{"link to nowhere", []*tar.Header{link("./tmp", "/nowhere")}, true},
		{"link to itself", []*tar.Header{link("./tmp", "/tmp")}, true},
		{"link to the template's directory", []*tar.Header{link("./tmp", "/var/tmp")}, false},
		{"relative link", []*tar.Header{link("tmp", "var/tmp")}, false},
		{"link to a directory the sandbox made", []*tar.Header{link("./tmp", "/scratch"), dir("./scratch/")}, false},
		{"link to a directory the sandbox deleted", []*tar.Header{link("./tmp", "/var/tmp"), file("./.wh.var")}, true},
		{"link under an opaque directory", []*tar.Header{link("./tmp", "/var/tmp"), dir("./var/"), file("./var/.wh..wh..opq")}, true},
		{"link to a file", []*tar.Header{link("./tmp", "/etc/motd"), file("./etc/motd")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upper := filepath.Join(t.TempDir(), "upper.tar")
			f, err := os.Create(upper)
			if err != nil {
				t.Fatal(err)
			}
			tw := tar.NewWriter(f)
			for _, h := range tc.entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			err = CheckTmpOver(rootfs, upper)
			if (err != nil) != tc.wantErr {
				t.Fatalf("CheckTmpOver = %v; want an error: %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("error %v is not a conflict", err)
			}
		})
	}
	if err := CheckTmpOver(rootfs, filepath.Join(t.TempDir(), "missing.tar")); err == nil {
		t.Error("a missing layer was accepted")
	}
}
