package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// fixtureTeams are the teams the tests' sandboxes and volumes belong to.
// A store refuses a record of a team it has no record of (its team was
// deleted while the create was on its way), so they are made first.
var fixtureTeams = []string{"team-1", "team-2", "team-3", "lab-a", "lab-b", "lab-c"}

// makeTeams records fixtureTeams in s, which must keep teams.
func makeTeams(t *testing.T, s any) {
	t.Helper()
	teams, ok := s.(interface {
		CreateTeam(context.Context, *auth.Team) error
	})
	if !ok {
		t.Fatalf("store %T keeps no teams", s)
	}
	for _, id := range fixtureTeams {
		if err := teams.CreateTeam(context.Background(), &auth.Team{ID: id, CreatedAt: time.Unix(0, 0)}); err != nil &&
			!errors.Is(err, store.ErrConflict) {
			t.Fatalf("create team %s: %v", id, err)
		}
	}
}

// withTeams wraps newStore: each store it makes has fixtureTeams.
func withTeams[S any](newStore func(*testing.T) S) func(*testing.T) S {
	return func(t *testing.T) S {
		s := newStore(t)
		makeTeams(t, s)
		return s
	}
}
