package objectstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func TestIndexEncoding(t *testing.T) {
	t.Parallel()
	ix := &chunkIndex{
		skeleton: []byte("headers"),
		packs: []packRef{{digest: [32]byte{1}, raw: 3 * pageSize, stored: 200, hashes: [32]byte{3}},
			{digest: [32]byte{2}, raw: pageSize, stored: 70, hashes: [32]byte{4}}},
		// Runs: slots 0 and 1 of pack 1, zeros, then single pages.
		pages: []pageRef{{pack: 1, off: 0}, {pack: 1, off: pageSize}, {}, {}, {pack: 2, off: 0}, {pack: 1, off: 2 * pageSize}, {pack: 1, off: 0}},
	}
	data := ix.encode()
	got, err := decodeIndex(data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.skeleton, ix.skeleton) || !slices.Equal(got.packs, ix.packs) || !slices.Equal(got.pages, ix.pages) {
		t.Fatalf("round trip: %+v, want %+v", got, ix)
	}
	bad := map[string][]byte{
		"empty":          nil,
		"wrong magic":    append([]byte("AENVCHK9"), data[len(indexMagic):]...),
		"truncated":      data[:len(data)-1],
		"trailing bytes": append(slices.Clone(data), 0),
	}
	// A page past its pack, and one naming a pack that is not there.
	past := *ix
	past.pages = []pageRef{{pack: 2, off: pageSize}}
	bad["page past its pack"] = past.encode()
	runPast := *ix
	runPast.pages = []pageRef{{pack: 1, off: pageSize}, {pack: 1, off: 2 * pageSize}, {pack: 1, off: 3 * pageSize}}
	bad["run past its pack"] = runPast.encode()
	unknown := *ix
	unknown.pages = []pageRef{{pack: 3}}
	bad["unknown pack"] = unknown.encode()
	shortPack := *ix
	shortPack.packs = []packRef{{digest: [32]byte{1}, raw: 3 * pageSize, stored: 3 * hashSize}}
	shortPack.pages = nil
	bad["pack no larger than its hash list"] = shortPack.encode()
	oddPack := *ix
	oddPack.packs = []packRef{{digest: [32]byte{1}, raw: pageSize + 1, stored: 200}}
	oddPack.pages = nil
	bad["pack not of whole slots"] = oddPack.encode()
	for name, b := range bad {
		if _, err := decodeIndex(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decodeIndex = %v, want ErrCorrupt", name, err)
		}
	}
	// Every truncation fails cleanly (no panic, no huge allocation).
	for i := range data {
		if _, err := decodeIndex(data[:i]); err == nil {
			t.Fatalf("a truncation to %d bytes decoded", i)
		}
	}
}

// memoryImage writes a checkpoint-like tree: pages.img of n random pages
// (seed), a small checkpoint.img, and a hole.
func memoryImage(t testing.TB, dir string, pages [][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if _, err := f.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	// A run of zero pages at the end, as sparse as the source.
	if err := f.Truncate(int64(len(pages)+64) * pageSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte(fmt.Sprintf("kernel state of %d pages", len(pages))), 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomPages(n int, seed uint64) [][]byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 1})
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, pageSize)
		r.Read(out[i])
	}
	return out
}

// changed returns a snapshot later in a sandbox's life: ranges moved (a
// range freed at the start shifts every page after it), a contiguous run
// rewritten and pages written here and there.
func changed(pages [][]byte, seed uint64) (out [][]byte, newBytes int) {
	fresh := randomPages(len(pages), seed)
	out = slices.Clone(pages[3:]) // the layout shifts by three pages
	for i := 100; i < 356; i++ {  // 1 MiB rewritten
		out[i] = fresh[i]
		newBytes += pageSize
	}
	for i := 400; i < len(out); i += 37 { // scattered single pages
		out[i] = fresh[i]
		newBytes += pageSize
	}
	return out, newBytes
}

func TestIncrementalImages(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	transport := newCountingTransport()
	cfg := testConfig(srv, "incremental")
	cfg.HTTPClient = &http.Client{Transport: transport}
	writer := openStore(t, cfg)

	tmp := t.TempDir()
	first := randomPages(4096, 1) // 16 MiB
	memoryImage(t, filepath.Join(tmp, "1"), first)
	m1, err := writer.PutImage(ctx, "snapshots/1", filepath.Join(tmp, "1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	second, newBytes := changed(first, 2)
	memoryImage(t, filepath.Join(tmp, "2"), second)
	hashReads := transport.count("GET /chunks/")
	m2, err := writer.PutImage(ctx, "snapshots/2", filepath.Join(tmp, "2"),
		[]Parent{{Key: "snapshots/missing", Digest: m1.Digest}, {Key: "snapshots/1", Digest: m1.Digest}})
	if err != nil {
		t.Fatal(err)
	}
	// The writer keeps no packs: it read each of the parent's hash lists
	// (the tail of its pack), one ranged GET a pack.
	if got := transport.count("GET /chunks/") - hashReads; got != len(m1.Packs) {
		t.Errorf("the second Put read %d pack objects, want the %d hash lists of its parent's", got, len(m1.Packs))
	}
	t.Logf("first: %d bytes of files, %d stored; second: %d changed, %d stored, %d shared",
		m1.Bytes, m1.NewBytes, newBytes, m2.NewBytes, m2.SharedBytes)
	if m1.NewBytes < 16<<20 {
		t.Errorf("first image stored %d bytes, less than its 16 MiB of random pages", m1.NewBytes)
	}
	// New pages with their hashes, the index (runs, not a hash a page)
	// and compression's overhead.
	if limit := int64(newBytes) + int64(newBytes)/pageSize*hashSize + 96<<10; m2.NewBytes > limit {
		t.Errorf("second image stored %d bytes for %d changed (limit %d)", m2.NewBytes, newBytes, limit)
	}
	if m2.Parent != "snapshots/1" || m2.SharedBytes < int64(len(second)*pageSize-newBytes) {
		t.Errorf("second image: parent %q, %d bytes shared", m2.Parent, m2.SharedBytes)
	}

	// A node that has the first image fetches only the second's new packs.
	node := cfg
	node.ChunkDir = filepath.Join(tmp, "node-chunks")
	reader := openStore(t, node)
	got1, err := reader.Get(ctx, "snapshots/1", m1.Digest, filepath.Join(tmp, "got1"))
	if err != nil {
		t.Fatal(err)
	}
	equalFiles(t, filepath.Join(tmp, "1", "pages.img"), filepath.Join(tmp, "got1", "pages.img"))
	if got1.Fetched.Packs != len(m1.Packs) {
		t.Errorf("first Get fetched %d packs, want all %d", got1.Fetched.Packs, len(m1.Packs))
	}
	before := transport.count("GET /chunks/")
	got2, err := reader.Get(ctx, "snapshots/2", m2.Digest, filepath.Join(tmp, "got2"))
	if err != nil {
		t.Fatal(err)
	}
	equalFiles(t, filepath.Join(tmp, "2", "pages.img"), filepath.Join(tmp, "got2", "pages.img"))
	compareTrees(t, snapshotTree(t, filepath.Join(tmp, "2")), snapshotTree(t, filepath.Join(tmp, "got2")))
	newPacks := 0
	for _, p := range m2.Packs {
		if !slices.Contains(m1.Packs, p) {
			newPacks++
		}
	}
	gets := transport.count("GET /chunks/") - before
	if got2.Fetched.Packs != newPacks || gets != newPacks || got2.Fetched.Bytes > m2.NewBytes {
		t.Errorf("second Get fetched %d packs (%d bytes) in %d GETs; want the %d new ones", got2.Fetched.Packs, got2.Fetched.Bytes, gets, newPacks)
	}
	// The writer's own node keeps what it uploaded: nothing to fetch.
	own := cfg
	own.ChunkDir = filepath.Join(tmp, "writer-chunks")
	ownStore := openStore(t, own)
	if _, err := ownStore.PutImage(ctx, "snapshots/3", filepath.Join(tmp, "2"), nil); err != nil {
		t.Fatal(err)
	}
	got3, err := ownStore.Get(ctx, "snapshots/3", mustStat(t, ownStore, "snapshots/3").Digest, filepath.Join(tmp, "got3"))
	if err != nil {
		t.Fatal(err)
	}
	if got3.Fetched.Packs != 0 {
		t.Errorf("the writer fetched %d packs of its own upload", got3.Fetched.Packs)
	}
}

func mustStat(t testing.TB, s *Store, key string) Manifest {
	t.Helper()
	m, err := s.Stat(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCorruptChunksRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "corrupt-chunks")
	tmp := t.TempDir()
	cfg.ChunkDir = filepath.Join(tmp, "chunks")
	store := openStore(t, cfg)
	memoryImage(t, filepath.Join(tmp, "src"), randomPages(5000, 3))
	m, err := store.PutImage(ctx, "snapshots/c", filepath.Join(tmp, "src"), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := srv.Client()
	pack := func(name string) *string { return aws.String(store.packKey(name)) }
	fresh := func() *Store { // a node without the packs
		c := cfg
		c.ChunkDir = t.TempDir()
		return openStore(t, c)
	}
	tests := []struct {
		name  string
		spoil func()
		mend  func()
	}{
		{"a pack altered in the bucket", func() {
			if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: pack(m.Packs[0]), Body: strings.NewReader("not the pack")}); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"a pack missing from the bucket", func() {
			if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: pack(m.Packs[1])}); err != nil {
				t.Fatal(err)
			}
		}, nil},
	}
	for _, tt := range tests {
		tt.spoil()
		dst := filepath.Join(tmp, "dst")
		if _, err := fresh().Get(ctx, "snapshots/c", m.Digest, dst); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Get = %v, want ErrCorrupt", tt.name, err)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a failed Get left %s", tt.name, dst)
		}
	}

	// A pack damaged on the node's own disk is fetched again (the node
	// still has good copies of the two spoiled in the bucket).
	local := store.localPack(m.Packs[2])
	if err := os.WriteFile(local, []byte("bit rot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, "snapshots/c", m.Digest, filepath.Join(tmp, "mended")); err != nil {
		t.Fatalf("Get over a damaged local pack: %v", err)
	}
	equalFiles(t, filepath.Join(tmp, "src", "pages.img"), filepath.Join(tmp, "mended", "pages.img"))
	// Damaged here and missing there: the Get fails cleanly, never with
	// wrong memory, and the damaged copy is not kept.
	if err := os.WriteFile(local, []byte("bit rot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: pack(m.Packs[2])}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, "snapshots/c", m.Digest, filepath.Join(tmp, "dst")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get over a corrupt local pack missing in the bucket = %v, want ErrCorrupt", err)
	}
	if _, err := os.Stat(local); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the corrupt local pack was kept")
	}
	// A digest the index does not have is refused before any pack.
	if _, err := store.Get(ctx, "snapshots/c", "sha256:"+strings.Repeat("ab", 32), filepath.Join(tmp, "dst")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get with another digest = %v, want ErrCorrupt", err)
	}
}

// TestChunkGCChains deletes the images of a chain (each a child of the
// previous) in every order; after each deletion and collection, every
// remaining image restores intact, and when all are gone no pack is left.
func TestChunkGCChains(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	orders := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for n, order := range orders {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			var clock atomic.Int64
			clock.Store(time.Now().Add(time.Hour).UnixNano())
			cfg := testConfig(srv, "gc-chains")
			cfg.Prefix = fmt.Sprintf("order-%d", n)
			cfg.Now = func() time.Time { return time.Unix(0, clock.Load()) }
			store := openStore(t, cfg)
			tmp := t.TempDir()
			pages := randomPages(1024, uint64(10+n))
			var ms []Manifest
			for i := range 3 {
				dir := filepath.Join(tmp, fmt.Sprint("src", i))
				memoryImage(t, dir, pages)
				var parents []Parent
				if i > 0 {
					parents = []Parent{{Key: ms[i-1].Key, Digest: ms[i-1].Digest}}
				}
				m, err := store.PutImage(ctx, fmt.Sprint("snapshots/", i), dir, parents)
				if err != nil {
					t.Fatal(err)
				}
				ms = append(ms, m)
				pages, _ = changed(pages, uint64(100*n+i))
			}
			gone := map[string]bool{}
			live := func(k string) bool { return !gone[k] }
			collect := func() {
				// Collections past the grace: released packs go.
				for range 2 {
					if _, err := store.GC(ctx, live, time.Minute); err != nil {
						t.Fatal(err)
					}
					clock.Add(int64(2 * time.Minute))
				}
			}
			for _, i := range order {
				gone[ms[i].Key] = true
				collect()
				for j, m := range ms {
					if gone[m.Key] {
						continue
					}
					dst := filepath.Join(t.TempDir(), "dst")
					if _, err := store.Get(ctx, m.Key, m.Digest, dst); err != nil {
						t.Fatalf("after deleting %v: image %d: %v", i, j, err)
					}
					equalFiles(t, filepath.Join(tmp, fmt.Sprint("src", j), "pages.img"), filepath.Join(dst, "pages.img"))
				}
			}
			out, err := srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(cfg.Bucket), Prefix: aws.String(cfg.Prefix + "/")})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Contents) != 0 {
				t.Fatalf("%d objects left after every image was deleted, e.g. %s", len(out.Contents), aws.ToString(out.Contents[0].Key))
			}
		})
	}
}

// holdingTransport holds the PUT of one object until released.
type holdingTransport struct {
	base    http.RoundTripper
	suffix  string
	held    chan struct{} // closed when the request arrives
	release chan struct{}
	once    sync.Once
}

func (h *holdingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, h.suffix) {
		h.once.Do(func() { close(h.held) })
		<-h.release
	}
	return h.base.RoundTrip(r)
}

// TestChunkGCSharedDuringPut: a child shares a parent's pack, the parent is
// deleted and a collection runs before the child's manifest is written. The
// pack, unreferenced at that moment, must survive until the child names it.
func TestChunkGCSharedDuringPut(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	for _, byDelete := range []bool{false, true} {
		t.Run(fmt.Sprint("deleted-by-Delete=", byDelete), func(t *testing.T) {
			t.Parallel()
			gcSharedDuringPut(t, srv, byDelete)
		})
	}
}

// gcSharedDuringPut: the parent goes (through Delete, or found dead by the
// collector) while the child's manifest is held.
func gcSharedDuringPut(t *testing.T, srv *s3test.Server, byDelete bool) {
	ctx := testCtx(t)
	hold := &holdingTransport{base: http.DefaultTransport.(*http.Transport).Clone(),
		suffix: "/snapshots/child/" + manifestName, held: make(chan struct{}), release: make(chan struct{})}
	// A real clock: the parent's packs must be past the grace and the
	// child's new ones not. Objects' times have a resolution of a second.
	const grace = 4 * time.Second
	pastGrace := func(since time.Time) { time.Sleep(time.Until(since.Add(grace + 1100*time.Millisecond))) }
	cfg := testConfig(srv, "gc-during-put")
	cfg.Prefix = fmt.Sprint("by-delete-", byDelete)
	cfg.HTTPClient = &http.Client{Transport: hold}
	store := openStore(t, cfg)
	tmp := t.TempDir()
	pages := randomPages(2*packTarget/pageSize, 7) // two packs
	memoryImage(t, filepath.Join(tmp, "parent"), pages)
	parent, err := store.PutImage(ctx, "snapshots/parent", filepath.Join(tmp, "parent"), nil)
	if err != nil {
		t.Fatal(err)
	}
	pastGrace(time.Now())
	// The child has the second half of the parent's pages (its second
	// pack) and a page of its own (a new pack).
	memoryImage(t, filepath.Join(tmp, "child"), pages[len(pages)/2:])
	type result struct {
		m   Manifest
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := store.PutImage(ctx, "snapshots/child", filepath.Join(tmp, "child"), []Parent{{Key: "snapshots/parent", Digest: parent.Digest}})
		done <- result{m, err}
	}()
	select {
	case <-hold.held:
	case r := <-done:
		t.Fatalf("the child's Put ended before its manifest: %v", r.err)
	}
	live := func(k string) bool { return k != "snapshots/parent" }
	wantImages := 1 // found dead and removed by the collector
	if byDelete {
		if err := store.Delete(ctx, "snapshots/parent"); err != nil {
			t.Fatal(err)
		}
		wantImages = 0
	}
	released := time.Now()
	st, err := store.GC(ctx, live, grace)
	if err != nil {
		t.Fatal(err)
	}
	if st.Images != wantImages || st.Packs != 0 {
		t.Fatalf("collection during the child's Put: %+v, want %d image and no pack deleted", st, wantImages)
	}
	close(hold.release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.m.SharedBytes != int64(len(pages)/2*pageSize) {
		t.Fatalf("the child shared %d bytes, want its %d", r.m.SharedBytes, len(pages)/2*pageSize)
	}
	// A grace later the parent's released packs expire: its first pack,
	// which nothing shares, goes; the child's stay.
	pastGrace(released)
	if st, err = store.GC(ctx, live, grace); err != nil {
		t.Fatal(err)
	}
	if st.Packs != 1 {
		t.Fatalf("second collection deleted %d packs, want the parent's first, which nothing shares", st.Packs)
	}
	if _, err := store.Get(ctx, "snapshots/child", r.m.Digest, filepath.Join(tmp, "got")); err != nil {
		t.Fatal(err)
	}
	equalFiles(t, filepath.Join(tmp, "child", "pages.img"), filepath.Join(tmp, "got", "pages.img"))
	if keys := objectKeysUnder(t, srv, cfg, "images/snapshots/parent/"); len(keys) != 0 {
		t.Fatalf("objects of the parent left: %v", keys)
	}
}

// objectKeysUnder lists the keys under cfg's prefix and sub.
func objectKeysUnder(t testing.TB, srv *s3test.Server, cfg Config, sub string) []string {
	t.Helper()
	out, err := srv.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(cfg.Bucket), Prefix: aws.String(cfg.Prefix + "/" + sub)})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

// TestChunkGCConcurrentPuts runs collections while children of an image are
// written (a check for the race detector): every child restores.
func TestChunkGCConcurrentPuts(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	store := openStore(t, testConfig(srv, "gc-concurrent"))
	tmp := t.TempDir()
	pages := randomPages(512, 8)
	memoryImage(t, filepath.Join(tmp, "parent"), pages)
	parent, err := store.PutImage(ctx, "snapshots/parent", filepath.Join(tmp, "parent"), nil)
	if err != nil {
		t.Fatal(err)
	}
	gcCtx, stop := context.WithCancel(ctx)
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		for gcCtx.Err() == nil {
			if _, err := store.GC(gcCtx, func(string) bool { return true }, time.Hour); err != nil && gcCtx.Err() == nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	children := make([]Manifest, 4)
	for i := range children {
		wg.Go(func() {
			dir := filepath.Join(tmp, fmt.Sprint("child", i))
			child, _ := changed(pages, uint64(20+i))
			memoryImage(t, dir, child)
			m, err := store.PutImage(ctx, fmt.Sprint("snapshots/child", i), dir, []Parent{{Key: "snapshots/parent", Digest: parent.Digest}})
			if err != nil {
				t.Error(err)
			}
			children[i] = m
		})
	}
	wg.Wait()
	stop()
	<-gcDone
	for i, m := range children {
		dst := filepath.Join(t.TempDir(), "dst")
		if _, err := store.Get(ctx, m.Key, m.Digest, dst); err != nil {
			t.Fatalf("%s: %v", m.Key, err)
		}
		equalFiles(t, filepath.Join(tmp, fmt.Sprint("child", i), "pages.img"), filepath.Join(dst, "pages.img"))
	}
}

// TestNewerFormatRefused: an image a newer release wrote in a format this
// one does not know is refused by name (not as malformed), and the
// collector, unable to know what it references, deletes none of the packs
// while abandoned uploads are still cleaned up.
func TestNewerFormatRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "newer-format")
	cfg.Now = func() time.Time { return time.Now().Add(time.Hour) } // every object past the grace
	tmp := t.TempDir()
	store := openStore(t, cfg)
	memoryImage(t, filepath.Join(tmp, "src"), randomPages(600, 7))
	if _, err := store.PutImage(ctx, "snapshots/old", filepath.Join(tmp, "src"), nil); err != nil {
		t.Fatal(err)
	}
	m, err := store.PutImage(ctx, "snapshots/new", filepath.Join(tmp, "src"), []Parent{{Key: "snapshots/old", Digest: mustStat(t, store, "snapshots/old").Digest}})
	if err != nil {
		t.Fatal(err)
	}
	// What a newer release could write: same objects, another format.
	m.Format = "chunks-v9"
	m.Packs = nil
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(store.manifestKey("snapshots/new")), Body: bytes.NewReader(raw)}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stat(ctx, "snapshots/new"); !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("Stat = %v, want ErrUnsupportedFormat", err)
	}
	if _, err := store.Get(ctx, "snapshots/new", m.Digest, filepath.Join(tmp, "dst")); !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("Get = %v, want ErrUnsupportedFormat", err)
	}
	// An abandoned multipart upload, which the collection must still end.
	up, err := srv.Client().CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(store.dataKey("snapshots/abandoned"))})
	if err != nil {
		t.Fatal(err)
	}
	packsBefore := objectKeysUnder(t, srv, cfg, "chunks/")
	// "old" is dead: its own packs may only go once "new"'s references
	// are known, which they are not.
	st, err := store.GC(ctx, func(k string) bool { return k == "snapshots/new" }, time.Minute)
	if !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("GC = %v, want ErrUnsupportedFormat", err)
	}
	if st.Packs != 0 || !slices.Equal(objectKeysUnder(t, srv, cfg, "chunks/"), packsBefore) {
		t.Fatalf("GC deleted packs (%d) an image of an unknown format may use", st.Packs)
	}
	if st.Uploads != 1 {
		t.Fatalf("GC aborted %d abandoned uploads, want 1", st.Uploads)
	}
	uploads, err := srv.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(cfg.Bucket)})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range uploads.Uploads {
		if aws.ToString(u.UploadId) == aws.ToString(up.UploadId) {
			t.Fatal("the abandoned upload is still open")
		}
	}
}

// TestChunkCacheDebrisTrimmed: temporary files a cut-short write left in
// the chunk cache are removed when the store opens, recent ones kept.
func TestChunkCacheDebrisTrimmed(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	cfg := testConfig(srv, "cache-debris")
	cfg.ChunkDir = t.TempDir()
	old := filepath.Join(cfg.ChunkDir, ".part-123")
	recent := filepath.Join(cfg.ChunkDir, ".part-456")
	for _, p := range []string{old, recent} {
		if err := os.WriteFile(p, []byte("half a pack"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * partDebrisAge)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	openStore(t, cfg)
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Error("an old temporary file was kept")
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("a recent temporary file (a write in progress) was removed: %v", err)
	}
}

// TestAlteredHashListNotShared: a parent pack whose hash list was altered
// in the bucket is not shared (its list no longer matches the digest the
// parent's index pins), and the child image is whole and right.
func TestAlteredHashListNotShared(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "altered-hashes")
	store := openStore(t, cfg) // no chunk cache: hash lists come from the bucket
	tmp := t.TempDir()
	pages := randomPages(3000, 11)
	memoryImage(t, filepath.Join(tmp, "1"), pages)
	m1, err := store.PutImage(ctx, "snapshots/1", filepath.Join(tmp, "1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m1.Packs) < 2 {
		t.Fatalf("want several packs, got %d", len(m1.Packs))
	}
	raw := srv.Client()
	key := aws.String(store.packKey(m1.Packs[0]))
	out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(cfg.Bucket), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	body[len(body)-1] ^= 0xff // the last page's hash
	if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: key, Body: bytes.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
	second, _ := changed(pages, 12)
	memoryImage(t, filepath.Join(tmp, "2"), second)
	m2, err := store.PutImage(ctx, "snapshots/2", filepath.Join(tmp, "2"), []Parent{{Key: "snapshots/1", Digest: m1.Digest}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(m2.Packs, m1.Packs[0]) {
		t.Fatal("the child shares the pack whose hash list was altered")
	}
	if !slices.Contains(m2.Packs, m1.Packs[1]) {
		t.Fatal("the child does not share the parent's intact packs")
	}
	c := cfg
	c.ChunkDir = t.TempDir()
	if _, err := openStore(t, c).Get(ctx, "snapshots/2", m2.Digest, filepath.Join(tmp, "got")); err != nil {
		t.Fatal(err)
	}
	equalFiles(t, filepath.Join(tmp, "2", "pages.img"), filepath.Join(tmp, "got", "pages.img"))
}

// hookTransport runs hook once, before the first request whose method and
// path suffix match.
type hookTransport struct {
	base           http.RoundTripper
	method, suffix string
	hook           func()
	once           sync.Once
}

func (h *hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == h.method && strings.HasSuffix(r.URL.Path, h.suffix) {
		h.once.Do(h.hook)
	}
	return h.base.RoundTrip(r)
}

// TestChunkGCDeletedDuringCollection: a parent is deleted by another
// client after the collector listed it (with its manifest) and before the
// collector reads that manifest; a child sharing its packs has not written
// its manifest yet. The released-packs object came after the listing, so
// this pass must delete no pack.
func TestChunkGCDeletedDuringCollection(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	const grace = 4 * time.Second
	cfg := testConfig(srv, "gc-deleted-during")
	other := openStore(t, cfg)
	hold := &holdingTransport{base: http.DefaultTransport.(*http.Transport).Clone(),
		suffix: "/snapshots/child/" + manifestName, held: make(chan struct{}), release: make(chan struct{})}
	writerCfg := cfg
	writerCfg.HTTPClient = &http.Client{Transport: hold}
	writer := openStore(t, writerCfg)
	collectorCfg := cfg
	collectorCfg.HTTPClient = &http.Client{Transport: &hookTransport{base: http.DefaultTransport.(*http.Transport).Clone(),
		method: http.MethodGet, suffix: "/snapshots/parent/" + manifestName, hook: func() {
			if err := other.Delete(ctx, "snapshots/parent"); err != nil {
				t.Error(err)
			}
		}}}
	collector := openStore(t, collectorCfg)

	tmp := t.TempDir()
	pages := randomPages(2*packTarget/pageSize, 9)
	memoryImage(t, filepath.Join(tmp, "parent"), pages)
	parent, err := writer.PutImage(ctx, "snapshots/parent", filepath.Join(tmp, "parent"), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(grace + 1100*time.Millisecond) // the parent's packs past the grace
	memoryImage(t, filepath.Join(tmp, "child"), pages[len(pages)/2:])
	done := make(chan error, 1)
	var child Manifest
	go func() {
		var err error
		child, err = writer.PutImage(ctx, "snapshots/child", filepath.Join(tmp, "child"), []Parent{{Key: "snapshots/parent", Digest: parent.Digest}})
		done <- err
	}()
	select {
	case <-hold.held:
	case err := <-done:
		t.Fatalf("the child's Put ended before its manifest: %v", err)
	}
	// The parent is dead to the collector, which deletes it but finds its
	// manifest gone (the hook deleted it first).
	st, err := collector.GC(ctx, func(k string) bool { return k != "snapshots/parent" }, grace)
	if !errors.Is(err, errChanged) || st.Packs != 0 {
		t.Fatalf("collection = %+v, %v; want no pack deleted and errChanged", st, err)
	}
	close(hold.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := other.Get(ctx, "snapshots/child", child.Digest, filepath.Join(tmp, "got")); err != nil {
		t.Fatalf("the child after the collection: %v", err)
	}
	equalFiles(t, filepath.Join(tmp, "child", "pages.img"), filepath.Join(tmp, "got", "pages.img"))
}
