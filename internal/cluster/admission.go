// Package cluster is a node's side of a cluster: admission against the
// node's limits (so that no gateway, however stale its view, can overfill
// it), and membership (registration and heartbeat in the shared
// database). The gateway side is internal/gateway.
package cluster

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Limits are what a node may hold.
type Limits struct {
	// MaxSandboxes bounds the sandboxes holding memory (0: no bound).
	MaxSandboxes int
	// MemoryMB bounds the memory given to them in all (0: no bound); above
	// the machine's memory it overcommits.
	MemoryMB int
	// MaxStarting bounds the creates and restores in progress at once;
	// more wait for a turn (0: no bound).
	MaxStarting int
	// DefaultMemoryMB is counted for a create that names no memory size.
	DefaultMemoryMB int
}

// Holder is the node behind admission. It answers from what it keeps in
// memory: admission asks at every create and fork, and a store read (a
// database round trip in a cluster) each time would slow them all.
type Holder interface {
	node.Node
	// Use reports what the node holds.
	Use() sandbox.Use
	// SandboxSize is the size and team of a sandbox the node holds;
	// false when it holds none by that ID.
	SandboxSize(id string) (sandbox.Size, bool)
}

// Admission is a node.Node that refuses new sandboxes beyond the node's
// limits or while the node is drained, and bounds concurrent starts. Every
// other call passes through.
type Admission struct {
	node.Node
	holder   Holder
	limits   Limits
	draining atomic.Bool
	starting chan struct{} // a token per start in progress; nil: unbounded

	mu sync.Mutex
	// reserved counts admitted sandboxes not yet in use (their create is
	// in flight), so that a burst is judged as a whole.
	reserved, reservedMB int

	// teams, when set, is read for an early refusal of a create or fork
	// past its team's limits: on arrival, and while it waits for a turn
	// (teamSeen, refreshed at most every teamRecheck, shared by the
	// waiters of a team so that a queue of them costs one read per
	// interval, not one each).
	teams       store.TeamReader
	teamRecheck time.Duration
	teamMu      sync.Mutex
	teamSeen    map[string]teamSeen
}

// unlimitedTTL is how long a team read without limits is taken as such
// on a create's arrival.
const unlimitedTTL = time.Second

// teamSeen is a team and what its sandboxes held, read at at (zero:
// never read yet).
type teamSeen struct {
	at      time.Time
	team    *auth.Team // nil: gone, or without limits
	used    auth.Usage
	reading bool // a waiter is reading it afresh
}

// NewAdmission wraps n.
func NewAdmission(n Holder, limits Limits) *Admission {
	a := &Admission{Node: n, holder: n, limits: limits}
	if limits.MaxStarting > 0 {
		a.starting = make(chan struct{}, limits.MaxStarting)
	}
	return a
}

// CheckTeams has creates and forks refused early, with store.ErrLimit,
// when their team is at one of its limits (as store.CheckTeamRoom judges,
// from teams): on arrival, before the node reserves room for them, and every
// recheck while they wait for a turn to start. Without it a create past
// its team's limit still fails, but only once it has had its turn and
// its record is written, behind every start queued before it. The check
// in the store's transaction stays the one that holds; these take nothing.
func (a *Admission) CheckTeams(teams store.TeamReader, recheck time.Duration) {
	a.teams, a.teamRecheck = teams, recheck
	a.teamSeen = map[string]teamSeen{}
}

// SetDraining drains the node (it takes no new sandboxes) or undrains it.
func (a *Admission) SetDraining(v bool) { a.draining.Store(v) }

// Draining reports whether the node is drained.
func (a *Admission) Draining() bool { return a.draining.Load() }

// admit reserves room for up to n sandboxes of memoryMB each and returns
// how many fit (at least one, else an error saying why) and the release of
// the reservation.
func (a *Admission) admit(n, memoryMB int) (int, func(), error) {
	if a.draining.Load() {
		return 0, nil, fmt.Errorf("%w: this node is drained and takes no new sandboxes", node.ErrUnavailable)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.holder.Use()
	fit := n
	if max := a.limits.MaxSandboxes; max > 0 {
		fit = min(fit, max-u.Sandboxes-a.reserved)
	}
	if limit := a.limits.MemoryMB; limit > 0 && memoryMB > 0 {
		fit = min(fit, (limit-u.MemoryMB-a.reservedMB)/memoryMB)
	}
	if fit < 1 {
		count := fmt.Sprintf("%d sandboxes", u.Sandboxes)
		if a.limits.MaxSandboxes > 0 {
			count += fmt.Sprintf(" of at most %d", a.limits.MaxSandboxes)
		}
		return 0, nil, fmt.Errorf("%w: this node is full (%s, %d MiB of %d MiB given, %d more starting)",
			node.ErrUnavailable, count, u.MemoryMB, a.limits.MemoryMB, a.reserved)
	}
	a.reserved += fit
	a.reservedMB += fit * memoryMB
	var once sync.Once
	return fit, func() {
		once.Do(func() {
			a.mu.Lock()
			a.reserved -= fit
			a.reservedMB -= fit * memoryMB
			a.mu.Unlock()
		})
	}, nil
}

// asked is what a create or fork asks of admission: up to n sandboxes,
// each of memoryMB (node room) and, for its team's limits, of teamMB and
// vcpus (0: not known yet, counted as none).
type asked struct {
	n, memoryMB   int
	team          string
	teamMB, vcpus int
}

// enter checks the team's room, admits up to n sandboxes and waits for a
// turn to start them; it returns how many fit and the release of both.
func (a *Admission) enter(ctx context.Context, q asked) (int, func(), error) {
	if err := a.teamRoom(ctx, q, false); err != nil {
		return 0, nil, err
	}
	fit, release, err := a.admit(q.n, q.memoryMB)
	if err != nil {
		return 0, nil, err
	}
	if a.starting == nil {
		return fit, release, nil
	}
	var recheck <-chan time.Time
	if a.teams != nil && q.team != "" {
		t := time.NewTicker(a.teamRecheck)
		defer t.Stop()
		recheck = t.C
	}
	for {
		select {
		case a.starting <- struct{}{}:
			return fit, func() { <-a.starting; release() }, nil
		case <-ctx.Done():
			release()
			return 0, nil, fmt.Errorf("waiting for a turn to start: %w", context.Cause(ctx))
		case <-recheck:
			if err := a.teamRoom(ctx, q, true); err != nil {
				release()
				return 0, nil, err
			}
		}
	}
}

// teamRoom refuses q, with store.ErrLimit, when its team has no room for
// one more sandbox. On arrival (waiting false) it reads the team afresh
// and checks every limit. While q waits for a turn it checks only the
// limits on what the team holds (sandboxes, memory, vCPUs), from a read
// at most teamRecheck old: starts and creates per second are the team's
// rate, which a create already in line has passed. A failed read refuses
// nothing: the store's check at the create decides then.
func (a *Admission) teamRoom(ctx context.Context, q asked, waiting bool) error {
	if a.teams == nil || q.team == "" {
		return nil
	}
	seen, ok := a.teamView(ctx, q.team, waiting)
	if !ok || seen.team == nil {
		return nil
	}
	t := *seen.team
	if waiting {
		t.MaxStarting, t.CreatesPerSecond = 0, 0
	}
	return store.TeamRoom(&t, seen.used, q.teamMB, q.vcpus)
}

// teamView is team id as last read: afresh unless cached, when the read
// kept may be up to teamRecheck old (or older, while another waiter reads
// it: the waiters of a team read it once per interval, not once each).
func (a *Admission) teamView(ctx context.Context, id string, cached bool) (teamSeen, bool) {
	claimed := false // this call set reading, and clears it
	if !cached {
		// A team without limits (most are) costs a create no read for a
		// second: a limit set meanwhile is the store's to apply.
		a.teamMu.Lock()
		seen, ok := a.teamSeen[id]
		a.teamMu.Unlock()
		if ok && !seen.at.IsZero() && seen.team == nil && time.Since(seen.at) <= unlimitedTTL {
			return seen, true
		}
	} else {
		a.teamMu.Lock()
		seen, ok := a.teamSeen[id]
		if ok && (seen.reading || time.Since(seen.at) <= a.teamRecheck) {
			a.teamMu.Unlock()
			return seen, !seen.at.IsZero()
		}
		seen.reading, claimed = true, true
		a.teamSeen[id] = seen
		a.teamMu.Unlock()
	}
	fresh, ok := a.readTeam(ctx, id)
	a.teamMu.Lock()
	defer a.teamMu.Unlock()
	kept := a.teamSeen[id]
	if claimed {
		kept.reading = false
	}
	if ok && fresh.at.After(kept.at) {
		// A read that started later (an arrival's) may have finished
		// first: the newest is kept.
		kept.at, kept.team, kept.used = fresh.at, fresh.team, fresh.used
	}
	a.teamSeen[id] = kept
	return fresh, ok
}

// readTeam reads team id and what its sandboxes hold.
func (a *Admission) readTeam(ctx context.Context, id string) (teamSeen, bool) {
	seen := teamSeen{at: time.Now()}
	t, err := store.LimitedTeam(ctx, a.teams, id)
	if err != nil {
		return teamSeen{}, false
	}
	if t != nil {
		used, err := a.teams.TeamUse(ctx, id)
		if err != nil {
			return teamSeen{}, false
		}
		seen.team, seen.used = t, used
	}
	return seen, true
}

func (a *Admission) Create(ctx context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	mem := req.MemoryMB
	if mem == 0 {
		mem = a.limits.DefaultMemoryMB
	}
	q := asked{n: 1, memoryMB: mem, team: req.TeamID, teamMB: req.MemoryMB, vcpus: req.VCPU}
	if a.teams != nil && q.team != "" {
		// A snapshot's sandbox has the snapshot's size, whatever is asked.
		name := cmp.Or(req.Template, template.BaseName)
		if tpl, err := a.Node.GetTemplate(ctx, name); err == nil {
			q.teamMB, q.vcpus = tpl.SizeFor(req.MemoryMB, req.VCPU)
		} else {
			q.teamMB, q.vcpus = 0, 0 // not known: the store's check decides
		}
	}
	_, leave, err := a.enter(ctx, q)
	if err != nil {
		return nil, err
	}
	defer leave()
	return a.Node.Create(ctx, req)
}

// Fork makes as many children as the node has room for and answers the
// rest with why not, child by child; a team at one of its limits has the
// whole fork refused. Children have the source's memory
// size; a source the node does not hold is the inner Fork's to refuse.
func (a *Admission) Fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	count := req.Count
	q := asked{n: max(count, 1), team: req.TeamID}
	if req.SandboxID != "" {
		if size, ok := a.holder.SandboxSize(req.SandboxID); ok {
			q.teamMB, q.vcpus, q.team = size.MemoryMB, size.VCPUs, size.TeamID
		}
	} else if tpl, err := a.Node.GetTemplate(ctx, req.SnapshotID); err == nil {
		q.teamMB, q.vcpus = tpl.MemoryMB, tpl.VCPU
	}
	q.memoryMB = q.teamMB
	if q.memoryMB <= 0 {
		q.memoryMB = a.limits.DefaultMemoryMB
	}
	fit, leave, err := a.enter(ctx, q)
	if err != nil {
		return nil, err
	}
	defer leave()
	if fit >= count {
		return a.Node.Fork(ctx, req)
	}
	req.Count = fit
	results, err := a.Node.Fork(ctx, req)
	if err != nil {
		return nil, err
	}
	for range count - fit {
		results = append(results, node.ForkResult{Err: fmt.Errorf(
			"%w: the node holding the source has room for %d of %d children", node.ErrUnavailable, fit, count)})
	}
	return results, nil
}
