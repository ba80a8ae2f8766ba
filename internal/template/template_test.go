package template

import (
	"os"
	"path/filepath"
	"testing"
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
