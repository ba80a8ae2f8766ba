// Package cluster is a node's side of a cluster: admission against the
// node's limits (so that no gateway, however stale its view, can overfill
// it), and membership (registration and heartbeat in the shared
// database). The gateway side is internal/gateway.
package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/store"
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
	// SandboxMemoryMB is the memory given to a sandbox the node holds;
	// false when it holds none by that ID.
	SandboxMemoryMB(id string) (int, bool)
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
}

// NewAdmission wraps n.
func NewAdmission(n Holder, limits Limits) *Admission {
	a := &Admission{Node: n, holder: n, limits: limits}
	if limits.MaxStarting > 0 {
		a.starting = make(chan struct{}, limits.MaxStarting)
	}
	return a
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

// enter admits up to n sandboxes of memoryMB each and waits for a turn to
// start them; it returns how many fit and the release of both.
func (a *Admission) enter(ctx context.Context, n, memoryMB int) (int, func(), error) {
	fit, release, err := a.admit(n, memoryMB)
	if err != nil {
		return 0, nil, err
	}
	if a.starting == nil {
		return fit, release, nil
	}
	select {
	case a.starting <- struct{}{}:
		return fit, func() { <-a.starting; release() }, nil
	case <-ctx.Done():
		release()
		return 0, nil, fmt.Errorf("waiting for a turn to start: %w", context.Cause(ctx))
	}
}

func (a *Admission) Create(ctx context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	mem := req.MemoryMB
	if mem == 0 {
		mem = a.limits.DefaultMemoryMB
	}
	_, leave, err := a.enter(ctx, 1, mem)
	if err != nil {
		return nil, err
	}
	defer leave()
	return a.Node.Create(ctx, req)
}

// Fork makes as many children as the node has room for and answers the
// rest with why not, child by child. Children have the source's memory
// size; a source the node does not hold is the inner Fork's to refuse.
func (a *Admission) Fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	mem := a.limits.DefaultMemoryMB
	if req.SandboxID != "" {
		if mb, ok := a.holder.SandboxMemoryMB(req.SandboxID); ok && mb > 0 {
			mem = mb
		}
	} else if tpl, err := a.Node.GetTemplate(ctx, req.SnapshotID); err == nil && tpl.MemoryMB > 0 {
		mem = tpl.MemoryMB
	}
	count := req.Count
	fit, leave, err := a.enter(ctx, max(count, 1), mem)
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
