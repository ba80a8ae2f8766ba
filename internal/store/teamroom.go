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

// CheckTeamRoom says whether one more sandbox of memoryMB and vcpus (0:
// not known yet, counted as none) would pass one of team id's limits now:
// ErrLimit naming the limit, else nil. It takes nothing from the team's
// bucket and holds no lock, so it is an early refusal, made before a
// create waits for room or a turn on a node; the check in CreateSandbox is
// the one that holds. A team that is gone, or has no limits, has room.
// Any other error is the read's: callers go on, and leave the refusal to
// the create's own check.
func CheckTeamRoom(ctx context.Context, r TeamReader, id string, memoryMB, vcpus int) error {
	if id == "" {
		return nil
	}
	t, err := r.GetTeam(ctx, id)
	if errors.Is(err, ErrNotFound) || (err == nil && !t.Limited()) {
		return nil
	}
	if err != nil {
		return err
	}
	used, err := r.TeamUse(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Room(used, memoryMB, vcpus, time.Now()); err != nil {
		return fmt.Errorf("%v: %w", err, ErrLimit)
	}
	return nil
}
