package objectstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

func TestParseURLAndEnv(t *testing.T) {
	env := map[string]string{
		"AWS_ENDPOINT_URL":      "http://general:1",
		"AWS_DEFAULT_REGION":    "eu-west-1",
		"AWS_ACCESS_KEY_ID":     "id",
		"AWS_SECRET_ACCESS_KEY": "secret",
	}
	tests := []struct {
		url            string
		extra          map[string]string
		bucket, prefix string
		endpoint       string
		region         string
		wantErr        bool
	}{
		{url: "s3://images", bucket: "images", endpoint: "http://general:1", region: "eu-west-1"},
		{url: "s3://images/a/b/", bucket: "images", prefix: "a/b", endpoint: "http://general:1", region: "eu-west-1"},
		{url: "s3://images/p", extra: map[string]string{"AWS_ENDPOINT_URL_S3": "http://s3only:2", "AWS_REGION": "us-west-2"},
			bucket: "images", prefix: "p", endpoint: "http://s3only:2", region: "us-west-2"},
		{url: "http://images/p", wantErr: true},
		{url: "s3:///p", wantErr: true},
		{url: "s3://u:p@images/p", wantErr: true},
		{url: "s3://images/p?x=1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			getenv := func(k string) string {
				if v, ok := tt.extra[k]; ok {
					return v
				}
				return env[k]
			}
			cfg, err := ConfigFromEnv(tt.url, getenv)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ConfigFromEnv(%q) = %+v, want error", tt.url, cfg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Bucket != tt.bucket || cfg.Prefix != tt.prefix || cfg.Endpoint != tt.endpoint || cfg.Region != tt.region ||
				cfg.AccessKeyID != "id" || cfg.SecretAccessKey != "secret" {
				t.Fatalf("got %+v", cfg)
			}
		})
	}
}

func TestValidKey(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"snapshots/abc-1", true},
		{"templates/base/v1.2_x", true},
		{"a", true},
		{"", false},
		{"/a", false},
		{"a/", false},
		{"a//b", false},
		{"a/../b", false},
		{"./a", false},
		{"a/@manifest.json", false},
		{"a b", false},
	}
	for _, tt := range tests {
		if err := ValidKey(tt.key); (err == nil) != tt.ok {
			t.Errorf("ValidKey(%q) = %v, want ok=%v", tt.key, err, tt.ok)
		}
	}
}

// buildTree makes a directory tree with the cases an image has: nested and
// read-only directories, modes with setuid and sticky bits, empty files,
// symlinks (relative, absolute, dangling), a hard link, a fifo and a large
// file that is mostly holes with data in between.
func buildTree(t testing.TB, root string, large bool) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc/conf.d"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(root, "tmp"), os.ModeSticky|0o777))
	must(os.WriteFile(filepath.Join(root, "etc/conf.d/app.conf"), []byte("key = value\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "etc/secret"), []byte("s3cr3t"), 0o600))
	must(os.WriteFile(filepath.Join(root, "empty"), nil, 0o644))
	must(os.WriteFile(filepath.Join(root, "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Chmod(filepath.Join(root, "tool"), os.ModeSetuid|0o755))
	must(os.Symlink("conf.d/app.conf", filepath.Join(root, "etc/link")))
	must(os.Symlink("/nonexistent/target", filepath.Join(root, "dangling")))
	must(os.Link(filepath.Join(root, "etc/secret"), filepath.Join(root, "secret-hardlink")))
	must(syscall.Mkfifo(filepath.Join(root, "fifo"), 0o640))
	if os.Geteuid() == 0 {
		// Root filesystems have device nodes and files of other owners.
		must(os.Mkdir(filepath.Join(root, "dev"), 0o755))
		must(syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		must(os.Lchown(filepath.Join(root, "etc/secret"), 1234, 5678))
		must(os.Lchown(filepath.Join(root, "etc/link"), 4321, 8765))
	}
	if large {
		// A memory image: 64 MiB with 1 MiB of random data every 8 MiB
		// and holes between, plus 12 MiB of random pages so that the
		// stream spans several multipart parts.
		f, err := os.Create(filepath.Join(root, "pages.img"))
		must(err)
		must(f.Truncate(64 << 20))
		chunk := make([]byte, 1<<20)
		for i := range 8 {
			for j := range chunk {
				chunk[j] = byte(i*31 + j*7)
			}
			_, err := f.WriteAt(chunk, int64(i)*(8<<20))
			must(err)
		}
		must(f.Close())
		writeRandom(t, filepath.Join(root, "random.bin"), 12<<20, 1)
	}
	must(os.MkdirAll(filepath.Join(root, "ro/sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "ro/sub/file"), []byte("x"), 0o444))
	must(os.Chmod(filepath.Join(root, "ro/sub"), 0o555))
	must(os.Chmod(filepath.Join(root, "ro"), 0o500))
	old := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	must(os.Chtimes(filepath.Join(root, "etc/conf.d/app.conf"), old, old))
	must(os.Chtimes(filepath.Join(root, "etc/conf.d"), old, old))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "roundtrip"))
	put := func(ctx context.Context, key, dir string) (Manifest, error) { return store.Put(ctx, key, dir) }
	putImage := func(ctx context.Context, key, dir string) (Manifest, error) {
		return store.PutImage(ctx, key, dir, nil)
	}
	tests := []struct {
		name  string
		large bool
		put   func(ctx context.Context, key, dir string) (Manifest, error)
	}{
		{"small-single-put", false, put},
		{"large-multipart", true, put},
		{"small-chunked", false, putImage},
		{"large-chunked", true, putImage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			src := filepath.Join(t.TempDir(), "src")
			buildTree(t, src, tt.large)
			want := snapshotTree(t, src)
			key := "snapshots/" + tt.name
			m, err := tt.put(ctx, key, src)
			if err != nil {
				t.Fatal(err)
			}
			if m.Files != int64(len(want)) || !strings.HasPrefix(m.Digest, "sha256:") {
				t.Fatalf("manifest %+v for %d entries", m, len(want))
			}
			st, err := store.Stat(ctx, key)
			if err != nil || !reflect.DeepEqual(st, m) {
				t.Fatalf("Stat = %+v, %v; want %+v", st, err, m)
			}
			dst := filepath.Join(t.TempDir(), "dst")
			if _, err := store.Get(ctx, key, m.Digest, dst); err != nil {
				t.Fatal(err)
			}
			compareTrees(t, want, snapshotTree(t, dst))
			if tt.large {
				var st syscall.Stat_t
				if err := syscall.Stat(filepath.Join(dst, "pages.img"), &st); err != nil {
					t.Fatal(err)
				}
				if st.Blocks*512 > 16<<20 {
					t.Errorf("pages.img occupies %d bytes on disk; holes were filled", st.Blocks*512)
				}
				if stored := max(m.Size, m.NewBytes); stored >= m.Bytes/2 {
					t.Errorf("stored %d bytes for %d bytes of files: zero pages not compressed", stored, m.Bytes)
				}
			}
			// A second Get into an existing path is refused.
			if _, err := store.Get(ctx, key, m.Digest, dst); err == nil {
				t.Fatal("Get over an existing directory succeeded")
			}
		})
	}
}

func TestOpenCreatesBucket(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	raw := srv.Client()
	bucket := "created-by-open"
	if _, err := raw.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err == nil {
		t.Fatal("bucket exists before Open")
	}
	openStore(t, testConfig(srv, bucket))
	if _, err := raw.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("bucket after Open: %v", err)
	}
	// Opening again finds it.
	openStore(t, testConfig(srv, bucket))
}

func TestCorruptObjectRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "corrupt"))
	raw := srv.Client()
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, true)
	tests := []struct {
		name   string
		damage func([]byte) []byte // nil: delete the data object
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }},
		{"one-byte-short", func(b []byte) []byte { return b[:len(b)-1] }},
		{"flipped-byte", func(b []byte) []byte { c := bytes.Clone(b); c[len(c)/3] ^= 0x40; return c }},
		{"flipped-last-byte", func(b []byte) []byte { c := bytes.Clone(b); c[len(c)-1] ^= 1; return c }},
		{"extended", func(b []byte) []byte { return append(bytes.Clone(b), 0) }},
		{"data-missing", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "snapshots/" + tt.name
			m, err := store.Put(ctx, key, src)
			if err != nil {
				t.Fatal(err)
			}
			name := aws.String(store.dataKey(key))
			if tt.damage == nil {
				if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("corrupt"), Key: name}); err != nil {
					t.Fatal(err)
				}
			} else {
				out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("corrupt"), Key: name})
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(out.Body)
				out.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				b = tt.damage(b)
				if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("corrupt"), Key: name,
					Body: bytes.NewReader(b), ContentLength: aws.Int64(int64(len(b)))}); err != nil {
					t.Fatal(err)
				}
			}
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			_, err = store.Get(ctx, key, m.Digest, dst)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Get of a damaged object: %v, want ErrCorrupt", err)
			}
			left, _ := os.ReadDir(parent)
			if len(left) != 0 {
				t.Fatalf("Get left %v behind", left)
			}
		})
	}
}

func TestListDelete(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "listdelete"))
	ctx := testCtx(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"snapshots/a", "snapshots/b", "snapshots/a/child", "templates/t"} {
		if _, err := store.Put(ctx, k, src); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(prefix string) []string {
		t.Helper()
		es, err := store.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Key)
		}
		slices.Sort(out)
		return out
	}
	if got, want := keys("snapshots/"), []string{"snapshots/a", "snapshots/a/child", "snapshots/b"}; !slices.Equal(got, want) {
		t.Fatalf("List(snapshots/) = %v, want %v", got, want)
	}
	if err := store.Delete(ctx, "snapshots/a"); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, "snapshots/never"); err != nil {
		t.Fatalf("Delete of a missing image: %v", err)
	}
	if got, want := keys(""), []string{"snapshots/a/child", "snapshots/b", "templates/t"}; !slices.Equal(got, want) {
		t.Fatalf("List after Delete = %v, want %v", got, want)
	}
	if _, err := store.Get(ctx, "snapshots/a", "sha256:"+strings.Repeat("0", 64), filepath.Join(t.TempDir(), "x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a deleted image: %v, want ErrNotFound", err)
	}
}

func TestGC(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "gc-test")
	store := openStore(t, cfg)
	ctx := testCtx(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"live/1", "dead/1", "dead/2"} {
		if _, err := store.Put(ctx, k, src); err != nil {
			t.Fatal(err)
		}
	}
	// An upload in progress: its parts are not objects yet.
	raw := srv.Client()
	up, err := raw.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("gc-test"), Key: aws.String(store.dataKey("inflight/1"))})
	if err != nil {
		t.Fatal(err)
	}
	live := func(k string) bool { return strings.HasPrefix(k, "live/") }

	// Everything is younger than the grace period: nothing goes.
	st, err := store.GC(ctx, live, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if st != (GCStats{}) {
		t.Fatalf("GC of young objects removed %+v", st)
	}
	// Two hours later they are old.
	later := cfg
	later.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	st, err = openStore(t, later).GC(ctx, live, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := (GCStats{Images: 2, Objects: 4, Uploads: 1}); st != want {
		t.Fatalf("GC = %+v, want %+v", st, want)
	}
	es, err := store.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Key != "live/1" {
		t.Fatalf("after GC: %+v, want live/1 only", es)
	}
	if _, err := raw.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String("gc-test"), Key: aws.String(store.dataKey("inflight/1")), UploadId: up.UploadId}); err == nil {
		t.Fatal("old multipart upload not aborted")
	}
}

// Whoever can write the bucket can replace an image together with its
// manifest, consistently. Get checks the data against the digest recorded
// at the upload (outside the bucket), so the replacement is refused, by
// Get and by the cache, and nothing of it is left on disk.
func TestRewrittenImageRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "rewritten"))
	// The bucket writer: its own client, the same bucket and prefix.
	writer := openStore(t, testConfig(srv, "rewritten"))
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	writeRandom(t, filepath.Join(src, "pages.img"), 1<<20, 1)
	injected := filepath.Join(t.TempDir(), "injected")
	if err := os.Mkdir(injected, 0o755); err != nil {
		t.Fatal(err)
	}
	writeRandom(t, filepath.Join(injected, "pages.img"), 1<<20, 2)

	const key = "templates/snap"
	m, err := store.Put(ctx, key, src)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := writer.Put(ctx, key, injected)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := store.Stat(ctx, key); err != nil || st.Digest != forged.Digest {
		t.Fatalf("the bucket's manifest is not the forged one: %+v %v", st, err)
	}

	parent := t.TempDir()
	_, err = store.Get(ctx, key, m.Digest, filepath.Join(parent, "dst"))
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
		t.Fatalf("Get of a rewritten image: %v, want ErrCorrupt naming %s", err, key)
	}
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Fatalf("Get left %v behind", left)
	}
	if _, err := store.Get(ctx, key, "", filepath.Join(parent, "dst")); !errors.Is(err, ErrNoDigest) {
		t.Fatalf("Get without a digest: %v, want ErrNoDigest", err)
	}

	// The data alone replaced, the manifest left as uploaded.
	m2, err := store.Put(ctx, key, src)
	if err != nil {
		t.Fatal(err)
	}
	forgedData := filepath.Join(t.TempDir(), "data")
	if _, err := writer.Put(ctx, "templates/other", injected); err != nil {
		t.Fatal(err)
	}
	raw := srv.Client()
	out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("rewritten"),
		Key: aws.String(store.dataKey("templates/other"))})
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("rewritten"),
		Key: aws.String(store.dataKey(key)), Body: bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data)))}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, key, m2.Digest, forgedData); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get of replaced data under the uploaded manifest: %v, want ErrCorrupt", err)
	}

	// A cached copy is used only for the digest it was checked against.
	cache, err := OpenCache(t.TempDir(), 1<<30, store, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	m3, err := store.Put(ctx, key, src)
	if err != nil {
		t.Fatal(err)
	}
	h, err := cache.Acquire(ctx, key, m3.Digest)
	if err != nil {
		t.Fatal(err)
	}
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(h.Path(), "pages.img"))
	h.Release()
	again, err := writer.Put(ctx, key, injected)
	if err != nil {
		t.Fatal(err)
	}
	h, err = cache.Acquire(ctx, key, again.Digest)
	if err != nil {
		t.Fatalf("a new upload's digest: %v", err)
	}
	h.Release()
	if _, err := cache.Acquire(ctx, key, m3.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("cache acquire of a rewritten image: %v, want ErrCorrupt", err)
	}
}
