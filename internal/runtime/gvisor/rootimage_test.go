package gvisor

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/erofs"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// rootfsTree makes a small prepared rootfs: a directory, a file, a
// symbolic link, and the envd mount point.
func rootfsTree(t *testing.T, content string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("etc/hostname", filepath.Join(root, "name")); err != nil {
		t.Fatal(err)
	}
	if err := runtime.PrepareRootfs(root); err != nil {
		t.Fatal(err)
	}
	return root
}

func writeEnvd(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The same tree makes the same bytes, in any directory and at any time
// (a rootfs fetched on another node must give the image its checkpoints
// name); another tree makes another image; an image is made once per
// rootfs; a restore that names an image the node cannot make is refused
// with ErrRootImageMismatch; nothing half made is left.
func TestRootImages(t *testing.T) {
	rootfs := rootfsTree(t, "one\n")
	envd := writeEnvd(t, "envd build 1")
	a, b := newRootImages(t.TempDir()), newRootImages(t.TempDir())
	spec := runtime.Spec{RootfsPath: rootfs, EnvdPath: envd, RootImage: true}

	imgA, err := a.image(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	digest := a.digestOfPath(imgA)
	if digest == "" {
		t.Fatalf("image %s is not named by a digest under %s", imgA, a.dir)
	}
	if got, err := fileSHA256(imgA); err != nil || got != digest {
		t.Fatalf("image %s has digest %s, %v; its name says %s", imgA, got, err, digest)
	}
	// The same files copied elsewhere, times kept (as the object store's
	// transfer keeps them) make the same bytes; a file's other time makes
	// another image, since the files keep their times.
	copied := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", rootfs, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	imgB, err := b.image(t.Context(), runtime.Spec{RootfsPath: copied, EnvdPath: envd, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	if b.digestOfPath(imgB) != digest {
		t.Errorf("the same tree elsewhere made %s, want %s", b.digestOfPath(imgB), digest)
	}
	retimed := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", rootfs, retimed).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(retimed, "etc", "hostname"), old, old); err != nil {
		t.Fatal(err)
	}
	imgC, err := b.image(t.Context(), runtime.Spec{RootfsPath: retimed, EnvdPath: envd, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	if b.digestOfPath(imgC) == digest {
		t.Errorf("a file's other modification time made the same image")
	}
	if info, err := os.Stat(imgA); err != nil || info.Mode().Perm() != 0o400 {
		t.Errorf("image mode %v, %v; want 0400 (it holds the template's files)", info.Mode(), err)
	}
	if info, err := os.Stat(a.dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("image directory mode %v, %v; want 0700", info.Mode(), err)
	}

	// Made once: a second driver on the same directory finds it by its
	// index, without making it again.
	info, err := os.Stat(imgA)
	if err != nil {
		t.Fatal(err)
	}
	again, err := newRootImages(a.dir).image(t.Context(), spec)
	if err != nil || again != imgA {
		t.Fatalf("second lookup: %s, %v; want %s", again, err, imgA)
	}
	if info2, _ := os.Stat(imgA); !os.SameFile(info, info2) {
		t.Errorf("image made again instead of found")
	}

	other, err := a.image(t.Context(), runtime.Spec{RootfsPath: rootfsTree(t, "two\n"), EnvdPath: envd, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	if other == imgA {
		t.Errorf("another tree made the same image %s", other)
	}

	// A restore names its image: found when present, else made and
	// compared.
	named := spec
	named.RootImageDigest = digest
	if got, err := newRootImages(t.TempDir()).image(t.Context(), named); err != nil || !strings.HasSuffix(got, strings.TrimPrefix(digest, "sha256:")+".erofs") {
		t.Errorf("restore naming the image this rootfs makes: %s, %v", got, err)
	}
	named.RootImageDigest = "sha256:" + strings.Repeat("0", 64)
	if _, err := a.image(t.Context(), named); !errors.Is(err, runtime.ErrRootImageMismatch) {
		t.Errorf("restore naming another image: %v, want ErrRootImageMismatch", err)
	}

	// envd's image: one per build, the binary as its only file.
	e1, err := a.envdImage(t.Context(), envd)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := a.envdImage(t.Context(), writeEnvd(t, "envd build 2"))
	if err != nil {
		t.Fatal(err)
	}
	if e1 == e2 || filepath.Dir(e1) != filepath.Join(a.dir, "envd") {
		t.Errorf("envd images %s and %s: want two under %s/envd", e1, e2, a.dir)
	}
	// Made on another node (another directory, another time): the same
	// bytes, or a restore there fails inside the sentry.
	time.Sleep(10 * time.Millisecond) // not a wait: a later tree, whose times would differ
	e3, err := b.envdImage(t.Context(), envd)
	if err != nil {
		t.Fatal(err)
	}
	d1, err1 := fileSHA256(e1)
	d3, err3 := fileSHA256(e3)
	if err1 != nil || err3 != nil || d1 != d3 {
		t.Errorf("envd image made twice: %s and %s (%v, %v); want the same bytes", d1, d3, err1, err3)
	}

	for _, dir := range []string{a.dir, filepath.Join(a.dir, "envd")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("left behind: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}

// A corrupt index entry is not trusted: the image is made again.
func TestRootImageIndexMalformed(t *testing.T) {
	ri := newRootImages(t.TempDir())
	spec := runtime.Spec{RootfsPath: rootfsTree(t, "x\n"), EnvdPath: writeEnvd(t, "e"), RootImage: true}
	want, err := ri.image(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := ri.key(spec.RootfsPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ri.dir, "index", key), []byte("../../etc/passwd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := newRootImages(ri.dir).image(t.Context(), spec)
	if err != nil || got != want {
		t.Errorf("after a corrupt index entry: %s, %v; want %s", got, err, want)
	}
}

func TestDigestOfPath(t *testing.T) {
	ri := newRootImages("/images")
	hex := strings.Repeat("ab", 32)
	tests := []struct {
		path, want string
	}{
		{"/images/" + hex + ".erofs", "sha256:" + hex},
		{"/other/" + hex + ".erofs", ""},
		{"/images/envd/" + hex + ".erofs", ""},
		{"/images/" + hex, ""},
		{"/images/" + hex[:10] + ".erofs", ""},
		{"/images/../images/" + hex + ".erofs", ""},
	}
	for _, tt := range tests {
		if got := ri.digestOfPath(tt.path); got != tt.want {
			t.Errorf("digestOfPath(%q) = %q, want %q", tt.path, got, tt.want)
		}
	}
}

// collect removes the images and index entries of root file systems that
// are gone, and what a killed build left, once old enough; it keeps what a
// rootfs still needs, envd's images, and anything young.
func TestRootImageCollect(t *testing.T) {
	ri := newRootImages(t.TempDir())
	envd := writeEnvd(t, "e")
	kept, gone := rootfsTree(t, "kept\n"), rootfsTree(t, "gone\n")
	keptImg, err := ri.image(t.Context(), runtime.Spec{RootfsPath: kept, EnvdPath: envd, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	goneImg, err := ri.image(t.Context(), runtime.Spec{RootfsPath: gone, EnvdPath: envd, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	envdImg, err := ri.envdImage(t.Context(), envd)
	if err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(ri.dir, ".build-dead.erofs")
	if err := os.WriteFile(leftover, []byte("half"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}

	// Young: only the index entry of the rootfs gone goes.
	if n, err := ri.collect(time.Now()); err != nil || n != 1 {
		t.Errorf("collect now: removed %d, %v; want the one index entry", n, err)
	}
	for _, p := range []string{keptImg, goneImg, envdImg, leftover} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("young %s removed: %v", p, err)
		}
	}
	// Old enough: the unneeded image and the leftover go too.
	if n, err := ri.collect(time.Now().Add(2 * collectAge)); err != nil || n != 2 {
		t.Errorf("collect later: removed %d, %v; want the image and the leftover", n, err)
	}
	for _, p := range []string{goneImg, leftover} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s kept: %v", p, err)
		}
	}
	for _, p := range []string{keptImg, envdImg} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
	if got, err := newRootImages(ri.dir).image(t.Context(), runtime.Spec{RootfsPath: kept, EnvdPath: envd, RootImage: true}); err != nil || got != keptImg {
		t.Errorf("after collect, the kept rootfs's image: %s, %v", got, err)
	}
}

// What gVisor's own EROFS reader sees of an image: a file that had an
// extended attribute opens (the reader refuses any inode with one, so
// images are made without them), and files keep their modification times.
func TestRootImageReadByGVisor(t *testing.T) {
	rootfs := rootfsTree(t, "x\n")
	file := filepath.Join(rootfs, "etc", "hostname")
	xattr := true
	if err := unix.Setxattr(file, "user.aenv-test", []byte("1"), 0); err != nil {
		// Some file systems keep no user attributes; the time is still checked.
		t.Logf("this file system keeps no user extended attributes (%v): that half is not checked here", err)
		xattr = false
	}
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(file, when, when); err != nil {
		t.Fatal(err)
	}
	ri := newRootImages(t.TempDir())
	p, err := ri.image(t.Context(), runtime.Spec{RootfsPath: rootfs, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := erofs.OpenImage(f)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	nid := img.RootNid()
	for _, name := range []string{"etc", "hostname"} {
		dir, err := img.Inode(nid)
		if err != nil {
			t.Fatal(err)
		}
		if nid, err = dir.Lookup(name); err != nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
	}
	inode, err := img.Inode(nid)
	if err != nil {
		t.Fatalf("gVisor's reader refuses /etc/hostname (extended attribute kept: %v): %v", xattr, err)
	}
	if got := int64(inode.Mtime()); got != when.Unix() {
		t.Errorf("/etc/hostname's mtime in the image: %d, want %d", got, when.Unix())
	}
	if !inode.IsRegular() || inode.Size() != 2 {
		t.Errorf("/etc/hostname in the image: regular %v, size %d", inode.IsRegular(), inode.Size())
	}
}

// A rootfs made anew at the path of an old one (a template cache rebuilt)
// gets its own image, not the old one's: the file system may give the new
// directory the old one's inode number.
func TestRootImageRootfsMadeAnew(t *testing.T) {
	at := filepath.Join(t.TempDir(), "rootfs")
	place := func(src string) {
		t.Helper()
		if err := os.RemoveAll(at); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", src, at).CombinedOutput(); err != nil {
			t.Fatalf("cp -a: %v: %s", err, out)
		}
	}
	one, two := rootfsTree(t, "one\n"), rootfsTree(t, "two\n")
	ri := newRootImages(t.TempDir())
	place(one)
	first, err := ri.image(t.Context(), runtime.Spec{RootfsPath: at, RootImage: true})
	if err != nil {
		t.Fatal(err)
	}
	place(two)
	for _, r := range []*rootImages{ri, newRootImages(ri.dir)} {
		second, err := r.image(t.Context(), runtime.Spec{RootfsPath: at, RootImage: true})
		if err != nil {
			t.Fatal(err)
		}
		if second == first {
			t.Errorf("the rootfs made anew at %s got the old one's image", at)
		}
	}
}

// EnvdInUse names the envd of every bundle: recorded in it, or for a
// bundle made before that record, its mount's source; a bundle with no
// spec yet names none; one whose envd cannot be told fails the answer.
func TestEnvdInUse(t *testing.T) {
	d := &Driver{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	for _, dir := range []string{d.runscRoot(), d.sandboxesDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rootfs := rootfsTree(t, "r\n")
	a, b := writeEnvd(t, "a"), writeEnvd(t, "b")
	for id, envd := range map[string]string{"sbaaaaaaaaaaaaaaaaaa": a, "sbbbbbbbbbbbbbbbbbbb": b} {
		if err := d.makeBundle(t.Context(), runtime.Spec{ID: id, RootfsPath: rootfs, EnvdPath: envd, NetnsPath: "/run/netns/t", MemoryMB: 256, VCPU: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// The second bundle is of a release before the record.
	if err := os.Remove(filepath.Join(d.sandboxDir("sbbbbbbbbbbbbbbbbbbb"), envdFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d.sandboxDir("sbhalfhalfhalfhalfha"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := d.EnvdInUse(t.Context())
	if err != nil || len(got) != 2 || !got[a] || !got[b] {
		t.Errorf("EnvdInUse: %v, %v; want %s and %s", got, err, a, b)
	}
	// A bundle that names no envd (a spec over root images, its record not
	// yet written) fails the answer rather than leave its build out.
	if err := os.WriteFile(filepath.Join(d.sandboxDir("sbhalfhalfhalfhalfha"), "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := d.EnvdInUse(t.Context()); err == nil {
		t.Errorf("EnvdInUse with a bundle naming no envd: %v, no error", got)
	}
}
