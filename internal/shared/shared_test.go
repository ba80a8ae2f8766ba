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
	"sync/atomic"
	"testing"
	"time"

	aenvnode "github.com/aenv-dev/aenv/internal/node"
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

func newNode(t *testing.T, srv *s3test.Server, id string, find func(ctx context.Context, idOrName string) (*store.Template, error),
	opts ...func(*Config)) *node {
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
	cfg := Config{Store: objects, Dir: filepath.Join(dir, "shared"), CacheBytes: 1 << 30, NodeID: id,
		Records: db, Find: find, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Uploads: objectstore.UploaderOptions{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}}
	for _, o := range opts {
		o(&cfg)
	}
	im, err := Open(cfg)
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
	a.images.Upload(tpl, "", nil)
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
	if path, err := a.images.Rootfs(ctx, tpl.RootfsID, found.RootfsDigest); err != nil || path != rootfs {
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

// findUploaded finds node a's uploaded templates, as a cluster's database
// does for the other nodes.
func findUploaded(a *node) func(ctx context.Context, idOrName string) (*store.Template, error) {
	return func(ctx context.Context, idOrName string) (*store.Template, error) {
		tpl, err := a.db.GetTemplate(ctx, idOrName)
		if err != nil {
			return nil, err
		}
		if tpl.Upload != store.UploadUploaded {
			return nil, store.ErrNotFound
		}
		tpl.NodeID = "a"
		return tpl, nil
	}
}

// waitFor polls cond (a record's state) for a minute.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A bucket writer replaces a snapshot's image, its root filesystem and
// the image of a sandbox paused to disk, each with a manifest that matches
// the replacement. The records pinned the digests of what was uploaded, so
// another node refuses every fetch with a bad-gateway error naming the
// object, and nothing injected reaches its disk.
func TestRewrittenObjectsRefused(t *testing.T) {
	srv := s3test.Start(t)
	a := newNode(t, srv, "a", nil)
	ctx := context.Background()

	rootfs := filepath.Join(a.dir, "templates", "img", "rootfs")
	writeFile(t, filepath.Join(rootfs, "etc", "os-release"), []byte("ID=test\n"))
	memory := make([]byte, 1<<20)
	rand.Read(memory)
	image := filepath.Join(a.dir, "images", "snap1")
	writeFile(t, filepath.Join(image, "pages.img"), memory)
	tpl := &store.Template{ID: "snap1", Name: "warm", Kind: store.KindSnapshot, RootfsPath: rootfs,
		ImageDir: image, CreatedAt: time.Now()}
	if err := a.images.Share(tpl); err != nil {
		t.Fatal(err)
	}
	if err := a.db.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	a.images.Upload(tpl, "", nil)
	var uploaded *store.Template
	waitFor(t, "template uploaded", func() (bool, error) {
		got, err := a.db.GetTemplate(ctx, "snap1")
		uploaded = got
		return err == nil && got.Upload == store.UploadUploaded, err
	})
	if !strings.HasPrefix(uploaded.ImageDigest, "sha256:") || !strings.HasPrefix(uploaded.RootfsDigest, "sha256:") {
		t.Fatalf("digests not pinned at upload: %+v", uploaded)
	}

	sbImage := filepath.Join(a.dir, "images", "pause-sb1")
	writeFile(t, filepath.Join(sbImage, "pages.img"), memory)
	sb := &store.Sandbox{ID: "sb1", TemplateID: "snap1", State: store.StatePaused, ImageDir: sbImage,
		SlotIndex: -1, StartedAt: time.Now()}
	if err := a.db.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	a.images.UploadSandbox(sb, rootfs, tpl.RootfsID)
	waitFor(t, "sandbox image uploaded", func() (bool, error) {
		got, err := a.db.GetSandbox(ctx, "sb1")
		if err == nil && got.ImageUpload == store.UploadUploaded && !strings.HasPrefix(got.ImageDigest, "sha256:") {
			t.Fatalf("sandbox image digest not pinned at upload: %+v", got)
		}
		return err == nil && got.ImageUpload == store.UploadUploaded, err
	})

	// The bucket writer: its own client on the same bucket and prefix.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	writer, err := objectstore.Open(wctx, objectstore.Config{Bucket: "shared-test", Prefix: "c",
		Endpoint: srv.Endpoint, AccessKeyID: s3test.AccessKeyID, SecretAccessKey: s3test.SecretAccessKey})
	if err != nil {
		t.Fatal(err)
	}
	evil := t.TempDir()
	writeFile(t, filepath.Join(evil, "image", "pages.img"), []byte("injected memory"))
	writeFile(t, filepath.Join(evil, "rootfs", "etc", "os-release"), []byte("ID=injected\n"))
	for key, dir := range map[string]string{imageKey("snap1"): "image", sandboxKey("sb1"): "image",
		rootfsKey(tpl.RootfsID): "rootfs"} {
		if _, err := writer.Put(wctx, key, filepath.Join(evil, dir)); err != nil {
			t.Fatal(err)
		}
	}

	b := newNode(t, srv, "b", findUploaded(a), func(c *Config) {
		c.Orphan = func(ctx context.Context, id string, _ time.Duration) (*store.Sandbox, error) {
			return a.db.GetSandbox(ctx, id)
		}
		c.Claim = func(ctx context.Context, id, _ string, _ time.Duration) (*store.Sandbox, error) {
			return nil, errors.New("claimed a sandbox whose image was refused")
		}
	})
	refused := func(what string, err error, key string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: a rewritten %s was accepted", what, key)
		}
		if !errors.Is(err, aenvnode.ErrBadGateway) || !errors.Is(err, objectstore.ErrCorrupt) ||
			!strings.Contains(err.Error(), key) {
			t.Fatalf("%s: %v; want a bad-gateway error naming %s", what, err, key)
		}
	}
	_, err = b.images.Find(ctx, "warm")
	refused("find", err, rootfsKey(tpl.RootfsID))
	if _, err := os.Stat(filepath.Join(b.dir, "shared", "rootfs", tpl.RootfsID)); err == nil {
		entries, _ := os.ReadDir(filepath.Join(b.dir, "shared", "rootfs", tpl.RootfsID))
		for _, e := range entries {
			if e.Name() == "rootfs" {
				t.Fatal("the injected root filesystem was put in place")
			}
		}
	}
	_, _, err = b.images.Image(ctx, uploaded)
	refused("image", err, imageKey("snap1"))
	dst := filepath.Join(b.dir, "pause-sb1")
	_, err = b.images.TakeOver(ctx, "sb1", dst)
	refused("take over", err, sandboxKey("sb1"))
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the injected sandbox image was put in place: %v", err)
	}
}

// A second snapshot of a sandbox is uploaded as what changed since the
// first: its record names the first as the parent it shares pages with. A
// snapshot that replaces another by name shares that one's pages, whose
// objects go once it is up.
func TestSnapshotsShareTheirPages(t *testing.T) {
	srv := s3test.Start(t)
	a := newNode(t, srv, "a", nil)
	ctx := context.Background()
	rootfs := filepath.Join(a.dir, "templates", "img", "rootfs")
	writeFile(t, filepath.Join(rootfs, "etc", "os-release"), []byte("ID=test\n"))
	memory := make([]byte, 8<<20)
	rand.Read(memory)
	snapshot := func(id, source string, replaces *store.Template) *store.Template {
		t.Helper()
		image := filepath.Join(a.dir, "images", id)
		writeFile(t, filepath.Join(image, "pages.img"), memory)
		tpl := &store.Template{ID: id, Name: id, Kind: store.KindSnapshot, RootfsPath: rootfs,
			ImageDir: image, SourceSandbox: source, CreatedAt: time.Now()}
		if err := a.images.Share(tpl); err != nil {
			t.Fatal(err)
		}
		if replaces != nil {
			tpl.Name = replaces.Name
			if _, err := a.db.ReplaceTemplate(ctx, tpl); err != nil {
				t.Fatal(err)
			}
		} else if err := a.db.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
		a.images.Upload(tpl, "", replaces)
		deadline := time.Now().Add(time.Minute)
		for {
			got, err := a.db.GetTemplate(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if got.Upload == store.UploadUploaded {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not uploaded: %+v", id, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := snapshot("snap1", "sb1", nil)
	if first.ImageStats.Parent != "" || first.ImageStats.NewBytes < 8<<20 || first.ImageStats.Bytes != 8<<20 {
		t.Fatalf("first snapshot: %+v", first.ImageStats)
	}
	rand.Read(memory[1<<20 : 2<<20]) // 1 MiB changed
	second := snapshot("snap2", "sb1", nil)
	if second.ImageStats.Parent != "snap1" || second.ImageStats.NewBytes > 3<<19 || second.ImageStats.Bytes != 8<<20 {
		t.Fatalf("second snapshot: %+v; want snap1 as parent and about 1 MiB stored", second.ImageStats)
	}

	// A checkpoint that takes snap2's name (as a template rebuilt under
	// its name does): snap2 is its parent, and is gone from the store once
	// it is up.
	rand.Read(memory[3<<20 : 4<<20])
	third := snapshot("snap3", "sb2", second)
	if third.ImageStats.Parent != "snap2" || third.ImageStats.NewBytes > 3<<19 {
		t.Fatalf("replacing snapshot: %+v; want snap2 as parent and about 1 MiB stored", third.ImageStats)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		_, err := a.images.cfg.Store.Stat(ctx, imageKey("snap2"))
		if errors.Is(err, objectstore.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced snapshot's image is still in the store (%v)", err)
		}
	}
	if _, err := a.images.cfg.Store.Stat(ctx, imageKey("snap3")); err != nil {
		t.Fatalf("the replacing snapshot's image: %v", err)
	}

	// The first snapshot of another sandbox whose origin is not known (an
	// upload queued again at a start): the newest older checkpoint over
	// the same root filesystem stands in for it.
	rand.Read(memory[5<<20 : 6<<20])
	fourth := snapshot("snap4", "sb3", nil)
	if fourth.ImageStats.Parent != "snap3" || fourth.ImageStats.NewBytes > 3<<19 {
		t.Fatalf("snapshot of unknown origin: %+v; want snap3 as parent and about 1 MiB stored", fourth.ImageStats)
	}
}

// A node that is not its cluster's collector leaves garbage alone; the
// collector removes it.
func TestOnlyTheCollectorCollects(t *testing.T) {
	srv := s3test.Start(t)
	var mine atomic.Bool
	var asked atomic.Int32
	a := newNode(t, srv, "a", nil, func(c *Config) {
		c.GCInterval, c.GCGrace = 20*time.Millisecond, time.Millisecond
		c.AllTemplates = func(context.Context) ([]*store.Template, error) { return nil, nil }
		c.AllSandboxes = func(context.Context) ([]*store.Sandbox, error) { return nil, nil }
		c.Collects = func(context.Context) (bool, error) {
			asked.Add(1)
			return mine.Load(), nil
		}
	})
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "orphan")
	writeFile(t, filepath.Join(dir, "pages.img"), []byte("nobody's"))
	if _, err := a.images.cfg.Store.Put(ctx, imageKey("orphan"), dir); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); asked.Load() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node never asked whether it collects")
		}
	}
	if _, err := a.images.cfg.Store.Stat(ctx, imageKey("orphan")); err != nil {
		t.Fatalf("a node that is not the collector collected: %v", err)
	}
	mine.Store(true)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		_, err := a.images.cfg.Store.Stat(ctx, imageKey("orphan"))
		if errors.Is(err, objectstore.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector left the garbage: %v", err)
		}
	}
}
