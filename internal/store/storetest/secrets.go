package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

// RunSecrets runs the shared suite of users' secrets; newStore returns a
// fresh store.
func RunSecrets(t *testing.T, newStore func(t *testing.T) store.SecretStore) {
	ctx := context.Background()
	s := withTeams(newStore)(t)
	now := time.Unix(1700000000, 7).UTC()
	mk := func(id, team, name string, at time.Time) *store.Secret {
		return &store.Secret{ID: id, TeamID: team, Name: name, Version: 1, CreatedAt: at, UpdatedAt: at,
			Metadata: map[string]string{"owner": team}}
	}
	a, b, c := mk("sec_a", "lab-a", "openai", now), mk("sec_b", "lab-b", "openai", now.Add(time.Second)),
		mk("sec_c", "lab-a", "github", now.Add(2*time.Second))
	for _, sec := range []*store.Secret{a, b, c} {
		if err := s.CreateSecret(ctx, sec, []byte("sealed-1-"+sec.ID)); err != nil {
			t.Fatalf("create %s: %v", sec.ID, err)
		}
	}
	if err := s.CreateSecret(ctx, mk("sec_d", "lab-a", "openai", now), []byte("x")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second secret named openai in lab-a: %v, want ErrConflict", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_a", "lab-c", "other", now), []byte("x")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a taken ID: %v, want ErrConflict", err)
	}
	if err := s.CreateSecret(ctx, mk("sec_x", "no-such-team", "openai", now), []byte("x")); !errors.Is(err, store.ErrTeamGone) {
		t.Fatalf("a secret of a team with no record: %v, want ErrTeamGone", err)
	}
	for _, tc := range []struct{ team, idOrName, want string }{
		{"lab-a", "openai", "sec_a"},
		{"lab-b", "openai", "sec_b"},
		{"lab-b", "sec_a", "sec_a"}, // by ID, any team's: the caller decides
		{"lab-c", "openai", ""},
	} {
		got, err := s.GetSecret(ctx, tc.team, tc.idOrName)
		if tc.want == "" {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("get %s/%s: %v, want ErrNotFound", tc.team, tc.idOrName, err)
			}
			continue
		}
		if err != nil || got.ID != tc.want {
			t.Errorf("get %s/%s: %+v %v, want %s", tc.team, tc.idOrName, got, err, tc.want)
		}
	}
	got, err := s.GetSecret(ctx, "lab-a", "sec_a")
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(now) || got.Version != 1 || got.Metadata["owner"] != "lab-a" || got.Name != "openai" {
		t.Fatalf("read back %+v", got)
	}

	list := func(team string) []string {
		t.Helper()
		secs, err := s.ListSecrets(ctx, team)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sec := range secs {
			ids = append(ids, sec.ID)
		}
		return ids
	}
	if got, want := fmt.Sprint(list("lab-a")), "[sec_a sec_c]"; got != want {
		t.Errorf("lab-a's secrets %s, want %s (oldest first)", got, want)
	}
	if got, want := fmt.Sprint(list("")), "[sec_a sec_b sec_c]"; got != want {
		t.Errorf("every secret %s, want %s", got, want)
	}

	// The value is the current version's.
	value := func(team, name string) (int64, string) {
		t.Helper()
		sec, sealed, err := s.SecretValue(ctx, team, name)
		if err != nil {
			t.Fatalf("value of %s/%s: %v", team, name, err)
		}
		return sec.Version, string(sealed)
	}
	if v, sealed := value("lab-a", "openai"); v != 1 || sealed != "sealed-1-sec_a" {
		t.Fatalf("value %d %q", v, sealed)
	}
	if _, _, err := s.SecretValue(ctx, "lab-c", "openai"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another team's secret by name: %v, want ErrNotFound", err)
	}
	// An update makes the next version; nil metadata keeps it.
	later := now.Add(time.Minute)
	up, err := s.UpdateSecret(ctx, "sec_a", []byte("sealed-2"), nil, later)
	if err != nil {
		t.Fatal(err)
	}
	if up.Version != 2 || !up.UpdatedAt.Equal(later) || !up.CreatedAt.Equal(now) || up.Metadata["owner"] != "lab-a" {
		t.Fatalf("updated %+v", up)
	}
	if v, sealed := value("lab-a", "openai"); v != 2 || sealed != "sealed-2" {
		t.Fatalf("after update: value %d %q", v, sealed)
	}
	up, err = s.UpdateSecret(ctx, "sec_a", []byte("sealed-3"), map[string]string{"k": "v"}, later)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(up.Metadata, map[string]string{"k": "v"}) {
		t.Fatalf("metadata replaced: %v", up.Metadata)
	}
	if _, err := s.UpdateSecret(ctx, "sec_zz", []byte("x"), nil, later); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of an unknown secret: %v, want ErrNotFound", err)
	}

	// Concurrent updates make distinct versions.
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Go(func() {
			_, err := s.UpdateSecret(ctx, "sec_b", []byte(fmt.Sprint("v", i)), nil, later)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent update: %v", err)
		}
	}
	if v, _ := value("lab-b", "openai"); v != 11 {
		t.Fatalf("after 10 updates: version %d, want 11", v)
	}

	if err := s.DeleteSecret(ctx, "sec_a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, "sec_a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, _, err := s.SecretValue(ctx, "lab-a", "openai"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("value of a deleted secret: %v, want ErrNotFound", err)
	}
	// The name is free again, and a new secret of it starts at version 1
	// with nothing of the old one's.
	if err := s.CreateSecret(ctx, mk("sec_e", "lab-a", "openai", later), []byte("fresh")); err != nil {
		t.Fatal(err)
	}
	if v, sealed := value("lab-a", "openai"); v != 1 || sealed != "fresh" {
		t.Fatalf("recreated: value %d %q", v, sealed)
	}
}
