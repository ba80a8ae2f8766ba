package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/requestid"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

const (
	// idempotencyLease is how long a gateway holds a key it does not
	// renew: past it, a gateway that died mid-request is taken over.
	idempotencyLease = 15 * time.Second
	// idempotencyDetach bounds a create or fork with a key run on after
	// its client left, so that its answer is known and kept.
	idempotencyDetach = 5 * time.Minute
	// idempotencyPoll bounds the wait between two looks at a key another
	// gateway holds.
	idempotencyPoll = 500 * time.Millisecond
	// cleanEvery is how often expired keys are removed.
	cleanEvery = time.Minute
)

// sharedIdempotency is the cluster's api.IdempotencyStore: keys in the
// database, so that a retry through any gateway gets the first answer.
type sharedIdempotency struct {
	db      idempotencyDB
	logger  *slog.Logger
	queries *atomic.Int64
	lease   time.Duration
}

func (s *sharedIdempotency) Claim(ctx context.Context, scope, bodyHash [32]byte) (*api.IdempotentAnswer, api.IdempotencyRun, error) {
	owner, err := randomOwner()
	if err != nil {
		return nil, nil, err
	}
	wait := 20 * time.Millisecond
	for {
		// The claim itself is not cut by a client leaving: a claim made
		// in the database but not seen here would hold the key, unserved,
		// for a whole lease. Only the waits end with the client.
		s.queries.Add(1)
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lease)
		claimed, prior, row, err := s.db.ClaimIdempotency(qctx, scope[:], bodyHash[:], owner, s.lease, api.IdempotencyTTL)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		if claimed {
			return nil, s.hold(scope, owner, prior), nil
		}
		if row != nil {
			if !bytes.Equal(row.BodySHA256, bodyHash[:]) {
				return nil, nil, api.ErrIdempotencyMismatch
			}
			if row.State == postgres.IdempotencyDone {
				return &api.IdempotentAnswer{Status: row.Status, Header: row.Header, Body: row.Body}, nil, nil
			}
		}
		// Held by another gateway (or just gone): look again, less
		// often the longer it runs.
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, idempotencyPoll)
	}
}

func randomOwner() (string, error) {
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("idempotency owner: %w", err)
	}
	return hex.EncodeToString(buf), nil
}

// hold starts renewing the lease on a claimed key until the run ends.
func (s *sharedIdempotency) hold(scope [32]byte, owner, prior string) *sharedRun {
	ctx, cancel := context.WithCancel(context.Background())
	run := &sharedRun{s: s, key: scope, owner: owner, prior: prior, stop: cancel}
	run.done.Add(1)
	go func() {
		defer run.done.Done()
		t := time.NewTicker(s.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, s.lease/3)
			held, err := s.db.RenewIdempotency(rctx, scope[:], owner, s.lease)
			rcancel()
			switch {
			case err != nil && ctx.Err() == nil:
				s.logger.Warn("cannot renew the hold on an idempotency key", "err", err)
			case err == nil && !held:
				return // settled, or taken over after a lapse
			}
		}
	}()
	return run
}

// sharedRun is a gateway's hold on a key.
type sharedRun struct {
	s     *sharedIdempotency
	key   [32]byte
	owner string
	prior string
	stop  context.CancelFunc
	done  sync.WaitGroup
	ended atomic.Bool
}

func (r *sharedRun) Prior() string { return r.prior }

// NodeKey is the key the gateway sends nodes in place of the client's:
// unique to the caller and route, and the same for a taker, so that a
// node that made the sandbox answers the taker's resend with it.
func (r *sharedRun) NodeKey() string { return hex.EncodeToString(r.key[:]) }

func (r *sharedRun) Note(ctx context.Context, note string) error {
	r.s.queries.Add(1)
	held, err := r.s.db.NoteIdempotency(ctx, r.key[:], r.owner, note)
	if err == nil && !held {
		err = errors.New("the idempotency key was taken over")
	}
	return err
}

func (r *sharedRun) Settle(ctx context.Context, a *api.IdempotentAnswer, keep bool) error {
	if !r.end() {
		return nil
	}
	r.s.queries.Add(1)
	if !keep || a == nil {
		_, err := r.s.db.DropIdempotency(ctx, r.key[:], r.owner)
		return err
	}
	header := a.Header.Clone()
	header.Del("Date")
	// A replay answers another request, with its own ID.
	header.Del(requestid.Header)
	_, err := r.s.db.FinishIdempotency(ctx, r.key[:], r.owner, a.Status, header, a.Body, api.IdempotencyTTL)
	return err
}

func (r *sharedRun) Release(ctx context.Context) error {
	if !r.end() {
		return nil
	}
	r.s.queries.Add(1)
	_, err := r.s.db.ReleaseIdempotency(ctx, r.key[:], r.owner)
	return err
}

// end stops the renewals; false when the run had ended already (the
// handler ended it before the API's wrapper).
func (r *sharedRun) end() bool {
	if r.ended.Swap(true) {
		return false
	}
	r.stop()
	r.done.Wait()
	return true
}

// idempotent wraps a create or fork: one answer per Idempotency-Key
// across the cluster, its request run to the end even if the client
// leaves.
func (g *Gateway) idempotent(h http.HandlerFunc) http.Handler {
	return api.Idempotent(g.idem, api.IdempotentOptions{MaxBody: g.cfg.MaxJSONBytes, Detach: idempotencyDetach}, g.logger, h)
}

// heldRun returns the hold of r's Idempotency-Key (nil without one), and
// gives r the key nodes see in its place.
func heldRun(r *http.Request) *sharedRun {
	run, _ := api.IdempotencyRunOf(r.Context()).(*sharedRun)
	if run != nil {
		r.Header.Set(api.HeaderIdempotencyKey, run.NodeKey())
	}
	return run
}

// forget ends a run whose request made nothing: its retry runs afresh.
func (g *Gateway) forget(r *http.Request, run *sharedRun) {
	if run == nil {
		return
	}
	if err := run.Settle(context.WithoutCancel(r.Context()), nil, false); err != nil {
		g.logger.WarnContext(r.Context(), "cannot drop an idempotency key", "err", err)
	}
}

// unknownOutcome ends a run whose request may or may not have made its
// sandbox: the key stays held, with its note, and the next retry takes it
// over at once.
func (g *Gateway) unknownOutcome(r *http.Request, run *sharedRun) {
	if run == nil {
		return
	}
	if err := run.Release(context.WithoutCancel(r.Context())); err != nil {
		g.logger.WarnContext(r.Context(), "cannot release an idempotency key", "err", err)
	}
}

// cleanIdempotency removes expired keys.
func (g *Gateway) cleanIdempotency(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.NodeTimeout)
	defer cancel()
	if _, err := g.db.DeleteExpiredIdempotency(ctx); err != nil && ctx.Err() == nil {
		g.logger.Warn("cannot remove expired idempotency keys", "err", err)
	}
}
