package volume

import (
	"strings"
	"testing"
)

func TestCheckMountPaths(t *testing.T) {
	for _, tc := range []struct {
		paths []string
		want  string // cleaned paths joined by ",", or the error's substring
		ok    bool
	}{
		{[]string{"/mnt/data"}, "/mnt/data", true},
		{[]string{"/mnt/data/", "/home/user/ref"}, "/mnt/data,/home/user/ref", true},
		{[]string{"/workspace", "/workspaces"}, "/workspace,/workspaces", true},
		{[]string{"/etc/app"}, "/etc/app", true},
		{[]string{"mnt/data"}, "not absolute", false},
		{[]string{""}, "not absolute", false},
		{[]string{"/"}, "system path", false},
		{[]string{"//"}, "system path", false},
		{[]string{"/etc"}, "system path", false},
		{[]string{"/usr/"}, "system path", false},
		{[]string{"/proc"}, "under /proc", false},
		{[]string{"/proc/self"}, "under /proc", false},
		{[]string{"/dev/shm"}, "under /dev", false},
		{[]string{"/sys/fs"}, "under /sys", false},
		{[]string{"/.aenv/envd"}, "under /.aenv", false},
		{[]string{"/mnt/../etc"}, `".." segment`, false},
		{[]string{"/mnt/./x"}, `"." segment`, false},
		{[]string{"/mnt/a\x00"}, "control character", false},
		{[]string{"/mnt/a", "/mnt/a/"}, "given twice", false},
		{[]string{"/mnt/a", "/mnt/a/b"}, "nest", false},
		{[]string{"/mnt/a/b", "/mnt/a"}, "nest", false},
		{[]string{"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h", "/i", "/j", "/k", "/l", "/m", "/n", "/o", "/p", "/q"}, "at most 16", false},
	} {
		got, err := CheckMountPaths(tc.paths)
		switch {
		case tc.ok && (err != nil || strings.Join(got, ",") != tc.want):
			t.Errorf("%q: %q %v, want %q", tc.paths, got, err, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %q %v, want an error saying %q", tc.paths, got, err, tc.want)
		}
	}
}
