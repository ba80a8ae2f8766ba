package template

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"base", true}, {"python3.12", true}, {"my_tpl-1:latest", true},
		{"", false}, {"has space", false}, {"slash/no", false}, {"ü", false},
	} {
		if err := CheckName(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckName(%q) = %v", tc.name, err)
		}
	}
}

func TestResolveUser(t *testing.T) {
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte(
		"root:x:0:0:root:/root:/bin/bash\napp:x:1000:1000::/srv/app:/bin/sh\n"), 0o644)
	for _, tc := range []struct{ in, want, home string }{
		{"", "root", "/root"},
		{"app", "app", "/srv/app"},
		{"1000", "app", "/srv/app"},
		{"1000:1000", "app", "/srv/app"},
		{"4242", "root", "/root"},
	} {
		got := resolveUser(rootfs, tc.in)
		if got != tc.want {
			t.Errorf("resolveUser(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if home := homeOf(rootfs, got); home != tc.home {
			t.Errorf("homeOf(%q) = %q, want %q", got, home, tc.home)
		}
	}
}

// An image's /etc/passwd is read on the host to turn its numeric User into
// a name and find the home directory. A hostile image makes it a symlink
// to a host file (or a FIFO that would block the read): the user must then
// come from the image alone, which here means root with home "/".
func TestResolveUserStaysInRoot(t *testing.T) {
	tests := []struct {
		name  string
		plant func(t *testing.T, rootfs, host string)
	}{
		{"absolute symlink", func(t *testing.T, rootfs, host string) {
			mustSymlink(t, filepath.Join(host, "passwd"), filepath.Join(rootfs, "etc", "passwd"))
		}},
		{"relative symlink", func(t *testing.T, rootfs, host string) {
			rel, err := filepath.Rel(filepath.Join(rootfs, "etc"), filepath.Join(host, "passwd"))
			if err != nil {
				t.Fatal(err)
			}
			mustSymlink(t, rel, filepath.Join(rootfs, "etc", "passwd"))
		}},
		{"symlinked etc", func(t *testing.T, rootfs, host string) {
			if err := os.Remove(filepath.Join(rootfs, "etc")); err != nil {
				t.Fatal(err)
			}
			mustSymlink(t, host, filepath.Join(rootfs, "etc"))
		}},
		{"fifo", func(t *testing.T, rootfs, host string) {
			if err := unix.Mkfifo(filepath.Join(rootfs, "etc", "passwd"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := t.TempDir()
			if err := os.WriteFile(filepath.Join(host, "passwd"), []byte(
				"root:x:0:0:root:/host-root:/bin/bash\nhostuser:x:1000:1000::/home/hostuser:/bin/sh\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			rootfs := t.TempDir()
			if err := os.Mkdir(filepath.Join(rootfs, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			tt.plant(t, rootfs, host)
			type result struct{ user, home string }
			done := make(chan result, 1)
			go func() {
				u := resolveUser(rootfs, "1000")
				done <- result{u, homeOf(rootfs, u)}
			}()
			select {
			case got := <-done:
				if got.user != "root" || got.home != "/" {
					t.Errorf("user %q home %q, want root and / (not the host's)", got.user, got.home)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("resolving the user blocked on the image's /etc/passwd")
			}
		})
	}
}

// Inside the rootfs, an absolute symlink resolves as it would in the
// sandbox: from the rootfs.
func TestResolveUserFollowsLinksInRoot(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "usr", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "usr", "lib", "passwd"), []byte(
		"app:x:1000:1000::/srv/app:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustSymlink(t, "/usr/lib/passwd", filepath.Join(rootfs, "etc", "passwd"))
	if u := resolveUser(rootfs, "1000"); u != "app" {
		t.Errorf("resolveUser = %q, want app", u)
	}
	if h := homeOf(rootfs, "app"); h != "/srv/app" {
		t.Errorf("homeOf = %q, want /srv/app", h)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestBaseConfigKey(t *testing.T) {
	a := DefaultBaseConfig("/c")
	b := DefaultBaseConfig("/elsewhere")
	if a.key() != b.key() {
		t.Error("the cache dir must not change the build key")
	}
	b.Packages = append(b.Packages, "vim")
	if a.key() == b.key() {
		t.Error("packages must change the build key")
	}
}

// A rootfs gets one name, kept across calls and shared by racing callers;
// a fetched one keeps the name it was given.
func TestRootfsID(t *testing.T) {
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	ids := make(chan string, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := RootfsID(rootfs)
			if err != nil {
				t.Error(err)
			}
			ids <- id
		}()
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first || !strings.HasPrefix(id, "rootfs-") {
			t.Fatalf("racing callers got %q and %q", first, id)
		}
	}
	if again, err := RootfsID(rootfs); err != nil || again != first {
		t.Fatalf("second call: %q %v, want %q", again, err, first)
	}
	if err := SetRootfsID(rootfs, "other"); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("renaming a named rootfs: %v", err)
	}
	fetched := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(fetched, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SetRootfsID(fetched, first); err != nil {
		t.Fatal(err)
	}
	if id, err := RootfsID(fetched); err != nil || id != first {
		t.Fatalf("fetched rootfs: %q %v", id, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("temporary files left beside the rootfs: %v", entries)
	}
}
