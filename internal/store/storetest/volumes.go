package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

// RunVolumes runs the shared suite of volume records; newStore returns a
// fresh store.
func RunVolumes(t *testing.T, newStore func(t *testing.T) store.VolumeStore) {
	ctx := context.Background()
	s := newStore(t)
	now := time.Unix(1700000000, 7).UTC()
	a := &store.Volume{ID: "vol-a", Name: "data", TeamID: "lab-a", Token: "tok-a", CreatedAt: now}
	b := &store.Volume{ID: "vol-b", Name: "data", TeamID: "lab-b", Token: "tok-b", CreatedAt: now.Add(time.Second)}
	c := &store.Volume{ID: "vol-c", Name: "cache", TeamID: "lab-a", Token: "tok-c", CreatedAt: now}
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
	if err := s.DeleteVolume(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "vol-a"); !errors.Is(err, store.ErrNotFound) {
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
