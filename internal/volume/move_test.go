package volume

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/roottest"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
)

// twoNodes are the volume services of nodes a and b of one cluster
// (a throwaway PostgreSQL), each over a directory of its own.
func twoNodes(t *testing.T) (a, b *Service, dbA, dbB *postgres.Store) {
	t.Helper()
	roottest.Require(t) // owners are kept across a move
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	open := func(node string) (*Service, *postgres.Store) {
		db, err := postgres.OpenNode(ctx, dsn, node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := NewService(ctx, db, filepath.Join(t.TempDir(), "volumes"), node, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s, db
	}
	a, dbA = open("a")
	b, dbB = open("b")
	if err := dbA.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	return a, b, dbA, dbB
}

// move runs the nodes' side of a move of id from a to b, begun in the
// records, as a gateway does.
func move(ctx context.Context, t *testing.T, a, b *Service, db *postgres.Store, id string) (*store.Volume, error) {
	t.Helper()
	token, _, err := db.BeginVolumeMove(ctx, id, a.nodeID, b.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(a.Export(ctx, id, pw, true)) }()
	v, err := b.Import(ctx, id, token, pr)
	pr.CloseWithError(errors.New("import ended"))
	return v, err
}

type entryFacts struct {
	mode     fs.FileMode
	uid, gid uint32
	mtime    time.Time
	content  string // a file's bytes, a link's target
}

// facts describes the tree under dir.
func facts(t *testing.T, dir string) map[string]entryFacts {
	t.Helper()
	out := map[string]entryFacts{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		f := entryFacts{mode: info.Mode(), uid: st.Uid, gid: st.Gid}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			f.content, _ = os.Readlink(p)
		case info.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			f.content, f.mtime = string(b), info.ModTime()
		case rel != ".":
			f.mtime = info.ModTime()
		}
		out[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMoveBetweenNodes(t *testing.T) {
	a, b, dbA, _ := twoNodes(t)
	ctx := context.Background()
	v, err := a.Create(ctx, "lab", "repo", 0)
	if err != nil {
		t.Fatal(err)
	}
	// A tree with owners, modes, times, a link, a hard link, a sparse
	// file, a setgid directory and a FIFO (not a volume's content: left
	// behind).
	src := a.dataDir(v.ID)
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "src/pkg"), 0o755))
	must(os.WriteFile(filepath.Join(src, "src/pkg/main.go"), []byte("package main\n"), 0o640))
	must(os.Chown(filepath.Join(src, "src/pkg/main.go"), 1000, 1001))
	must(os.Chtimes(filepath.Join(src, "src/pkg/main.go"), old, old))
	must(os.Symlink("pkg/main.go", filepath.Join(src, "src/link")))
	must(os.Mkdir(filepath.Join(src, "shared"), 0o770))
	must(os.Chmod(filepath.Join(src, "shared"), 0o770|fs.ModeSetgid))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o600))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	must(os.Link(filepath.Join(src, "src/pkg/main.go"), filepath.Join(src, "hardlink")))
	sparse, err := os.Create(filepath.Join(src, "sparse.img"))
	must(err)
	must(sparse.Truncate(64 << 20))
	_, err = sparse.WriteAt([]byte("tail"), 64<<20-4)
	must(err)
	must(sparse.Close())
	must(os.Chtimes(filepath.Join(src, "src"), old, old))
	want := facts(t, src)
	delete(want, "fifo")

	moved, err := move(ctx, t, a, b, dbA, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if moved.NodeID != "b" || moved.Token != v.Token {
		t.Fatalf("moved: %+v", moved)
	}
	got := facts(t, b.dataDir(v.ID))
	for name, w := range want {
		if g, ok := got[name]; !ok || g.mode != w.mode || g.uid != w.uid || g.gid != w.gid || g.content != w.content ||
			!g.mtime.Equal(w.mtime) {
			t.Errorf("%s: moved %+v (found %v), want %+v", name, g, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("moved %d entries, want %d: %v", len(got), len(want), got)
	}
	var file, link, img syscall.Stat_t
	must(syscall.Stat(filepath.Join(b.dataDir(v.ID), "src/pkg/main.go"), &file))
	must(syscall.Stat(filepath.Join(b.dataDir(v.ID), "hardlink"), &link))
	must(syscall.Stat(filepath.Join(b.dataDir(v.ID), "sparse.img"), &img))
	if file.Ino != link.Ino {
		t.Error("a hard link became a copy")
	}
	if img.Size != 64<<20 || img.Blocks*512 > 1<<20 {
		t.Errorf("a sparse file: %d bytes, %d allocated; want its hole kept", img.Size, img.Blocks*512)
	}
	if _, err := os.Stat(filepath.Join(b.dir, v.ID, pendingMarker)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the moved volume is still pending: %v", err)
	}
	// Node b serves it; node a no longer does, and drops its files.
	if _, _, err := b.HostPath(ctx, v.ID); err != nil {
		t.Errorf("node b's path: %v", err)
	}
	if _, _, err := a.HostPath(ctx, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("node a's path of a volume moved away: %v", err)
	}
	if err := b.DropMoved(ctx, v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("node b dropping its own volume: %v, want ErrConflict", err)
	}
	must(a.DropMoved(ctx, v.ID))
	if _, err := os.Stat(filepath.Join(a.dir, v.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("node a kept the files: %v", err)
	}
}

// A move cut midway leaves the volume where it was, whole, and nothing on
// the other node; a node that was exporting when it died removes its
// files at start if the volume left, and ends the move if it did not.
func TestMoveCut(t *testing.T) {
	a, b, dbA, dbB := twoNodes(t)
	ctx := context.Background()
	v, err := a.Create(ctx, "lab", "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.dataDir(v.ID), "big"), []byte(strings.Repeat("x", 1<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Not moving to b: refused.
	if _, err := b.Import(ctx, v.ID, 1, strings.NewReader("")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("an import of a volume not moving here: %v", err)
	}
	// Once exported, the volume takes no content call here (its writes
	// would not move), until the move is known to have ended without it.
	token, _, err := dbA.BeginVolumeMove(ctx, v.ID, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Export(ctx, v.ID, io.Discard, true); err != nil {
		t.Fatal(err)
	}
	rec, err := dbA.GetVolume(ctx, "", v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := a.Open(rec); !errors.Is(err, errdefs.ErrUnavailable) {
		if d != nil {
			d.Close()
		}
		t.Fatalf("a content call after the export: %v, want ErrUnavailable", err)
	}
	if err := dbA.AbortVolumeMove(ctx, v.ID, token); err != nil {
		t.Fatal(err)
	}
	d, err := a.Open(rec)
	if err != nil {
		t.Fatalf("a content call after the move was aborted: %v", err)
	}
	d.Close()
	// While an export runs (its reader stalled), a content call is
	// refused at once, not after the export ends.
	if token, _, err = dbA.BeginVolumeMove(ctx, v.ID, "a", "b"); err != nil {
		t.Fatal(err)
	}
	stalled, stall := io.Pipe()
	exported := make(chan error, 1)
	go func() { exported <- a.Export(ctx, v.ID, stall, true) }()
	stalled.Read(make([]byte, 1)) // the export has begun: it holds the volume
	refused := make(chan error, 1)
	go func() {
		d, err := a.Open(rec)
		if d != nil {
			d.Close()
		}
		refused <- err
	}()
	waited := false
	select {
	case err := <-refused:
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("a content call during an export: %v, want ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("a content call waited for the export to end")
		waited = true
	}
	stalled.CloseWithError(errors.New("stalled reader gone"))
	if err := <-exported; err == nil {
		t.Error("an export into a closed pipe succeeded")
	}
	if waited {
		<-refused
	}
	if err := dbA.AbortVolumeMove(ctx, v.ID, token); err != nil {
		t.Fatal(err)
	}
	if token, _, err = dbA.BeginVolumeMove(ctx, v.ID, "a", "b"); err != nil {
		t.Fatal(err)
	}
	// The stream is cut after 100 KiB.
	pr, pw := io.Pipe()
	go func() {
		w := &cutWriter{w: pw, left: 100 << 10}
		a.Export(ctx, v.ID, w, true)
		pw.CloseWithError(io.ErrUnexpectedEOF)
	}()
	if _, err := b.Import(ctx, v.ID, token, pr); err == nil {
		t.Fatal("an import of a cut stream succeeded")
	}
	pr.Close()
	if _, err := os.Stat(filepath.Join(b.dir, v.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a cut import left files on node b: %v", err)
	}
	if got, err := dbB.GetVolume(ctx, "", v.ID); err != nil || got.NodeID != "a" {
		t.Fatalf("after a cut move: %+v %v", got, err)
	}
	// An export that failed leaves no mark (its gateway ends the move);
	// one cut by the node's death does: the next start ends the move, and
	// the files stay.
	if _, err := os.Stat(filepath.Join(a.dir, v.ID, exportingMarker)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed export left its mark: %v", err)
	}
	if err := os.WriteFile(filepath.Join(a.dir, v.ID, exportingMarker), []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Close()
	a2, err := NewService(ctx, dbA, a.dir, "a", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if got, _ := dbA.GetVolume(ctx, "", v.ID); got.MovingTo != "" {
		t.Errorf("a move its source restarted out of still stands: %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(a2.dataDir(v.ID), "big")); err != nil || len(b) != 1<<20 {
		t.Fatalf("the volume after a cut move: %d bytes, %v", len(b), err)
	}
	if _, err := os.Stat(filepath.Join(a2.dir, v.ID, exportingMarker)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the exporting mark stays: %v", err)
	}

	// Moved whole, but node a died before dropping its files: its next
	// start does.
	if _, err := move(ctx, t, a2, b, dbA, v.ID); err != nil {
		t.Fatal(err)
	}
	a2.Close()
	a3, err := NewService(ctx, dbA, a.dir, "a", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a3.Close()
	if _, err := os.Stat(filepath.Join(a3.dir, v.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("node a kept a moved volume's files across a restart: %v", err)
	}
	// Files with the mark but no record at all (another database's?) are
	// kept, as any files without a record.
	stray := filepath.Join(a3.dir, "vol-strayfilesstrayfiles")
	if err := os.MkdirAll(filepath.Join(stray, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stray, exportingMarker), []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	a3.Close()
	a4, err := NewService(ctx, dbA, a.dir, "a", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a4.Close()
	if _, err := os.Stat(filepath.Join(stray, "data")); err != nil {
		t.Errorf("files with no record were removed: %v", err)
	}
}

// cutWriter fails once left bytes are written.
type cutWriter struct {
	w    io.Writer
	left int
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if len(b) > c.left {
		n, _ := c.w.Write(b[:c.left])
		c.left = 0
		return n, io.ErrShortWrite
	}
	c.left -= len(b)
	return c.w.Write(b)
}
