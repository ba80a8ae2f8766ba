package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

// node is a data dir laid out as a server's, with its database open (as a
// running server holds it) and a template cache outside it.
type node struct {
	dir, cache string
	db         *sqlite.Store
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

func newNode(t *testing.T) *node {
	t.Helper()
	ctx := context.Background()
	n := &node{dir: filepath.Join(t.TempDir(), "data"), cache: filepath.Join(t.TempDir(), "cache")}
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(n.dir, dbName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	n.db = db
	d := n.dir
	// The base root filesystem, in a cache outside the data dir.
	write(t, filepath.Join(n.cache, "base-k", "rootfs", "bin", "bash"), "bash")
	if err := os.Symlink("usr/lib", filepath.Join(n.cache, "base-k", "rootfs", "lib")); err != nil {
		t.Fatal(err)
	}
	// A template pulled from an image, and one no record names.
	write(t, filepath.Join(d, "templates", "t1", "rootfs", "etc", "os-release"), "debian")
	write(t, filepath.Join(d, "templates", "t1", "rootfs-id"), "id")
	if err := syscall.Mkfifo(filepath.Join(d, "templates", "t1", "rootfs", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d, "templates", "orphan", "rootfs", "x"), "debris")
	// A snapshot's image and a paused sandbox's sharing its pages (hard
	// links, as forks and snapshots of paused sandboxes make them).
	write(t, filepath.Join(d, "images", "pause-sb1", "pages.img"), strings.Repeat("memory", 1000))
	write(t, filepath.Join(d, "images", "pause-sb1", "aenv-complete"), "")
	if err := os.MkdirAll(filepath.Join(d, "images", "snap1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(d, "images", "pause-sb1", "pages.img"), filepath.Join(d, "images", "snap1", "pages.img")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d, "images", "fork-zz", "pages.img"), "scratch")
	write(t, filepath.Join(d, "images", "snap2.partial", "pages.img"), "half")
	// Durable files beside them, and scratch the backup leaves out.
	write(t, filepath.Join(d, "api-key"), "e2b_key\n")
	write(t, filepath.Join(d, "tls", "ca.key"), "key")
	write(t, filepath.Join(d, "builds", "b1.json"), "{}")
	write(t, filepath.Join(d, "lock"), "")
	write(t, filepath.Join(d, "runtime", "sb2", "state.json"), "{}")
	write(t, filepath.Join(d, "shared", "obj"), "cached")
	write(t, filepath.Join(d, "layers", "sha256-1"), "layer")
	write(t, filepath.Join(d, "build-files", "f1"), "upload")

	base := filepath.Join(n.cache, "base-k", "rootfs")
	templates := []*store.Template{
		{ID: "base1", Name: "base", RootfsPath: base},
		{ID: "t1", Name: "img", RootfsPath: filepath.Join(d, "templates", "t1", "rootfs")},
		{ID: "snap1", Name: "snap1", RootfsPath: base, Kind: store.KindSnapshot, ImageDir: filepath.Join(d, "images", "snap1")},
	}
	for _, tpl := range templates {
		if err := db.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	sandboxes := []*store.Sandbox{
		{ID: "sb1", TemplateID: "base1", State: store.StatePaused, ImageDir: filepath.Join(d, "images", "pause-sb1")},
		{ID: "sb2", TemplateID: "base1", State: store.StateRunning},
		{ID: "sb3", TemplateID: "base1", State: store.StateDead},
	}
	for _, sb := range sandboxes {
		sb.StartedAt, sb.EndAt, sb.UpdatedAt = time.Now(), time.Now().Add(time.Hour), time.Now()
		if err := db.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func backup(t *testing.T, n *node) ([]byte, []string, Summary) {
	t.Helper()
	var buf bytes.Buffer
	var warnings []string
	sum, err := Create(context.Background(), &buf, Options{DataDir: n.dir, Version: "test", TempDir: t.TempDir(),
		Warn: func(m string) { warnings = append(warnings, m) }})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), warnings, sum
}

// tree lists the paths under dir, relative, directories with a slash.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestBackupRestore(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	archive, warnings, sum := backup(t, n)
	if sum.Templates != 3 || sum.Paused != 1 || len(sum.External) != 1 {
		t.Errorf("summary %+v: want 3 templates, 1 paused, 1 external root", sum)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "sb2") {
		t.Errorf("warnings %q: want one about the running sandbox sb2", warnings)
	}

	// The cache is gone on the new machine: the archive brings it back.
	if err := os.RemoveAll(n.cache); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	rs, err := Restore(ctx, bytes.NewReader(archive), dst)
	if err != nil {
		t.Fatal(err)
	}
	if rs.From != n.dir || len(rs.External) != 1 || len(rs.Kept) != 0 {
		t.Errorf("restore summary %+v", rs)
	}
	want := []string{"aenv.db", "api-key", "builds/", "builds/b1.json", "images/", "images/pause-sb1/",
		"images/pause-sb1/aenv-complete", "images/pause-sb1/pages.img", "images/snap1/", "images/snap1/pages.img",
		"templates/", "templates/t1/", "templates/t1/rootfs-id", "templates/t1/rootfs/", "templates/t1/rootfs/etc/",
		"templates/t1/rootfs/etc/os-release", "templates/t1/rootfs/fifo", "tls/", "tls/ca.key"}
	if got := tree(t, dst); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("restored data dir:\n got %q\nwant %q", got, want)
	}
	if got := tree(t, n.cache); strings.Join(got, " ") != "base-k/ base-k/rootfs/ base-k/rootfs/bin/ base-k/rootfs/bin/bash base-k/rootfs/lib" {
		t.Errorf("restored cache: %q", got)
	}
	if l, err := os.Readlink(filepath.Join(n.cache, "base-k", "rootfs", "lib")); err != nil || l != "usr/lib" {
		t.Errorf("symlink: %q %v", l, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "images", "pause-sb1", "pages.img"))
	b, _ := os.Stat(filepath.Join(dst, "images", "snap1", "pages.img"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Error("the images' shared pages are not one file (hard link) after the restore")
	}
	if a != nil && a.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", a.Mode())
	}
	if fi, err := os.Stat(filepath.Join(dst, "templates", "t1", "rootfs", "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v %v", fi, err)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v %v", fi, err)
	}

	// The records name the new data dir's files; the cache keeps its path.
	db, err := sqlite.Open(ctx, filepath.Join(dst, dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checks := []struct{ id, rootfs, image string }{
		{"base", filepath.Join(n.cache, "base-k", "rootfs"), ""},
		{"img", filepath.Join(dst, "templates", "t1", "rootfs"), ""},
		{"snap1", filepath.Join(n.cache, "base-k", "rootfs"), filepath.Join(dst, "images", "snap1")},
	}
	for _, c := range checks {
		tpl, err := db.GetTemplate(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if tpl.RootfsPath != c.rootfs || tpl.ImageDir != c.image {
			t.Errorf("template %s: rootfs %q image %q, want %q %q", c.id, tpl.RootfsPath, tpl.ImageDir, c.rootfs, c.image)
		}
	}
	sb, err := db.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageDir != filepath.Join(dst, "images", "pause-sb1") || sb.State != store.StatePaused {
		t.Errorf("paused sandbox: %+v", sb)
	}

	// A second restore finds the cache there and keeps it.
	write(t, filepath.Join(n.cache, "base-k", "rootfs", "bin", "bash"), "rebuilt")
	rs, err = Restore(ctx, bytes.NewReader(archive), filepath.Join(t.TempDir(), "again"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Kept) != 1 || len(rs.External) != 0 {
		t.Errorf("second restore: %+v", rs)
	}
	if b, _ := os.ReadFile(filepath.Join(n.cache, "base-k", "rootfs", "bin", "bash")); string(b) != "rebuilt" {
		t.Errorf("kept cache overwritten: %q", b)
	}
}

// A restore refuses a data dir with anything in it, and writes nothing.
func TestRestoreRefusesNonEmpty(t *testing.T) {
	n := newNode(t)
	archive, _, _ := backup(t, n)
	dst := t.TempDir()
	write(t, filepath.Join(dst, "aenv.db"), "precious")
	_, err := Restore(context.Background(), bytes.NewReader(archive), dst)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("restore into a non-empty dir: %v, want a conflict", err)
	}
	if got := tree(t, dst); len(got) != 1 {
		t.Errorf("data dir changed: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "aenv.db")); string(b) != "precious" {
		t.Errorf("file changed: %q", b)
	}
}

// A damaged archive is refused and leaves nothing: not the data dir it
// made, nor its staging, nor an external root.
func TestRestoreRefusesDamaged(t *testing.T) {
	n := newNode(t)
	archive, _, _ := backup(t, n)
	flip := func(at int) []byte {
		b := bytes.Clone(archive)
		b[at] ^= 0x55
		return b
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"cut to a quarter", archive[:len(archive)/4]},
		{"cut to half", archive[:len(archive)/2]},
		{"last byte missing", archive[:len(archive)-1]},
		{"a byte altered in the middle", flip(len(archive) / 2)},
		{"a byte altered near the end", flip(len(archive) - 6)},
		{"its checksum altered", flip(len(archive) - 1)},
		{"not zstd", []byte("hello, this is not an archive")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.RemoveAll(n.cache); err != nil {
				t.Fatal(err)
			}
			parent := t.TempDir()
			dst := filepath.Join(parent, "restored")
			_, err := Restore(context.Background(), bytes.NewReader(tc.data), dst)
			if err == nil {
				t.Fatal("restore of a damaged archive succeeded")
			}
			t.Log(err)
			if got := tree(t, parent); len(got) != 0 {
				t.Errorf("left behind: %q", got)
			}
			if _, err := os.Stat(n.cache); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("external root left behind: %v", err)
			}
			if entries, _ := os.ReadDir(filepath.Dir(n.cache)); len(entries) != 0 {
				t.Errorf("partial external root left behind: %v", entries)
			}
		})
	}
}

// entry is one tar entry of a hand-made archive.
type entry struct {
	name, body, link string
	typ              byte
}

func handMade(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Linkname: e.link, Size: int64(len(e.body)), Mode: 0o600,
			Uid: os.Geteuid(), Gid: os.Getegid(), Format: tar.FormatPAX}
		if typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Archives not written by Create are refused, and none writes outside
// the data dir.
func TestRestoreRefusesMalformed(t *testing.T) {
	outside := t.TempDir()
	hdr := entry{name: headerName, body: `{"format":1,"dataDir":"/data/old"}`}
	db := entry{name: "data/aenv.db", body: "db"}
	cases := []struct {
		name    string
		entries []entry
	}{
		{"no header", []entry{db, {name: trailerName, body: `{"entries":1,"bytes":2}`}}},
		{"no trailer", []entry{hdr, db}},
		{"counts do not match", []entry{hdr, db, {name: trailerName, body: `{"entries":5,"bytes":2}`}}},
		{"no database", []entry{hdr, {name: trailerName, body: `{"entries":1,"bytes":34}`}}},
		{"newer format", []entry{{name: headerName, body: `{"format":2,"dataDir":"/data/old"}`}}},
		{"relative data dir", []entry{{name: headerName, body: `{"format":1,"dataDir":"old"}`}}},
		{"parent path", []entry{hdr, {name: "data/../../escape", body: "x"}}},
		{"absolute path", []entry{hdr, {name: "/etc/escape", body: "x"}}},
		{"unknown prefix", []entry{hdr, {name: "other/x", body: "x"}}},
		{"through a symlink", []entry{hdr, {name: "data/l", typ: tar.TypeSymlink, link: outside},
			{name: "data/l/escape", body: "x"}}},
		{"into a missing directory", []entry{hdr, {name: "data/a/b", body: "x"}}},
		{"hard link to outside", []entry{hdr, {name: "data/h", typ: tar.TypeLink, link: "/etc/passwd"}}},
		{"undeclared external root", []entry{hdr, {name: "external/0", typ: tar.TypeDir}}},
		{"entries after the trailer", []entry{hdr, db, {name: trailerName, body: `{"entries":2,"bytes":36}`},
			{name: "data/late", body: "x"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			_, err := Restore(context.Background(), bytes.NewReader(handMade(t, tc.entries)), filepath.Join(parent, "d"))
			if err == nil {
				t.Fatal("restore succeeded")
			}
			t.Log(err)
			if got := tree(t, parent); len(got) != 0 {
				t.Errorf("left behind: %q", got)
			}
			if got := tree(t, outside); len(got) != 0 {
				t.Errorf("written outside: %q", got)
			}
		})
	}
}

// A node's data dir without a database is not backed up.
func TestBackupNeedsDatabase(t *testing.T) {
	var buf bytes.Buffer
	_, err := Create(context.Background(), &buf, Options{DataDir: t.TempDir()})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("backup of a dir without a database: %v, want not found", err)
	}
}

// With the default --template-cache-dir (<data-dir>/cache), the base root
// filesystem is held inside the data dir, and older builds of the cache
// are left out.
func TestBackupCacheInDataDir(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(dir, dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	write(t, filepath.Join(dir, "cache", "base-new", "rootfs", "bin", "bash"), "bash")
	write(t, filepath.Join(dir, "cache", "base-new.lock"), "")
	write(t, filepath.Join(dir, "cache", "base-old", "rootfs", "bin", "bash"), "old")
	if err := db.PutTemplate(ctx, &store.Template{ID: "b", Name: "base", RootfsPath: filepath.Join(dir, "cache", "base-new", "rootfs")}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sum, err := Create(ctx, &buf, Options{DataDir: dir, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.External) != 0 {
		t.Errorf("external roots %q, want none", sum.External)
	}
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := Restore(ctx, &buf, dst); err != nil {
		t.Fatal(err)
	}
	want := "aenv.db cache/ cache/base-new/ cache/base-new/rootfs/ cache/base-new/rootfs/bin/ cache/base-new/rootfs/bin/bash"
	if got := strings.Join(tree(t, dst), " "); got != want {
		t.Errorf("restored:\n got %s\nwant %s", got, want)
	}
}

// An image deleted while the walk reads it (its sandbox resumed) goes into
// the archive without its completion marker, so that a restored node
// takes it for incomplete instead of restoring part of it; an image left
// alone keeps its marker, written after its files.
func TestBackupImageDeletedDuringWalk(t *testing.T) {
	data := t.TempDir()
	for _, img := range []string{"pause-gone", "pause-kept"} {
		write(t, filepath.Join(data, "images", img, "aenv-complete"), "")
		write(t, filepath.Join(data, "images", img, "pages.img"), "pages of "+img)
	}
	var buf bytes.Buffer
	a := &archiver{tw: tar.NewWriter(&buf), links: map[fileID]string{}, imagesDir: filepath.Join(data, "images")}
	choose := func(rel string) walkChoice {
		if rel == "images/pause-gone/pages.img" {
			os.RemoveAll(filepath.Join(data, "images", "pause-gone")) // resumed, mid-walk
		}
		return include
	}
	if err := a.writeTree(context.Background(), data, "data", choose, false); err != nil {
		t.Fatal(err)
	}
	if err := a.writeMarkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.tw.Close()
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	got := strings.Join(names, " ")
	if strings.Contains(got, "pause-gone/aenv-complete") || strings.Contains(got, "pause-gone/pages.img") {
		t.Errorf("the deleted image is in the archive as complete: %s", got)
	}
	kept := slices.Index(names, "data/images/pause-kept/aenv-complete")
	if kept < 0 || kept < slices.Index(names, "data/images/pause-kept/pages.img") {
		t.Errorf("the kept image's marker is missing or before its files: %s", got)
	}
}

// An archive naming an external root that holds no template's root
// filesystem (altered to put files somewhere else as root) is refused, and
// nothing is written there.
func TestRestoreRefusesUnknownExternalRoot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(dir, dbName)) // a real database, with no template
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	raw, err := os.ReadFile(filepath.Join(dir, dbName))
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "etc", "systemd", "system", "evil.service.d")
	body, _ := json.Marshal(map[string]any{"format": 1, "dataDir": "/data/old", "external": []string{target}})
	archive := handMade(t, []entry{
		{name: headerName, body: string(body)},
		{name: "data/aenv.db", body: string(raw)},
		{name: "external/0", typ: tar.TypeDir},
		{name: "external/0/override.conf", body: "[Service]\nExecStart=/bin/evil\n"},
	})
	parent := t.TempDir()
	_, err = Restore(ctx, bytes.NewReader(archive), filepath.Join(parent, "d"))
	if err == nil || !strings.Contains(err.Error(), "holds no template's root filesystem") {
		t.Fatalf("restore: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(target)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused restore made %s: %v", filepath.Dir(target), err)
	}
	if got := tree(t, parent); len(got) != 0 {
		t.Errorf("left behind: %q", got)
	}
}
