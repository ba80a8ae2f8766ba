package volume

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/roottest"
	"github.com/aenv-dev/aenv/internal/store"
)

// readVia reads p in v through the service, as the content API does.
func readVia(t *testing.T, s *Service, v *store.Volume, p string) string {
	t.Helper()
	d, err := s.Open(v)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	root, err := os.OpenRoot(d.root.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	b, err := root.ReadFile(p)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

func writeVia(t *testing.T, s *Service, v *store.Volume, p, content string) {
	t.Helper()
	dir, _, err := s.HostPath(context.Background(), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A freeze makes a volume's files a layer its clones share; each then
// writes apart, a clone's own files are only what it wrote, and the layer
// goes with the last volume that holds it.
func TestServiceFreezeAndClone(t *testing.T) {
	roottest.Require(t) // overlay mounts
	s, _, dir := newTestService(t)
	t.Cleanup(func() { s.UnmountAll(context.Background()) })
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "repo", 0)
	if err != nil {
		t.Fatal(err)
	}
	writeVia(t, s, v, "f", "base")
	frozen, err := s.Freeze(ctx, v.ID, "parent")
	if err != nil {
		t.Fatal(err)
	}
	if len(frozen.Layers) != 1 {
		t.Fatalf("layers after a freeze: %v", frozen.Layers)
	}
	if path, overlay, err := s.HostPath(ctx, v.ID); err != nil || !overlay || path != filepath.Join(dir, v.ID, "mnt") {
		t.Fatalf("a frozen volume's host path: %s %v %v, want its overlay mount", path, overlay, err)
	}
	a, err := s.Clone(ctx, frozen)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Clone(ctx, frozen)
	if err != nil {
		t.Fatal(err)
	}
	if own, err := os.ReadDir(filepath.Join(dir, a.ID, "data")); err != nil || len(own) != 0 {
		t.Errorf("a new clone has %d files of its own (%v), want none", len(own), err)
	}
	// A freeze with nothing new to freeze adds no layer.
	if again, err := s.Freeze(ctx, a.ID, "parent"); err != nil || len(again.Layers) != 1 {
		t.Fatalf("freeze of a clone with no files of its own: %+v %v, want its one layer", again, err)
	}
	writeVia(t, s, a, "f", "a")
	writeVia(t, s, v, "f", "parent")
	for _, tc := range []struct {
		v    *store.Volume
		want string
	}{{a, "a"}, {b, "base"}, {frozen, "parent"}} {
		if got := readVia(t, s, tc.v, "f"); got != tc.want {
			t.Errorf("%s reads %q, want %q", tc.v.Name, got, tc.want)
		}
	}
	layer := filepath.Join(dir, ".layers", frozen.Layers[0])
	for _, gone := range []*store.Volume{frozen, a} {
		if err := s.Delete(ctx, gone); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(layer); err != nil {
			t.Fatalf("the layer went while %s holds it: %v", b.Name, err)
		}
	}
	if got := readVia(t, s, b, "f"); got != "base" {
		t.Errorf("the last clone reads %q, want base", got)
	}
	if err := s.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the layer once no volume holds it: %v, want removed", err)
	}
}

// A freeze refused for another holder changes nothing; one the record
// took but a crash cut before the files moved is finished at the next
// start.
func TestServiceFreezeRefusedAndCutShort(t *testing.T) {
	roottest.Require(t) // a freeze checks that overlay mounts work
	s, db, dir := newTestService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "repo", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, v.ID, "data", "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := &store.Sandbox{ID: "other", State: store.StateRunning, TeamID: "lab",
		VolumeMounts: []store.VolumeMount{{VolumeID: v.ID, Name: v.Name, Path: "/r"}}}
	if err := db.CreateSandbox(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Freeze(ctx, v.ID, "parent"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("freeze of a volume another sandbox mounts: %v, want a conflict", err)
	}
	if got, _ := db.GetVolume(ctx, "", v.ID); len(got.Layers) != 0 {
		t.Errorf("a refused freeze left layers %v", got.Layers)
	}
	if b, err := os.ReadFile(filepath.Join(dir, v.ID, "data", "f")); err != nil || string(b) != "kept" {
		t.Errorf("a refused freeze moved the files: %q %v", b, err)
	}
	if err := db.DeleteSandbox(ctx, "other"); err != nil {
		t.Fatal(err)
	}

	// Cut short: the record has the layer, the files did not move.
	if _, err := db.FreezeVolume(ctx, v.ID, "layer-cut", "parent"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, v.ID, freezingMarker), []byte("layer-cut"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := NewService(ctx, db, dir, "", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// The sweep of uploads mounts the layered volume; cleanups run last
	// first.
	t.Cleanup(func() { again.UnmountAll(ctx) })
	t.Cleanup(again.Close)
	if b, err := os.ReadFile(filepath.Join(dir, ".layers", "layer-cut", "f")); err != nil || string(b) != "kept" {
		t.Errorf("the cut freeze's layer: %q %v, want the volume's files", b, err)
	}
	if own, err := os.ReadDir(filepath.Join(dir, v.ID, "data")); err != nil || len(own) != 0 {
		t.Errorf("the volume's own files after the finished freeze: %d %v, want none", len(own), err)
	}
	if _, err := os.Stat(filepath.Join(dir, v.ID, freezingMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the freezing mark stays: %v", err)
	}
}

// What a team keeps counts a copy-fork's frozen layer once, to the team of
// the volumes that hold it, beside each volume's own files.
func TestTeamBytesCountsLayersOnce(t *testing.T) {
	roottest.Require(t) // overlay mounts
	s, _, _ := newTestService(t)
	t.Cleanup(func() { s.UnmountAll(context.Background()) })
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "repo", 0)
	if err != nil {
		t.Fatal(err)
	}
	writeVia(t, s, v, "big", strings.Repeat("x", 1<<20))
	if _, err := s.Copy(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Copy(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	s.measureAll(ctx)
	got := s.TeamBytes()
	if n := got["lab"]; n < 1<<20 || n >= 2<<20 {
		t.Fatalf("lab keeps %d bytes with a 1 MiB layer shared by a volume and two copies, want it counted once", n)
	}
	if len(got) != 1 {
		t.Errorf("teams: %v, want lab only", got)
	}
}
