package runtime

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// An image's /tmp symlink is kept, and what it leads to is resolved inside
// the rootfs as the sandbox's kernel resolves it: a missing directory is
// made there (gVisor fails every sandbox start over a /tmp link to nowhere),
// an empty one gets the keep file, a file is left, and a loop is refused as
// the image's fault. Nothing outside the rootfs is touched.
func TestPrepareRootfsTmpSymlink(t *testing.T) {
	up := strings.Repeat("../", 8)
	for _, tc := range []struct {
		name   string
		target string
		setup  []string // directories ("x/") and files ("x") made first
		// wantDir is the directory /tmp resolves to, relative to the rootfs,
		// that must hold the keep file; "" for none.
		wantDir  string
		wantMade bool // wantDir is made by PrepareRootfs, mode 1777
		wantErr  string
	}{
		{name: "absolute", target: "/var/tmp", setup: []string{"var/", "var/tmp/"}, wantDir: "var/tmp"},
		{name: "relative", target: "var/tmp", setup: []string{"var/", "var/tmp/"}, wantDir: "var/tmp"},
		{name: "relative escaping", target: up + "var/tmp", setup: []string{"var/", "var/tmp/"}, wantDir: "var/tmp"},
		{name: "through links", target: "/a/tmp", setup: []string{"var/", "var/tmp/"}, wantDir: "var/tmp"},
		{name: "dangling absolute", target: "/nowhere/tmp", wantDir: "nowhere/tmp", wantMade: true},
		{name: "dangling escaping", target: up + "outside/tmp/", wantDir: "outside/tmp", wantMade: true},
		{name: "dangling with dots", target: "/new/./x/../tmp", wantDir: "new/tmp", wantMade: true},
		{name: "not empty", target: "/var/tmp", setup: []string{"var/", "var/tmp/", "var/tmp/f"}},
		{name: "to a file", target: "/tmpfile", setup: []string{"tmpfile"}},
		{name: "through a file", target: "/tmpfile/x", setup: []string{"tmpfile"}},
		{name: "to the root", target: "/", setup: []string{"f"}},
		{name: "loop", target: "tmp", wantErr: "loops"},
		{name: "longer loop", target: "/b", wantErr: "loops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outer := t.TempDir()
			rootfs := filepath.Join(outer, "a", "b", "rootfs")
			if err := os.MkdirAll(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.setup {
				var err error
				if strings.HasSuffix(p, "/") {
					err = os.Mkdir(filepath.Join(rootfs, p), 0o755)
				} else {
					err = os.WriteFile(filepath.Join(rootfs, p), []byte("x"), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// Links used by some targets: /a -> var, /b -> /c -> /b.
			for name, target := range map[string]string{"a": "var", "b": "/c", "c": "/b"} {
				if err := os.Symlink(target, filepath.Join(rootfs, name)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(tc.target, filepath.Join(rootfs, "tmp")); err != nil {
				t.Fatal(err)
			}

			err := PrepareRootfs(rootfs)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) ||
					!strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "/tmp") {
					t.Fatalf("prepare: %v; want an invalid argument naming /tmp that %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("prepare: %v", err)
			}
			if got, err := os.Readlink(filepath.Join(rootfs, "tmp")); err != nil || got != tc.target {
				t.Errorf("/tmp is %q, %v; want the image's link to %q kept", got, err, tc.target)
			}
			var keeps []string
			filepath.WalkDir(outer, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Name() == filepath.Base(TmpKeepFile) {
					rel, _ := filepath.Rel(rootfs, p)
					keeps = append(keeps, rel)
				}
				return nil
			})
			var want []string
			if tc.wantDir != "" {
				want = []string{filepath.Join(tc.wantDir, filepath.Base(TmpKeepFile))}
			}
			if strings.Join(keeps, ",") != strings.Join(want, ",") {
				t.Errorf("keep files %v, want %v", keeps, want)
			}
			if tc.wantMade {
				info, err := os.Lstat(filepath.Join(rootfs, tc.wantDir))
				if err != nil || info.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
					t.Errorf("made %s: %v, %v; want a directory of mode 1777", tc.wantDir, info, err)
				}
			}
			if names := dirNames(t, outer); len(names) != 1 || names[0] != "a" {
				t.Errorf("outside the rootfs: %v", names)
			}
			if names := dirNames(t, filepath.Join(outer, "a")); len(names) != 1 {
				t.Errorf("outside the rootfs: %v", names)
			}
			if err := CheckRootfs(rootfs); err != nil {
				t.Errorf("check after prepare: %v", err)
			}
			if err := PrepareRootfs(rootfs); err != nil {
				t.Errorf("second prepare: %v", err)
			}
		})
	}
}

// A template prepared before PrepareRootfs made the targets of /tmp links
// fails its check, before runsc, with an invalid argument naming /tmp.
func TestCheckRootfsTmpSymlink(t *testing.T) {
	for _, tc := range []struct {
		name, target, want string
	}{
		{"dangling", "/nowhere/tmp", "does not exist"},
		{"loop", "/tmp", "loops"},
		{"fine", "/", ""},
		{"to a file", "/.aenv/envd", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := t.TempDir()
			if err := PrepareRootfs(rootfs); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(rootfs, "tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(tc.target, filepath.Join(rootfs, "tmp")); err != nil {
				t.Fatal(err)
			}
			err := CheckRootfs(rootfs)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("check: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), tc.target) {
				t.Fatalf("check: %v; want an invalid argument naming %q and saying it %s", err, tc.target, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(rootfs, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("check made something: %v", err)
			}
		})
	}
}
