package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// A build's snapshot carries its final user and workdir, and replaces the
// template of its name in one checkpoint.
func TestSnapshotDefaultsAndReplace(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sb := w.create()
	req := node.SnapshotRequest{SandboxID: sb.ID, Name: "app", Kind: store.KindSandboxTemplate,
		DefaultUser: "root", DefaultWorkdir: "/srv"}
	first, err := w.m.Snapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.DefaultUser != "root" || first.DefaultWorkdir != "/srv" {
		t.Fatalf("defaults %q %q, want root /srv", first.DefaultUser, first.DefaultWorkdir)
	}
	if _, err := w.m.Snapshot(ctx, req); !errors.Is(err, node.ErrConflict) {
		t.Fatalf("a taken name without Replace: %v", err)
	}
	req.Replace, req.DefaultUser, req.DefaultWorkdir = true, "", ""
	second, err := w.m.Snapshot(ctx, req)
	if err != nil {
		t.Fatalf("replace: %v", err)
	}
	got, err := w.m.GetTemplate(ctx, "app")
	if err != nil || got.ID != second.ID || got.ID == first.ID {
		t.Fatalf("app is %+v (%v), want the second snapshot %s", got, err, second.ID)
	}
	base, err := w.m.GetTemplate(ctx, sb.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	if got.DefaultUser != base.DefaultUser || got.DefaultWorkdir != base.DefaultWorkdir {
		t.Fatalf("unset defaults %q %q, want the source template's %q %q",
			got.DefaultUser, got.DefaultWorkdir, base.DefaultUser, base.DefaultWorkdir)
	}
	if imgs := w.images(); len(imgs) != 1 || imgs[0] != second.ID {
		t.Fatalf("images %v, want only %s", imgs, second.ID)
	}
	// A template that owns its root filesystem is never replaced.
	req.Name = base.Name
	if _, err := w.m.Snapshot(ctx, req); !errors.Is(err, node.ErrConflict) {
		t.Fatalf("replace of %s: %v", base.Name, err)
	}
}

// A cluster node drops the image of a template whose record another node
// deleted (a team's name taken over from elsewhere), and nothing that no
// record named before: an image on its way to a record stays.
func TestSweepGoneImages(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.NodeID = "node-a" })
	ctx := context.Background()
	sb := w.create()
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Name: "app", Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(w.cfg.ImagesDir, "being-taken")
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	w.m.sweepGoneImages(ctx)
	if imgs := w.images(); !slices.Contains(imgs, snap.ID) {
		t.Fatalf("images %v: the recorded snapshot's went", imgs)
	}
	// Another node's replacement deletes this node's record, not its
	// files: those of one recorded since the last sweep too.
	later, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Name: "later", Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.store.DeleteTemplate(ctx, later.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.store.DeleteTemplate(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	w.m.sweepGoneImages(ctx)
	if imgs := w.images(); slices.Contains(imgs, snap.ID) || slices.Contains(imgs, later.ID) ||
		!slices.Contains(imgs, "being-taken") {
		t.Fatalf("images after the records went: %v, want being-taken only", imgs)
	}
	w.m.sweepGoneImages(ctx)
	if imgs := w.images(); !slices.Contains(imgs, "being-taken") {
		t.Fatalf("an image no record named was removed: %v", imgs)
	}
}
