package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// RunTeams runs the shared suite of teams and API keys; newStore returns
// a fresh store.
func RunTeams(t *testing.T, newStore func(t *testing.T) auth.Store) {
	t.Run("Teams", func(t *testing.T) { testTeams(t, newStore(t)) })
	t.Run("Keys", func(t *testing.T) { testKeys(t, newStore(t)) })
}

func testTeams(t *testing.T, s auth.Store) {
	ctx := context.Background()
	// The default team exists from the start: the operator's key and
	// everything made before teams belong to it.
	if _, err := s.GetTeam(ctx, auth.DefaultTeam); err != nil {
		t.Fatalf("default team: %v", err)
	}
	now := time.Unix(1700000000, 5).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-a", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-a", CreatedAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate team: %v, want ErrConflict", err)
	}
	got, err := s.GetTeam(ctx, "lab-a")
	if err != nil || got.ID != "lab-a" || !got.CreatedAt.Equal(now) || got.MaxSandboxes != 0 {
		t.Fatalf("get team: %+v %v", got, err)
	}
	if err := s.SetTeamLimits(ctx, &auth.Team{ID: "lab-a", MaxSandboxes: 7}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetTeam(ctx, "lab-a"); got.MaxSandboxes != 7 {
		t.Fatalf("limits: %+v", got)
	}
	if err := s.SetTeamLimits(ctx, &auth.Team{ID: "nope"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("limits of a missing team: %v", err)
	}
	teams, err := s.ListTeams(ctx)
	if err != nil || len(teams) != 2 || teams[0].ID != auth.DefaultTeam || teams[1].ID != "lab-a" {
		t.Fatalf("list teams: %v %v", teams, err)
	}
	// Deleting a team deletes its keys.
	_, k, err := auth.NewKey("lab-a", "k", false, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "lab-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTeam(ctx, "lab-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := s.KeyByDigest(ctx, k.Digest); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the deleted team's key: %v, want ErrNotFound", err)
	}
	if err := s.DeleteTeam(ctx, "lab-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func testKeys(t *testing.T, s auth.Store) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-b", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	secret, k, err := auth.NewKey("lab-b", "trainer", false, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	_, admin, _ := auth.NewKey(auth.DefaultTeam, "ops", true, now.Add(time.Second), 0)
	if err := s.CreateKey(ctx, admin); err != nil {
		t.Fatal(err)
	}
	_, orphan, _ := auth.NewKey("no-such-team", "x", false, now, 0)
	if err := s.CreateKey(ctx, orphan); err == nil {
		t.Fatal("a key of a team that does not exist was stored")
	}

	got, err := s.KeyByDigest(ctx, auth.Digest(secret))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.TeamID != "lab-b" || got.Name != "trainer" || got.Prefix != secret[:len(got.Prefix)] ||
		got.Admin || !got.CreatedAt.Equal(now) || !got.ExpiresAt.Equal(now.Add(time.Hour)) ||
		!got.LastUsedAt.IsZero() || !got.RevokedAt.IsZero() {
		t.Fatalf("key round trip: %+v, want %+v", got, k)
	}
	if _, err := s.KeyByDigest(ctx, auth.Digest(secret+"x")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}

	if err := s.TouchKey(ctx, k.ID, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.KeyByDigest(ctx, k.Digest); !got.LastUsedAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("last used: %v", got.LastUsedAt)
	}

	if keys, err := s.ListKeys(ctx, "lab-b"); err != nil || len(keys) != 1 || keys[0].ID != k.ID {
		t.Fatalf("keys of lab-b: %v %v", keys, err)
	}
	if keys, err := s.ListKeys(ctx, ""); err != nil || len(keys) != 2 || keys[0].ID != k.ID || keys[1].ID != admin.ID ||
		!keys[1].Admin {
		t.Fatalf("every key, oldest first: %v %v", keys, err)
	}

	revoked := now.Add(2 * time.Minute)
	if err := s.RevokeKey(ctx, k.ID, revoked); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, k.ID, revoked.Add(time.Hour)); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	got, err = s.KeyByDigest(ctx, k.Digest)
	if err != nil || !got.RevokedAt.Equal(revoked) || got.Usable(now) {
		t.Fatalf("revoked key: %+v %v (the first revocation's time stays)", got, err)
	}
	if err := s.RevokeKey(ctx, "nope", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke a missing key: %v", err)
	}
}
