package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
)

// TeamReader reads a team and what its sandboxes hold.
type TeamReader interface {
	GetTeam(ctx context.Context, id string) (*auth.Team, error)
	TeamUse(ctx context.Context, id string) (auth.Usage, error)
}

// LimitedTeam reads team id for an early check of its limits: nil when
// it has none, or is gone (then the create's own check decides).
func LimitedTeam(ctx context.Context, r TeamReader, id string) (*auth.Team, error) {
	if id == "" {
		return nil, nil
	}
	t, err := r.GetTeam(ctx, id)
	if errors.Is(err, ErrNotFound) || (err == nil && !t.Limited()) {
		return nil, nil
	}
	return t, err
}

// CheckTeamRoom says whether one more sandbox of memoryMB and vcpus (0:
// not known yet, counted as none) would pass one of t's limits now, with
// what its sandboxes hold read afresh: ErrLimit naming the limit, else
// nil (and nil for a nil t, a team without limits). It takes nothing from
// the team's bucket and holds no lock, so it is an early refusal, made
// before a create waits for room or a turn on a node; the check in
// CreateSandbox is the one that holds. Any other error is the read's:
// callers go on, and leave the refusal to the create's own check.
func CheckTeamRoom(ctx context.Context, r TeamReader, t *auth.Team, memoryMB, vcpus int) error {
	if t == nil {
		return nil
	}
	used, err := r.TeamUse(ctx, t.ID)
	if err != nil {
		return err
	}
	return TeamRoom(t, used, memoryMB, vcpus)
}

// TeamRoom is CheckTeamRoom's judgement of t with used held.
func TeamRoom(t *auth.Team, used auth.Usage, memoryMB, vcpus int) error {
	if err := t.Room(used, memoryMB, vcpus, time.Now()); err != nil {
		return fmt.Errorf("%v: %w", err, ErrLimit)
	}
	return nil
}
