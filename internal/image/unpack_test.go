package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

func assertFile(t *testing.T, root, rel, want string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Errorf("read %s: %v", rel, err)
		return
	}
	if string(got) != want {
		t.Errorf("%s = %q, want %q", rel, got, want)
	}
}

func assertMissing(t *testing.T, root, rel string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(root, rel)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists (err %v), want it gone", rel, err)
	}
}

func listDir(t *testing.T, dir string) []string {
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

func unpackLayers(t *testing.T, root string, layers ...[]entry) error {
	t.Helper()
	for _, l := range layers {
		if err := UnpackLayer(context.Background(), bytes.NewReader(tarBytes(t, l...)), root); err != nil {
			return err
		}
	}
	return nil
}

func TestUnpackWhiteouts(t *testing.T) {
	root := t.TempDir()
	base := []entry{
		dir("etc/"), file("etc/a", "a"), file("etc/b", "b"),
		dir("etc/d/"), file("etc/d/old", "old"), dir("etc/d/sub/"), file("etc/d/sub/deep", "deep"),
		dir("var/"), dir("var/gone/"), file("var/gone/x", "x"),
	}
	upper := []entry{
		file("etc/.wh.a", ""),
		file("var/.wh.gone", ""),
		file("nowhere/.wh.x", ""), // whiteout in a directory that does not exist: nothing to do
		// Entries of the same layer placed before the opaque marker survive it.
		dir("etc/d/sub/"), file("etc/d/sub/new", "new"),
		file("etc/d/.wh..wh..opq", ""),
		file("etc/d/top", "top"),
	}
	if err := unpackLayers(t, root, base, upper); err != nil {
		t.Fatal(err)
	}
	assertMissing(t, root, "etc/a")
	assertFile(t, root, "etc/b", "b")
	assertMissing(t, root, "var/gone")
	assertMissing(t, root, "nowhere")
	if got, want := listDir(t, filepath.Join(root, "etc/d")), []string{"sub", "top"}; !slices.Equal(got, want) {
		t.Errorf("etc/d = %v, want %v", got, want)
	}
	if got, want := listDir(t, filepath.Join(root, "etc/d/sub")), []string{"new"}; !slices.Equal(got, want) {
		t.Errorf("etc/d/sub = %v, want %v (lower deep hidden by the opaque dir)", got, want)
	}
}

func TestUnpackLinksAndReplacement(t *testing.T) {
	root := t.TempDir()
	base := []entry{
		dir("usr/"), dir("usr/bin/"), symlink("bin", "usr/bin"), symlink("abs", "/usr"),
		file("usr/bin/tool", "tool"), hardlink("usr/bin/tool2", "usr/bin/tool"),
		file("replaced", "file"), dir("was-dir/"), file("was-dir/x", "x"),
		symlink("lib", "usr/lib64"), symlink("abslib", "/opt/lib"), // targets missing
	}
	upper := []entry{
		file("bin/via-link", "through bin"),       // parent is a relative symlink
		file("abs/bin/via-abs", "through abs"),    // an absolute symlink resolves inside the rootfs
		hardlink("bin/tool3", "bin/tool"),         // link target through a symlink
		dir("replaced/"),                          // file becomes directory
		file("was-dir", "now a file"),             // directory becomes file
		symlink("usr/bin/tool2", "tool"),          // hard link replaced by symlink
		file("fresh/nested/file", "parents made"), // parents not in the tar
		file("lib/x/f", "via dangling"),           // mkdir -p makes the link's target
		file("abslib/f", "via dangling abs"),
	}
	if err := unpackLayers(t, root, base, upper); err != nil {
		t.Fatal(err)
	}
	assertFile(t, root, "usr/bin/via-link", "through bin")
	assertFile(t, root, "usr/bin/via-abs", "through abs")
	assertFile(t, root, "usr/bin/tool3", "tool")
	assertFile(t, root, "was-dir", "now a file")
	assertFile(t, root, "fresh/nested/file", "parents made")
	assertFile(t, root, "usr/lib64/x/f", "via dangling")
	assertFile(t, root, "opt/lib/f", "via dangling abs")
	var a, b unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "usr/bin/tool"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(root, "usr/bin/tool3"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("tool3 not a hard link of tool: inodes %d/%d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if target, err := os.Readlink(filepath.Join(root, "usr/bin/tool2")); err != nil || target != "tool" {
		t.Errorf("tool2 -> %q, %v; want symlink to tool", target, err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "replaced")); err != nil || !fi.IsDir() {
		t.Errorf("replaced: %v, %v; want a directory", fi, err)
	}
}

// A hostile layer plants names and symlinks aimed at the host. Whatever it
// does, nothing outside the rootfs may be created, changed or removed:
// names that climb out are refused, and symlinks resolve inside the rootfs
// as they would for a process in the sandbox (absolute targets start at
// the rootfs, ".." stops at it). "{outer}" in a link target stands for the
// host directory around the rootfs.
func TestUnpackStaysInRoot(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		refused bool   // the layer fails with ErrUnsafePath
		inside  string // if set, the file the write landed on, inside the rootfs
	}{
		{name: "dotdot name", entries: []entry{file("../evil", "x")}, refused: true},
		{name: "absolute dotdot name", entries: []entry{file("/../../evil", "x")}, refused: true},
		{name: "dotdot inside name", entries: []entry{file("a/../../evil", "x")}, refused: true},
		{name: "hard link target outside", entries: []entry{hardlink("pw", "../../evil-target")}, refused: true},
		{name: "whiteout dotdot", entries: []entry{dir("d/"), file("d/.wh..", "")}, refused: true},
		{name: "through relative symlink", entries: []entry{symlink("up", "../.."), file("up/evil", "x")}, inside: "evil"},
		{name: "through nested symlinks", inside: "evil",
			entries: []entry{dir("d/"), symlink("d/up", ".."), symlink("d2", "d/up/d/up/.."), file("d2/evil", "x")}},
		{name: "through absolute symlink", entries: []entry{symlink(".aenv", "{outer}"), file(".aenv/envd", "x")},
			inside: "{outer}/envd"},
		{name: "through dangling absolute symlink", entries: []entry{symlink(".aenv", "{outer}/new"), file(".aenv/envd", "x")},
			inside: "{outer}/new/envd"},
		{name: "onto dangling symlink", entries: []entry{symlink("envd", "{outer}/new"), file("envd", "x")}, inside: "envd"},
		{name: "hard link through symlink", entries: []entry{symlink("up", ".."), hardlink("pw", "up/evil-target")}},
		{name: "hard link through absolute symlink", entries: []entry{symlink("up", "{outer}"), hardlink("pw", "up/evil-target")}},
		{name: "whiteout through symlink", entries: []entry{symlink("up", ".."), file("up/.wh.evil-target", "")}},
		{name: "whiteout through absolute symlink", entries: []entry{symlink("up", "{outer}"), file("up/.wh.evil-target", "")}},
		{name: "opaque whiteout through absolute symlink",
			entries: []entry{symlink("up", "{outer}"), file("up/.wh..wh..opq", "")}},
		{name: "xattr through absolute symlink", entries: []entry{symlink("up", "{outer}"),
			{name: "up/evil-target", typ: tar.TypeReg, mode: 0o644, xattrs: map[string]string{"user.evil": "1"}}},
			inside: "{outer}/evil-target"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outer := t.TempDir()
			root := filepath.Join(outer, "a", "root")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			// Targets a hostile layer would like to link to, change or delete.
			for _, p := range []string{filepath.Join(outer, "evil-target"), filepath.Join(outer, "a", "evil-target")} {
				if err := os.WriteFile(p, []byte("host"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			entries := slices.Clone(tt.entries)
			for i := range entries {
				entries[i].link = strings.ReplaceAll(entries[i].link, "{outer}", outer)
			}
			err := unpackLayers(t, root, entries)
			if tt.refused && !errors.Is(err, ErrUnsafePath) {
				t.Errorf("err = %v, want ErrUnsafePath", err)
			}
			if got := listDir(t, outer); !slices.Equal(got, []string{"a", "evil-target"}) {
				t.Errorf("outside the rootfs: %v, want [a evil-target]", got)
			}
			if got := listDir(t, filepath.Join(outer, "a")); !slices.Equal(got, []string{"evil-target", "root"}) {
				t.Errorf("outside the rootfs: a/ = %v, want [evil-target root]", got)
			}
			for _, p := range []string{filepath.Join(outer, "evil-target"), filepath.Join(outer, "a", "evil-target")} {
				if b, err := os.ReadFile(p); err != nil || string(b) != "host" {
					t.Errorf("%s = %q, %v; want it unchanged", p, b, err)
				}
				if n, err := unix.Lgetxattr(p, "user.evil", nil); err == nil {
					t.Errorf("%s got an xattr (%d bytes)", p, n)
				}
			}
			if tt.inside != "" {
				if err != nil {
					t.Fatalf("unpack: %v", err)
				}
				rel := strings.ReplaceAll(tt.inside, "{outer}", outer)
				if fi, err := os.Lstat(filepath.Join(root, rel)); err != nil || !fi.Mode().IsRegular() {
					t.Errorf("rootfs/%s: %v; want the layer's file there", rel, err)
				}
			}
		})
	}
}

// Device nodes in a layer would be real devices on the host (a raw disk,
// /dev/mem) reachable by anyone who can reach the rootfs. gVisor supplies
// the sandbox's /dev itself, so they are skipped; FIFOs are harmless and
// kept.
func TestUnpackSkipsDeviceNodes(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	disk := entry{name: "dev/sda", typ: tar.TypeBlock, mode: 0o666, major: 8, minor: 0}
	mem := entry{name: "mem", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 1}
	null := entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}
	fifo := entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o620}
	lower := []entry{file("mem", "lower layer's file")}
	if err := unpackLayers(t, root, lower, []entry{disk, mem, null, fifo}); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"dev/sda", "mem", "dev/null"} {
		assertMissing(t, root, rel)
	}
	if fi, err := os.Lstat(filepath.Join(root, "run/fifo")); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
		t.Errorf("run/fifo: %v, %v; want a FIFO", fi, err)
	}
}

func TestUnpackCompressions(t *testing.T) {
	plain := tarBytes(t, file("f", "content"))
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(plain)
	gw.Close()
	zw, err := zstd.NewWriter(&zs)
	if err != nil {
		t.Fatal(err)
	}
	zw.Write(plain)
	zw.Close()
	for name, data := range map[string][]byte{"plain": plain, "gzip": gz.Bytes(), "zstd": zs.Bytes()} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := UnpackLayer(context.Background(), bytes.NewReader(data), root); err != nil {
				t.Fatal(err)
			}
			assertFile(t, root, "f", "content")
		})
	}
}

func TestUnpackMetadata(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	setuid := file("usr/bin/su", "su")
	setuid.mode, setuid.uid, setuid.gid = 0o4755, 0, 0
	owned := file("home/u/f", "mine")
	owned.mode, owned.uid, owned.gid = 0o600, 1000, 1001
	owned.xattrs = map[string]string{"user.aenv": "yes"}
	ownedDir := dir("home/u/")
	ownedDir.mode, ownedDir.uid, ownedDir.gid = 0o700, 1000, 1001
	fifo := entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o620}
	link := symlink("home/u/link", "f")
	link.uid, link.gid = 1000, 1001
	if err := unpackLayers(t, root, []entry{dir("home/"), ownedDir, owned, link, setuid, fifo}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		rel      string
		mode     uint32 // full st_mode
		uid, gid uint32
	}{
		{rel: "usr/bin/su", mode: unix.S_IFREG | 0o4755},
		{rel: "home/u", mode: unix.S_IFDIR | 0o700, uid: 1000, gid: 1001},
		{rel: "home/u/f", mode: unix.S_IFREG | 0o600, uid: 1000, gid: 1001},
		{rel: "home/u/link", mode: unix.S_IFLNK | 0o777, uid: 1000, gid: 1001},
		{rel: "run/fifo", mode: unix.S_IFIFO | 0o620},
	}
	for _, tt := range tests {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, tt.rel), &st); err != nil {
			t.Errorf("%s: %v", tt.rel, err)
			continue
		}
		if st.Mode != tt.mode || st.Uid != tt.uid || st.Gid != tt.gid {
			t.Errorf("%s: mode %o uid %d gid %d, want %o %d %d", tt.rel, st.Mode, st.Uid, st.Gid, tt.mode, tt.uid, tt.gid)
		}
		if fi, err := os.Lstat(filepath.Join(root, tt.rel)); err == nil && !fi.ModTime().Equal(testTime) {
			t.Errorf("%s: mtime %v, want %v", tt.rel, fi.ModTime(), testTime)
		}
	}
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(root, "home/u/f"), "user.aenv", buf)
	if errors.Is(err, unix.ENOTSUP) {
		t.Log("filesystem has no user xattrs; skipped that check")
	} else if err != nil || string(buf[:n]) != "yes" {
		t.Errorf("xattr user.aenv = %q, %v; want yes", buf[:n], err)
	}
}
