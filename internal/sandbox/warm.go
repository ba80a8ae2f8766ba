package sandbox

import (
	"context"
	"fmt"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// The warm pool keeps sandboxes of the base template's default shape
// booted, envd answering but not yet given an identity. A create that fits
// claims one and only has to give it its token, env vars and egress policy
// (tens of milliseconds instead of a boot). Unclaimed ones have no record:
// a restart removes them as debris, a shutdown kills them.
//
// The pool adapts to demand. It keeps WarmSandboxes at least; a burst of
// creates grows its target to the most that were in progress at once, up
// to WarmMax sandboxes and WarmMemMB of host memory (measured per sandbox),
// so that the next burst of that size is served from it; every idle
// minute halves the target back towards the floor. The pool's sandboxes
// are made at background CPU priority (Spec.Background), one at a time and
// only while no create of its shape and no launch using the prepared pool
// is in progress: refilling takes the time the node has spare, not time
// from the requests it serves. When launches run out of network slots the
// pool gives its own up and stays at what is left, below its floor if need
// be, for warmIdle after the last one it gave up.

// warmIdle is how long the pool goes without a create before its target
// halves.
const warmIdle = time.Minute

// warmKey is the shape a pre-booted sandbox fits.
type warmKey struct {
	templateID string
	vcpu       int
	memoryMB   int
}

type warmSandbox struct {
	id   string
	slot *network.Slot
	envd *envdclient.Client // no token yet: the first /init sets one
}

// warmPool is the pool of one shape, the base template's default.
type warmPool struct {
	key  warmKey
	tpl  *store.Template
	pool *pool[warmKey, *warmSandbox]
}

// warmPolicy keeps at least floor sandboxes, busy or idle, and at most
// max, or what memBytes of host memory holds, whichever is less.
type warmPolicy struct {
	key        warmKey
	least, max int
	memBytes   uint64
}

func (w warmPolicy) floor(warmKey) int { return 0 }
func (w warmPolicy) keep(warmKey) int  { return w.least }

func (w warmPolicy) limit(_ warmKey, perItem uint64) int {
	n := w.max
	if perItem > 0 && w.memBytes > 0 {
		n = min(n, int(w.memBytes/perItem))
	}
	return max(n, w.least)
}

func (w warmPolicy) pick(shapes map[warmKey]*poolShape[*warmSandbox], _ uint64) (warmKey, bool) {
	s := shapes[w.key]
	return w.key, s != nil && len(s.ready) < s.want
}

// WarmPoolStatus is the warm pool's size, for metrics.
type WarmPoolStatus struct {
	Ready  int // booted and unclaimed
	Target int // what the pool fills to
}

// WarmPool reports the warm pool's size; zero when it is off.
func (m *Manager) WarmPool() WarmPoolStatus {
	if m.warm == nil {
		return WarmPoolStatus{}
	}
	ready, target := m.warm.pool.counts()
	return WarmPoolStatus{Ready: ready, Target: target}
}

// startWarmPool boots the pool in the background until ctx ends.
func (m *Manager) startWarmPool(ctx context.Context) error {
	if m.cfg.WarmSandboxes <= 0 {
		return nil
	}
	tpl, err := m.templates.Get(ctx, template.BaseName)
	if err != nil {
		return fmt.Errorf("warm pool: %w", err)
	}
	key := warmKey{tpl.ID, firstPositive(tpl.VCPU, m.cfg.DefaultVCPU), firstPositive(tpl.MemoryMB, m.cfg.DefaultMemoryMB)}
	floor := m.cfg.WarmSandboxes
	policy := warmPolicy{key: key, least: floor, max: max(floor, m.cfg.WarmMax), memBytes: uint64(m.cfg.WarmMemMB) << 20}
	w := &warmPool{key: key, tpl: tpl, pool: newPool(poolPolicy[warmKey, *warmSandbox](policy), warmIdle)}
	w.pool.demand(key, floor)
	m.warm = w
	f := filler[warmKey, *warmSandbox]{
		what:   "warm pool",
		tracer: m.cfg.Tracer,
		// Restores and boots from the prepared pool are requests too.
		gate: func() bool { return m.prep.idle() },
		make: func(ctx context.Context, k warmKey) error {
			ws, err := m.bootWarm(ctx, w)
			if err != nil {
				return err
			}
			if !w.pool.add(k, ws, m.memoryOf(ctx, ws.id)) { // the target dropped while it booted
				m.discardWarm(ctx, ws)
			}
			return nil
		},
		discard: m.discardWarm,
	}
	if !m.goOwned(func(ctx context.Context) { w.pool.fill(ctx, f, m.logger) }) {
		close(w.pool.done)
	}
	return nil
}

// begin counts a create of key in progress and returns a pre-booted
// sandbox for it, or nil; end must follow when key is the pool's.
func (w *warmPool) begin(key warmKey) (ws *warmSandbox, counted bool) {
	if w == nil || key != w.key {
		return nil, false
	}
	ws, _ = w.pool.begin(key)
	return ws, true
}

func (w *warmPool) end() { w.pool.end(w.key) }

func (m *Manager) bootWarm(ctx context.Context, w *warmPool) (*warmSandbox, error) {
	// A fill takes no slot from anyone (acquireSlot would evict pooled
	// sandboxes, this pool's among them).
	slot, err := m.slots.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	id := NewID()
	spec := m.spec(id, w.tpl, slot, w.key.vcpu, w.key.memoryMB, "", rootFromNode)
	spec.Background = true
	if err := m.driver.Start(ctx, spec); err != nil {
		m.releaseSlot(ctx, slot.Index, id)
		return nil, err
	}
	envd := envdclient.New(envdURL(id, slot.SandboxIP), m.http, "")
	err = m.waitReady(ctx, envd)
	if err == nil {
		err = warmUp(ctx, envd, w.tpl)
	}
	if err != nil {
		m.killInstance(ctx, id)
		m.releaseSlot(ctx, slot.Index, id)
		return nil, err
	}
	return &warmSandbox{id: id, slot: slot, envd: envd}, nil
}

// warmUp runs one command in a pooled sandbox the way a client's first
// command runs (a login bash through envd's process service), so that the
// client's first command does not pay for what only a first one does:
// gVisor reading bash, its libraries and the profile scripts through the
// gofer, and setting up its first address spaces (measured: the first
// command after a claim took 25-60 ms more than the next). It runs as the
// template's default user in its home, as a client's command will, so
// that user's profile files are read too. It leaves nothing behind: the
// process exits and envd keeps no state of it.
func warmUp(ctx context.Context, envd *envdclient.Client, tpl *store.Template) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	user := tpl.DefaultUser
	if user == "" {
		user = "root"
	}
	res, err := envd.Run(ctx, envdclient.RunRequest{Command: "true", User: user, Cwd: tpl.DefaultWorkdir})
	if err != nil {
		return fmt.Errorf("warm up: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("warm up: exit code %d: %s", res.ExitCode, res.Stderr)
	}
	return nil
}

// evictWarm frees the slot of the newest pre-booted sandbox for a launch
// that found none free, and holds the pool at what it then has (below its
// floor if need be) for warmIdle, so that the filler does not take the
// slot back; false when there was none to take.
func (m *Manager) evictWarm(ctx context.Context) bool {
	if m.warm == nil {
		return false
	}
	ws, ok := m.warm.pool.evict(time.Now())
	if !ok {
		return false
	}
	m.discardWarm(context.WithoutCancel(ctx), ws)
	return true
}

// discardWarm kills a pre-booted sandbox that will not be used.
func (m *Manager) discardWarm(ctx context.Context, ws *warmSandbox) {
	m.killInstance(ctx, ws.id)
	m.releaseSlot(ctx, ws.slot.Index, ws.id)
}

// stopWarmPool kills the unclaimed sandboxes; the filler must have
// stopped (its context ended).
func (m *Manager) stopWarmPool(ctx context.Context) {
	w := m.warm
	if w == nil {
		return
	}
	<-w.pool.done
	for _, ws := range w.pool.drain() {
		m.discardWarm(ctx, ws)
	}
}

// launchWarm turns a pre-booted sandbox into sb: egress policy, envd
// identity, then the record, written once everything works.
func (m *Manager) launchWarm(ctx context.Context, sb *store.Sandbox, tpl *store.Template, ws *warmSandbox) (*entry, error) {
	return m.adopt(ctx, sb, tpl, ws.slot, ws.envd, nil, func(ctx context.Context) { m.discardWarm(ctx, ws) },
		"sandbox started from the warm pool")
}
