package objectstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// lazyRecorder is a LazyFile.Begin that checks the image at the handover
// and records what is written after.
type lazyRecorder struct {
	t    *testing.T
	dst  string
	want map[string]treeEntry // the source tree

	mu       sync.Mutex
	begun    bool
	size     int64
	ranges   [][2]int64
	pages    []bool
	urgentAt int // ranges written before the prioritized range was
	urgent   [2]int64
}

func (l *lazyRecorder) begin(size int64, prioritize func(off, n int64)) (func(off, n int64), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.begun, l.size = true, size
	l.pages = make([]bool, (size+pageSize-1)/pageSize)
	// Every other file is complete; the memory file is there at its size.
	tree := snapshotTree(l.t, l.dst)
	if _, ok := tree["pages.img"]; ok {
		l.t.Error("pages.img under its own name at the handover: a reader not waiting for its ranges would read zeros")
	}
	for name, e := range tree {
		if name == "pages.img"+PartialSuffix {
			if e.size != size {
				l.t.Errorf("pages.img at the handover: %d bytes, want %d", e.size, size)
			}
			continue
		}
		if e != l.want[name] {
			l.t.Errorf("%s at the handover = %+v, want %+v", name, e, l.want[name])
		}
	}
	// A read waits for a range near the end, as a guest's fault would.
	l.urgent = [2]int64{size - 40*pageSize - 100, 3 * pageSize}
	l.urgentAt = -1
	prioritize(l.urgent[0], l.urgent[1])
	return l.written, nil
}

func (l *lazyRecorder) written(off, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if off%pageSize != 0 || n <= 0 || off+n > l.size || (n%pageSize != 0 && off+n != l.size) {
		l.t.Errorf("written(%d, %d): not whole pages of a %d-byte file", off, n, l.size)
		return
	}
	// What is said written is there, as the source has it.
	l.ranges = append(l.ranges, [2]int64{off, n})
	for p := off / pageSize; p < (off+n+pageSize-1)/pageSize; p++ {
		l.pages[p] = true
	}
	if l.urgentAt < 0 {
		done := true
		for p := l.urgent[0] / pageSize; p*pageSize < l.urgent[0]+l.urgent[1]; p++ {
			done = done && l.pages[p]
		}
		if done {
			l.urgentAt = len(l.ranges)
		}
	}
}

// A restore's Get hands the image over before its memory file is written:
// every other file complete, the memory file at its size; then every page
// of it arrives, each said once written, a prioritized range early; the
// image ends as Get's would. A missing pack fails it with nothing left.
func TestGetLazy(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "lazy")
	tmp := t.TempDir()
	cfg.ChunkDir = filepath.Join(tmp, "chunks")
	store := openStore(t, cfg)
	src := filepath.Join(tmp, "src")
	memoryImage(t, src, randomPages(6000, 7))
	if err := os.WriteFile(filepath.Join(src, "pages_meta.img"), []byte("metadata"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := store.PutImage(ctx, "snapshots/lazy", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Packs) < 3 {
		t.Fatalf("image of %d packs; the test needs several", len(m.Packs))
	}
	fresh := func() *Store { // a node without the packs
		c := cfg
		c.ChunkDir = t.TempDir()
		return openStore(t, c)
	}

	want := snapshotTree(t, src)
	dst := filepath.Join(tmp, "dst")
	rec := &lazyRecorder{t: t, dst: dst, want: want}
	if _, err := fresh().GetLazy(ctx, "snapshots/lazy", m.Digest, dst, LazyFile{Name: "pages.img", Begin: rec.begin}); err != nil {
		t.Fatalf("GetLazy: %v", err)
	}
	compareTrees(t, want, snapshotTree(t, dst))
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
	if !rec.begun {
		t.Fatal("Begin was not called")
	}
	for p, ok := range rec.pages {
		if !ok {
			t.Fatalf("page %d of pages.img was never said written", p)
		}
	}
	// The prioritized range came in the first pack written after the zero
	// runs (which are said written at once).
	zeroRuns := 0
	for _, r := range rec.ranges {
		if r[0] >= int64(6000*pageSize) {
			zeroRuns++
		}
	}
	if rec.urgentAt < 0 || rec.urgentAt > zeroRuns+8 {
		t.Errorf("the prioritized range was written after %d of %d ranges (zero runs: %d); want among the first", rec.urgentAt, len(rec.ranges), zeroRuns)
	}

	// An image without the file is fetched whole, Begin not called.
	called := false
	if _, err := fresh().GetLazy(ctx, "snapshots/lazy", m.Digest, filepath.Join(tmp, "other"), LazyFile{Name: "memory.img",
		Begin: func(int64, func(int64, int64)) (func(int64, int64), error) {
			called = true
			return nil, errors.New("no")
		}}); err != nil || called {
		t.Fatalf("GetLazy of an image without the file = %v (Begin called: %v)", err, called)
	}
	compareTrees(t, want, snapshotTree(t, filepath.Join(tmp, "other")))

	// A pack missing from the bucket: the Get fails (after the handover
	// if the pack is the memory file's), and dst is gone.
	if _, err := srv.Client().DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String(store.packKey(m.Packs[len(m.Packs)-1]))}); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(tmp, "broken")
	_, err = fresh().GetLazy(context.Background(), "snapshots/lazy", m.Digest, broken, LazyFile{Name: "pages.img",
		Begin: func(int64, func(int64, int64)) (func(int64, int64), error) {
			return func(int64, int64) {}, nil
		}})
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("GetLazy with a pack missing = %v, want ErrCorrupt", err)
	}
	if _, err := os.Lstat(broken); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed GetLazy left %s", broken)
	}
}

// A memory file whose packs are all on this node's disk already is written
// in the order of its pages: the order a restore's background load reads
// in, each read waiting at the first page not written yet.
func TestGetLazyPacksOnDiskInOrder(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "lazy-order")
	tmp := t.TempDir()
	cfg.ChunkDir = filepath.Join(tmp, "chunks") // the packs stay here as they are put
	store := openStore(t, cfg)
	src := filepath.Join(tmp, "src")
	const pages = 12000
	memoryImage(t, src, randomPages(pages, 5))
	m, err := store.PutImage(ctx, "snapshots/order", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Packs) < 5 {
		t.Fatalf("image of %d packs; the test needs several", len(m.Packs))
	}
	var mu sync.Mutex
	var offs []int64
	dst := filepath.Join(tmp, "dst")
	st, err := store.GetLazy(ctx, "snapshots/order", m.Digest, dst, LazyFile{Name: "pages.img",
		Begin: func(int64, func(off, n int64)) (func(off, n int64), error) {
			return func(off, n int64) {
				mu.Lock()
				defer mu.Unlock()
				if off < pages*pageSize { // not the zero run at the end
					offs = append(offs, off)
				}
			}, nil
		}})
	if err != nil {
		t.Fatalf("GetLazy: %v", err)
	}
	if st.Fetched.Packs != 0 {
		t.Fatalf("%d packs downloaded; the test needs them all on disk", st.Fetched.Packs)
	}
	equalFiles(t, filepath.Join(src, "pages.img"), filepath.Join(dst, "pages.img"))
	if len(offs) < len(m.Packs)-1 || !slices.IsSorted(offs) {
		t.Errorf("the file's pages were written at %v: want ascending, a run or more a pack", offs)
	}
}

// TestEndFirst checks the order the lazy file's packs are downloaded in:
// those holding its last hotEnd bytes of data first (maxHotPacks at most),
// the last of them first, then the rest in the order given.
func TestEndFirst(t *testing.T) {
	const perPack = packTarget / pageSize
	// pagesOf lays out a file: runs of pages, each in one pack (0: zeros).
	pagesOf := func(runs ...[2]int) []pageRef {
		var pages []pageRef
		for _, r := range runs {
			for k := range r[1] {
				pages = append(pages, pageRef{pack: uint32(r[0]), off: uint32(k * pageSize)})
			}
		}
		return pages
	}
	tests := []struct {
		name   string
		pages  []pageRef
		first  int // the lazy file's first page in the index
		queued []uint32
		want   []uint32
	}{{
		name:   "the last 8 MiB span two packs",
		pages:  pagesOf([2]int{1, perPack}, [2]int{2, perPack}, [2]int{3, perPack / 2}),
		queued: []uint32{1, 2, 3},
		want:   []uint32{3, 2, 1},
	}, {
		name:   "the last pack holds the last 8 MiB",
		pages:  pagesOf([2]int{1, perPack}, [2]int{2, perPack}, [2]int{3, perPack}),
		queued: []uint32{1, 2, 3},
		want:   []uint32{3, 1, 2},
	}, {
		name:   "zero pages at the end are no pack's",
		pages:  pagesOf([2]int{1, perPack}, [2]int{2, perPack}, [2]int{0, perPack}),
		queued: []uint32{1, 2},
		want:   []uint32{2, 1},
	}, {
		name:   "a pack on disk is not queued",
		pages:  pagesOf([2]int{1, perPack}, [2]int{2, perPack / 2}, [2]int{3, perPack / 2}),
		queued: []uint32{1, 2},
		want:   []uint32{2, 1},
	}, {
		name:   "nothing of the end queued",
		pages:  pagesOf([2]int{1, perPack}, [2]int{2, perPack}),
		queued: []uint32{1},
		want:   []uint32{1},
	}, {
		name:   "a pack at the end and the start is moved, once",
		pages:  pagesOf([2]int{1, 10}, [2]int{2, perPack}, [2]int{1, 10}),
		queued: []uint32{1, 2},
		want:   []uint32{1, 2},
	}, {
		name: "the file after another: its own end counts",
		// The index's first pages are another file's (pack 4).
		pages:  pagesOf([2]int{4, 100}, [2]int{1, perPack}, [2]int{2, perPack}, [2]int{3, 1}),
		first:  100,
		queued: []uint32{1, 2, 3},
		want:   []uint32{3, 2, 1},
	}, {
		name: "the end spread over many packs: the last two",
		pages: pagesOf([2]int{1, perPack}, [2]int{2, 100}, [2]int{3, 100}, [2]int{4, 100},
			[2]int{5, 100}),
		queued: []uint32{1, 2, 3, 4, 5},
		want:   []uint32{5, 4, 1, 2, 3},
	}, {
		name:   "a file smaller than hotEnd: all of it, from its end",
		pages:  pagesOf([2]int{1, 10}, [2]int{2, 10}),
		queued: []uint32{1, 2},
		want:   []uint32{2, 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count := len(tt.pages) - tt.first
			l := &lazyFill{first: tt.first, count: count, size: int64(count)*pageSize - 100}
			got := l.endFirst(&chunkIndex{pages: tt.pages}, slices.Clone(tt.queued))
			if !slices.Equal(got, tt.want) {
				t.Errorf("endFirst(%v) = %v, want %v", tt.queued, got, tt.want)
			}
		})
	}
}
