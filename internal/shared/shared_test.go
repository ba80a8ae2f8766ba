package shared

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/aenv-dev/aenv/internal/template"
)

// node is one side of a two-node test: its records and its Images.
type node struct {
	db     *sqlite.Store
	images *Images
	dir    string
}

func newNode(t *testing.T, srv *s3test.Server, id string, find func(ctx context.Context, idOrName string) (*store.Template, error)) *node {
	t.Helper()
	dir := t.TempDir()
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objects, err := objectstore.Open(ctx, objectstore.Config{Bucket: "shared-test", Prefix: "c",
		Endpoint: srv.Endpoint, AccessKeyID: s3test.AccessKeyID, SecretAccessKey: s3test.SecretAccessKey})
	if err != nil {
		t.Fatal(err)
	}
	im, err := Open(Config{Store: objects, Dir: filepath.Join(dir, "shared"), CacheBytes: 1 << 30, NodeID: id,
		Records: db, Find: find, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Uploads: objectstore.UploaderOptions{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { im.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return &node{db: db, images: im, dir: dir}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ", a, b)
	}
}

// A snapshot shared by node a is found by node b once uploaded: b fetches
// the root filesystem (it has none like it) once and the image into its
// cache, both equal to a's; deleting it removes its image from the store.
func TestShareFindFetchDelete(t *testing.T) {
	srv := s3test.Start(t)
	a := newNode(t, srv, "a", nil)
	b := newNode(t, srv, "b", func(ctx context.Context, idOrName string) (*store.Template, error) {
		tpl, err := a.db.GetTemplate(ctx, idOrName)
		if err != nil {
			return nil, err
		}
		if tpl.Upload != store.UploadUploaded {
			return nil, store.ErrNotFound
		}
		tpl.NodeID = "a"
		return tpl, nil
	})
	ctx := context.Background()

	rootfs := filepath.Join(a.dir, "templates", "img", "rootfs")
	writeFile(t, filepath.Join(rootfs, "etc", "os-release"), []byte("ID=test\n"))
	if err := os.Symlink("os-release", filepath.Join(rootfs, "etc", "release")); err != nil {
		t.Fatal(err)
	}
	memory := make([]byte, 3<<20)
	rand.Read(memory)
	image := filepath.Join(a.dir, "images", "snap1")
	writeFile(t, filepath.Join(image, "pages.img"), memory)

	tpl := &store.Template{ID: "snap1", Name: "warm", Kind: store.KindSnapshot, RootfsPath: rootfs,
		ImageDir: image, CreatedAt: time.Now()}
	if err := a.images.Share(tpl); err != nil {
		t.Fatal(err)
	}
	if tpl.Upload != store.UploadPending || tpl.RootfsID == "" {
		t.Fatalf("shared template: %+v", tpl)
	}
	if err := a.db.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if _, err := b.images.Find(ctx, "warm"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("found before the upload: %v", err)
	}
	a.images.Upload(tpl)
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := a.db.GetTemplate(ctx, "snap1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Upload == store.UploadUploaded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not uploaded: %+v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}

	found, err := b.images.Find(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if !b.images.Remote(found) || !strings.HasPrefix(found.RootfsPath, b.dir+"/") {
		t.Fatalf("found: remote %v, rootfs %s", b.images.Remote(found), found.RootfsPath)
	}
	sameFile(t, filepath.Join(rootfs, "etc", "os-release"), filepath.Join(found.RootfsPath, "etc", "os-release"))
	if target, err := os.Readlink(filepath.Join(found.RootfsPath, "etc", "release")); err != nil || target != "os-release" {
		t.Errorf("symlink: %q %v", target, err)
	}
	if id, err := template.RootfsID(found.RootfsPath); err != nil || id != tpl.RootfsID {
		t.Errorf("fetched rootfs is named %q (%v), want %q", id, err, tpl.RootfsID)
	}
	again, err := b.images.Find(ctx, "snap1")
	if err != nil || again.RootfsPath != found.RootfsPath {
		t.Errorf("second find: %v %v", again, err)
	}
	dir, release, err := b.images.Image(ctx, found)
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, filepath.Join(image, "pages.img"), filepath.Join(dir, "pages.img"))
	release()

	// A node with the same root filesystem (same name) uses its own.
	if path, err := a.images.Rootfs(ctx, tpl.RootfsID); err != nil || path != rootfs {
		t.Errorf("node a's own rootfs: %q %v", path, err)
	}

	a.images.Delete(ctx, tpl)
	if _, err := a.images.cfg.Store.Stat(ctx, imageKey("snap1")); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("image left in the store after delete: %v", err)
	}
}

func TestLiveKeys(t *testing.T) {
	live := LiveKeys([]*store.Template{
		{ID: "t1", Upload: store.UploadUploaded, RootfsID: "r1"},
		{ID: "t2", Upload: store.UploadPending, RootfsID: "r2"}, // recorded before its upload: live
		{ID: "t3"}, // never shared
	}, []*store.Sandbox{
		{ID: "s1", ImageDir: "/i/s1", ImageUpload: store.UploadUploaded},
		{ID: "s2", ImageDir: "", ImageUpload: store.UploadNone}, // resumed
	})
	for key, want := range map[string]bool{
		"templates/t1": true, "rootfs/r1": true, "templates/t2": true, "rootfs/r2": true,
		"templates/t3": false, "sandboxes/s1": true, "sandboxes/s2": false, "rootfs/gone": false,
	} {
		if got := live(key); got != want {
			t.Errorf("live(%s) = %v, want %v", key, got, want)
		}
	}
}
