package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

// RunVolumes runs the shared suite of volume records; newStore returns a
// fresh store.
func RunVolumes(t *testing.T, newStore func(t *testing.T) store.VolumeStore) {
	newStore = withTeams(newStore)
	ctx := context.Background()
	s := newStore(t)
	now := time.Unix(1700000000, 7).UTC()
	a := &store.Volume{ID: "vol-a", Name: "data", TeamID: "lab-a", Token: "tok-a", CreatedAt: now}
	b := &store.Volume{ID: "vol-b", Name: "data", TeamID: "lab-b", Token: "tok-b", CreatedAt: now.Add(time.Second)}
	c := &store.Volume{ID: "vol-c", Name: "cache", TeamID: "lab-a", Token: "tok-c", CreatedAt: now, SizeBytes: 5 << 30}
	for _, v := range []*store.Volume{a, b, c} {
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatalf("create %s: %v", v.ID, err)
		}
	}
	// Names are per team.
	dup := &store.Volume{ID: "vol-d", Name: "data", TeamID: "lab-a", Token: "tok-d", CreatedAt: now}
	if err := s.CreateVolume(ctx, dup); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second volume named data in lab-a: %v, want ErrConflict", err)
	}
	if err := s.CreateVolume(ctx, &store.Volume{ID: "vol-a", Name: "other", TeamID: "lab-a", Token: "x", CreatedAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a taken ID: %v, want ErrConflict", err)
	}

	for _, tc := range []struct {
		team, idOrName, want string
	}{
		{"lab-a", "data", "vol-a"},
		{"lab-b", "data", "vol-b"},
		{"lab-b", "vol-a", "vol-a"}, // by ID, any team's: the caller decides
		{"lab-a", "cache", "vol-c"},
		{"lab-b", "cache", ""},
		{"lab-a", "nope", ""},
	} {
		got, err := s.GetVolume(ctx, tc.team, tc.idOrName)
		switch {
		case tc.want == "" && !errors.Is(err, store.ErrNotFound):
			t.Errorf("get %q in %s: %+v %v, want ErrNotFound", tc.idOrName, tc.team, got, err)
		case tc.want != "" && (err != nil || got.ID != tc.want):
			t.Errorf("get %q in %s: %+v %v, want %s", tc.idOrName, tc.team, got, err, tc.want)
		}
	}
	got, err := s.GetVolume(ctx, "lab-a", "vol-a")
	if err != nil || got.Name != "data" || got.TeamID != "lab-a" || got.Token != "tok-a" || !got.CreatedAt.Equal(now) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if got, err := s.GetVolume(ctx, "lab-a", "vol-c"); err != nil || got.SizeBytes != 5<<30 {
		t.Fatalf("round trip of a size: %+v %v", got, err)
	}

	list := func(team string) []string {
		vs, err := s.ListVolumes(ctx, team)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, v := range vs {
			ids = append(ids, v.ID)
		}
		return ids
	}
	if got := list("lab-a"); len(got) != 2 || got[0] != "vol-c" || got[1] != "vol-a" {
		t.Errorf("lab-a's volumes by name: %v", got)
	}
	if got := list(""); len(got) != 3 {
		t.Errorf("every volume: %v", got)
	}
	for team, want := range map[string]int{"lab-a": 2, "lab-b": 1, "lab-c": 0} {
		if n, err := s.CountVolumes(ctx, team); err != nil || n != want {
			t.Errorf("count of %s's volumes: %d %v, want %d", team, n, err, want)
		}
	}
	// A node's volumes: the ones it holds (a single server's store holds
	// every one; a cluster's only those recorded with the node's ID).
	if mine, err := s.ListNodeVolumes(ctx, a.NodeID); err != nil || !slices.ContainsFunc(mine, func(v *store.Volume) bool { return v.ID == "vol-a" }) {
		t.Errorf("volumes of the node that made vol-a: %v %v", mine, err)
	} else {
		for _, v := range mine {
			if v.NodeID != a.NodeID {
				t.Errorf("volumes of node %q include %s of node %q", a.NodeID, v.ID, v.NodeID)
			}
		}
	}
	if _, err := s.DeleteVolume(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(ctx, "vol-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v, want ErrNotFound", err)
	}
	if got := list("lab-a"); len(got) != 1 || got[0] != "vol-c" {
		t.Errorf("lab-a's volumes after a delete: %v", got)
	}
	// The name is free again.
	if err := s.CreateVolume(ctx, dup); err != nil {
		t.Fatalf("reuse of a deleted volume's name: %v", err)
	}
}

// VolumeAndSandboxStore is a store that keeps both (every real one).
type VolumeAndSandboxStore interface {
	store.Store
	store.VolumeStore
}

// RunVolumeMounts runs the shared suite of sandboxes' volume mounts: the
// record keeps them, holds each volume while the sandbox is not dead, and
// a held volume cannot be deleted.
func RunVolumeMounts(t *testing.T, newStore func(t *testing.T) VolumeAndSandboxStore) {
	newStore = withTeams(newStore)
	ctx := context.Background()
	s := newStore(t)
	now := time.Unix(1700000000, 7).UTC()
	for _, id := range []string{"vol-a", "vol-b"} {
		if err := s.CreateVolume(ctx, &store.Volume{ID: id, Name: id + "-name", TeamID: "team-1", Token: "t", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	mounts := []store.VolumeMount{
		{VolumeID: "vol-a", Name: "vol-a-name", Path: "/mnt/a"},
		{VolumeID: "vol-b", Name: "vol-b-name", Path: "/data/b", ReadOnly: true},
	}
	sb := sandbox("sb1", store.StateRunning, now, nil)
	sb.VolumeMounts = mounts
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil || len(got.VolumeMounts) != 2 || got.VolumeMounts[0] != mounts[0] || got.VolumeMounts[1] != mounts[1] {
		t.Fatalf("mounts round trip: %+v %v", got, err)
	}
	plain := sandbox("sb2", store.StateRunning, now, nil)
	if err := s.CreateSandbox(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "sb2"); err != nil || got.VolumeMounts != nil {
		t.Fatalf("a sandbox without mounts reads back %+v %v", got, err)
	}

	// A mounted volume is held: its delete is refused, naming the sandbox.
	holders, err := s.DeleteVolume(ctx, "vol-b")
	if !errors.Is(err, store.ErrConflict) || len(holders) != 1 ||
		holders[0] != (store.Ref{HolderKind: store.RefSandbox, HolderID: "sb1", TargetKind: store.RefVolume, TargetID: "vol-b"}) {
		t.Fatalf("delete of a mounted volume: %v %+v, want ErrConflict held by sb1", err, holders)
	}
	if _, err := s.GetVolume(ctx, "", "vol-b"); err != nil {
		t.Fatalf("a refused delete lost the volume: %v", err)
	}
	// A create naming a volume that is gone makes nothing.
	gone := sandbox("sb3", store.StateRunning, now, nil)
	gone.VolumeMounts = []store.VolumeMount{{VolumeID: "vol-gone", Name: "x", Path: "/x"}}
	if err := s.CreateSandbox(ctx, gone); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("create mounting a missing volume: %v, want ErrNotFound", err)
	}
	if _, err := s.GetSandbox(ctx, "sb3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused create left a record: %v", err)
	}
	// A snapshot of a sandbox with volumes holds them too, until it goes.
	snap := &store.Template{ID: "snap-1", Name: "snap", RootfsPath: "/r/base", Kind: store.KindSnapshot,
		ImageDir: "/images/snap-1", CreatedAt: now, TeamID: "team-1", VolumeMounts: mounts[:1]}
	if err := s.PutTemplate(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTemplate(ctx, "snap-1"); err != nil || len(got.VolumeMounts) != 1 || got.VolumeMounts[0] != mounts[0] {
		t.Fatalf("a snapshot's mounts round trip: %+v %v", got, err)
	}
	sb.State = store.StateDead
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	holders, err = s.DeleteVolume(ctx, "vol-a")
	if !errors.Is(err, store.ErrConflict) || len(holders) != 1 || holders[0].HolderKind != store.RefTemplate {
		t.Fatalf("delete of a volume a snapshot holds: %v %+v, want ErrConflict held by the snapshot", err, holders)
	}
	// A put of the snapshot again (its upload state, say) keeps the hold.
	if err := s.PutTemplate(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(ctx, "vol-a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete after the snapshot's second put: %v, want ErrConflict", err)
	}
	if err := s.DeleteTemplate(ctx, "snap-1"); err != nil {
		t.Fatal(err)
	}

	// Once the sandbox is dead, its volumes are free.
	sb.State = store.StateDead
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if holders, err := s.DeleteVolume(ctx, "vol-b"); err != nil {
		t.Fatalf("delete once the sandbox is dead: %v %+v", err, holders)
	}
	// And a deleted sandbox holds nothing either.
	sb4 := sandbox("sb4", store.StateRunning, now, nil)
	sb4.VolumeMounts = mounts[:1]
	if err := s.CreateSandbox(ctx, sb4); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb4"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(ctx, "vol-a"); err != nil {
		t.Fatalf("delete once the sandbox record is gone: %v", err)
	}
}

// RunVolumeLayers runs the shared suite of copy-on-write layers: a freeze
// puts a layer on top of a volume mounted by its holder alone, clones hold
// the layers they share, and a layer is unheld once no volume has it.
func RunVolumeLayers(t *testing.T, newStore func(t *testing.T) VolumeAndSandboxStore) {
	newStore = withTeams(newStore)
	ctx := context.Background()
	s := newStore(t)
	now := time.Unix(1700000000, 7).UTC()
	if err := s.CreateVolume(ctx, &store.Volume{ID: "vol-a", Name: "a", TeamID: "team-1", Token: "t", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	parent := sandbox("parent", store.StateRunning, now, nil)
	parent.VolumeMounts = []store.VolumeMount{{VolumeID: "vol-a", Name: "a", Path: "/w"}}
	if err := s.CreateSandbox(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FreezeVolume(ctx, "vol-a", "layer-1", "parent"); err != nil {
		t.Fatalf("freeze a volume its holder alone mounts: %v", err)
	}
	if _, err := s.FreezeVolume(ctx, "vol-a", "layer-2", "parent"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetVolume(ctx, "", "vol-a"); err != nil || len(v.Layers) != 2 || v.Layers[0] != "layer-2" || v.Layers[1] != "layer-1" {
		t.Fatalf("layers after two freezes: %+v %v, want [layer-2 layer-1]", v, err)
	}
	other := sandbox("other", store.StateRunning, now, nil)
	other.VolumeMounts = parent.VolumeMounts
	if err := s.CreateSandbox(ctx, other); err != nil {
		t.Fatal(err)
	}
	holders, err := s.FreezeVolume(ctx, "vol-a", "layer-3", "parent")
	if !errors.Is(err, store.ErrConflict) || len(holders) != 2 {
		t.Fatalf("freeze of a volume another sandbox mounts: %v %+v, want ErrConflict and both holders", err, holders)
	}
	if _, err := s.FreezeVolume(ctx, "vol-gone", "layer-x", "parent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("freeze of a missing volume: %v, want ErrNotFound", err)
	}
	clone := &store.Volume{ID: "vol-c", Name: "a-copy", TeamID: "team-1", Token: "t2", CreatedAt: now, Layers: []string{"layer-2", "layer-1"}}
	if err := s.CreateVolume(ctx, clone); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"parent", "other"} {
		if err := s.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DeleteVolume(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if unheld, err := s.UnheldLayers(ctx, []string{"layer-1", "layer-2", "layer-9"}); err != nil || len(unheld) != 1 || unheld[0] != "layer-9" {
		t.Fatalf("layers the clone still holds: unheld %v %v, want [layer-9]", unheld, err)
	}
	if _, err := s.DeleteVolume(ctx, "vol-c"); err != nil {
		t.Fatal(err)
	}
	if unheld, err := s.UnheldLayers(ctx, []string{"layer-1", "layer-2"}); err != nil || len(unheld) != 2 {
		t.Fatalf("layers once every volume is gone: unheld %v %v, want both", unheld, err)
	}
}
