package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// phase is where a sandbox is in its life, as the manager sees it. The
// store keeps a coarser state (paused covers phasePaused and phaseOnDisk).
//
//	            create / restore        pause              spill
//	starting ─────────────────▶ running ─────▶ paused ─────────▶ onDisk
//	    │                        ▲  │  ◀─────── │ ◀──────────────── │
//	    │                        │  │  resume      resume (new slot)
//	    ▼                        │  ▼
//	   gone ◀──── kill, expire, die (from any phase)
//
// Snapshot, fork, timeout and network changes keep the phase.
type phase int

const (
	phaseStarting phase = iota // instance coming up; not reachable
	phaseRunning               // instance runs, envd answers
	phasePaused                // instance frozen in memory
	phaseOnDisk                // checkpoint on disk; no instance, no slot
	phaseGone                  // killed or dead; the entry is being dropped
)

func (p phase) String() string {
	switch p {
	case phaseStarting:
		return "starting"
	case phaseRunning:
		return "running"
	case phasePaused:
		return "paused"
	case phaseOnDisk:
		return "paused on disk"
	case phaseGone:
		return "gone"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// op is a lifecycle operation on one sandbox.
type op string

const (
	opPause         op = "pause"
	opSpill         op = "pause to disk"
	opResume        op = "resume"
	opSnapshot      op = "snapshot"
	opFork          op = "fork"
	opSetTimeout    op = "set the timeout of"
	opUpdateNetwork op = "change the network of"
	opFinish        op = "finish starting"
)

// transitions lists, for every operation, the phases it may start from.
// Kill, expiry and death are allowed from every phase but gone.
var transitions = map[op][]phase{
	opPause:         {phaseRunning},
	opSpill:         {phasePaused},
	opResume:        {phasePaused, phaseOnDisk},
	opSnapshot:      {phaseRunning, phasePaused, phaseOnDisk},
	opFork:          {phaseRunning, phasePaused, phaseOnDisk},
	opSetTimeout:    {phaseRunning},
	opUpdateNetwork: {phaseRunning, phasePaused, phaseOnDisk},
	opFinish:        {phaseStarting},
}

// allowed says whether o may start from p, and if not, why in words a
// client understands (wrapped as ErrConflict).
func allowed(o op, id string, p phase) error {
	for _, from := range transitions[o] {
		if p == from {
			return nil
		}
	}
	if p == phaseGone {
		return fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	hint := ""
	switch {
	case o == opPause && (p == phasePaused || p == phaseOnDisk):
		hint = " (already paused)"
	case o == opSetTimeout && (p == phasePaused || p == phaseOnDisk):
		hint = "; resume it to set a timeout"
	}
	return fmt.Errorf("%w: cannot %s sandbox %s: it is %s%s", node.ErrConflict, o, id, p, hint)
}

// moves is the table of phase changes: for each phase, the phases a
// sandbox in it may move to. A move to the phase it is in changes its
// record alone (a timeout, a network policy). Every change of a live
// sandbox goes through transition, which holds it to this table.
var moves = map[phase][]phase{
	phaseStarting: {phaseRunning, phaseGone},
	phaseRunning:  {phaseRunning, phasePaused, phaseGone},
	phasePaused:   {phasePaused, phaseRunning, phaseOnDisk, phaseGone},
	phaseOnDisk:   {phaseOnDisk, phaseRunning, phaseGone},
}

// canMove says whether the table has the move from → to.
func canMove(from, to phase) bool {
	for _, p := range moves[from] {
		if p == to {
			return true
		}
	}
	return false
}

// stored is the state a record keeps for a sandbox in phase p: the store
// does not tell a sandbox paused in memory from one paused on disk (its
// image directory does), nor one killed from one that died (the first has
// no record left).
func (p phase) stored() store.SandboxState {
	switch p {
	case phaseStarting:
		return store.StateStarting
	case phaseRunning:
		return store.StateRunning
	case phasePaused, phaseOnDisk:
		return store.StatePaused
	}
	return store.StateDead
}

// next returns a copy of e's record for its move to phase to, with the
// state that phase is stored as, for the caller to change and write before
// transition publishes it. It refuses a move the table lacks, before any
// work is done; e.mu is held.
func (e *entry) next(to phase) (*store.Sandbox, error) {
	from := e.view().phase
	if !canMove(from, to) {
		return nil, fmt.Errorf("%w: sandbox %s cannot go from %s to %s", node.ErrConflict, e.id, from, to)
	}
	sb := cloneSandbox(e.view().sb)
	sb.State = to.stored()
	sb.UpdatedAt = time.Now().UTC()
	return sb, nil
}

// newView is the picture of a sandbox in phase p with record sb and what
// its instance holds (none paused on disk or gone). A running one gets a
// new running stretch.
func newView(p phase, sb *store.Sandbox, slot *network.Slot, envd *envdclient.Client) *view {
	v := &view{sb: sb, phase: p, slot: slot, envd: envd}
	if p == phaseRunning {
		v.run = newRunScope()
	}
	return v
}

// transition publishes e in phase to, with record sb (written already, its
// state the phase's), network slot and envd client. A move within running
// keeps the running stretch and the calls bound to it; a move out of
// running ends them with cause. e.mu is held, so the move next allowed
// is still allowed: a move the table lacks, or a record in another state,
// is a defect in this package, and panics rather than letting the record
// and the instance part.
func (e *entry) transition(to phase, sb *store.Sandbox, slot *network.Slot, envd *envdclient.Client, cause error) {
	cur := e.view()
	if !canMove(cur.phase, to) {
		panic(fmt.Sprintf("sandbox %s: no move from %s to %s", e.id, cur.phase, to))
	}
	if to != phaseGone && sb.State != to.stored() {
		panic(fmt.Sprintf("sandbox %s: a record in state %s for phase %s", e.id, sb.State, to))
	}
	v := newView(to, sb, slot, envd)
	if to == phaseRunning && cur.phase == phaseRunning {
		v.run = cur.run
	}
	e.publish(v, cause)
	e.settle()
}

// settle makes e's timer and watch those of its phase, so that no move
// can leave a sandbox without its deadline or with a stale one: a
// running sandbox has its deadline armed, one paused in memory its spill
// to disk (when the node spills), and other phases no timer; an instance
// that holds a slot is watched for its exit. Every transition settles; a
// new entry settles once registered. e.mu is held.
func (e *entry) settle() {
	m := e.owner
	if m == nil {
		return // not registered yet: register's caller settles it
	}
	v := e.view()
	if v.phase == phasePaused && e.timerPhase == phasePaused && e.timer != nil {
		// Still paused (its network policy changed): the spill stays
		// where the pause put it, not postponed by every such change.
		m.watchIfHeld(e, v)
		return
	}
	e.stopTimer()
	e.timerPhase = v.phase
	switch {
	case v.phase == phaseRunning:
		e.arm(time.Until(v.sb.EndAt), m.expire)
	case v.phase == phasePaused && m.cfg.PauseToDiskAfter > 0 && m.driver.Capabilities().Checkpoint:
		wait := m.cfg.PauseToDiskAfter - time.Since(v.sb.UpdatedAt)
		e.arm(wait, m.spill)
	}
	m.watchIfHeld(e, v)
}

// watchIfHeld watches e's instance while one holds a slot for it.
func (m *Manager) watchIfHeld(e *entry, v *view) {
	if v.slot != nil && (v.phase == phaseRunning || v.phase == phasePaused) {
		m.watch(e)
	}
}

// watch checks sandbox e the moment its instance exits, when the runtime
// can tell (runtime.Watcher), so that calls in flight into a sandbox that
// dies on its own end at once rather than at the monitor's next poll,
// which remains the fallback. At most one watch per sandbox runs; it ends
// with the instance, and the monitor starts one for the next instance.
func (m *Manager) watch(e *entry) {
	w, ok := m.driver.(runtime.Watcher)
	if !ok || !e.watching.CompareAndSwap(false, true) {
		return
	}
	if !m.goOwned(func(ctx context.Context) {
		defer e.watching.Store(false)
		exited, err := w.Exited(ctx, e.id)
		if errors.Is(err, runtime.ErrNotFound) {
			// Gone before it could be watched.
			m.checkOne(ctx, e)
			return
		}
		if err != nil {
			m.logger.DebugContext(ctx, "monitor: cannot watch sandbox; polling it", "sandbox", e.id, "err", err)
			return
		}
		<-exited
		if ctx.Err() == nil {
			m.checkOne(ctx, e)
		}
	}) {
		e.watching.Store(false)
	}
}

// stopTimer stops e's timer, if any; e.mu is held.
func (e *entry) stopTimer() {
	e.timerSeq++
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
}

// arm sets e's timer to call fn after d, in place of any earlier one; fn
// gets the timer's sequence number and must, once it holds e.mu, do
// nothing unless e.armed(seq): Stop does not cancel a callback already
// fired and waiting for the lock. e.mu held.
func (e *entry) arm(d time.Duration, fn func(ctx context.Context, e *entry, seq uint64)) {
	e.stopTimer()
	seq := e.timerSeq
	e.timer = e.owner.afterFunc(d, func(ctx context.Context) { fn(ctx, e, seq) })
}

// armed reports whether seq is the timer armed last and not stopped since.
// e.mu held.
func (e *entry) armed(seq uint64) bool {
	return e.timerSeq == seq
}

// view is an immutable picture of a sandbox, published atomically so that
// readers (the proxy, token lookup, stats, counters, the monitor) never
// wait on the lifecycle lock. A transition builds a new view and publishes
// it once the runtime and the record agree.
type view struct {
	sb    *store.Sandbox // never modified once published
	phase phase
	slot  *network.Slot      // nil when no instance holds one
	envd  *envdclient.Client // nil when no instance
	// run ends the moment the sandbox stops running; set in phaseRunning
	// only. Calls in flight to the sandbox are bound to it.
	run *runScope
}

// runScope is one stretch of a sandbox's running life.
type runScope struct {
	ctx  context.Context
	stop context.CancelCauseFunc
}

func newRunScope() *runScope {
	ctx, stop := context.WithCancelCause(context.Background())
	return &runScope{ctx: ctx, stop: stop}
}

// entry is the in-memory side of a sandbox that holds resources.
type entry struct {
	id  string
	cur atomic.Pointer[view]

	// owner is the manager that holds it, set by register: it runs the
	// entry's timer and watches its instance (see settle).
	owner *Manager

	// mu serialises lifecycle operations on this sandbox; readers use cur.
	mu    sync.Mutex
	timer *time.Timer // deadline or spill, as settle set it; guarded by mu
	// timerSeq names the timer armed last; a callback of an earlier one,
	// fired before Stop could cancel it, finds it changed and does
	// nothing. Guarded by mu.
	timerSeq uint64
	// timerPhase is the phase settle last armed the timer for; guarded
	// by mu.
	timerPhase phase
	// retry is the back-off of a failing expiry kill; guarded by mu.
	retry time.Duration
	// checking is set while the monitor asks the runtime about it.
	checking atomic.Bool
	// watching is set while a goroutine waits for its instance to exit
	// (see Manager.watch).
	watching atomic.Bool
	// calls are the calls in flight into the sandbox (Reach); silent is
	// set, with the reason, while its envd does not answer (see
	// Manager.checkAnswers), probing while that is being checked, and
	// misses counts the health checks it missed in a row.
	calls  callSet
	silent atomic.Pointer[error]
	// ending is set, with why, while a release stops the sandbox: from
	// the moment its calls in flight are cut, new calls find it gone, as
	// the E2B SDK's health probe after a cut stream must to report the
	// kill (see Manager.release). Cleared if the kill fails.
	ending  atomic.Pointer[error]
	probing atomic.Bool
	misses  atomic.Int32

	// ops ends the runtime calls of operations in progress, so that a kill
	// need not wait for a hung one. Replaced after each kill attempt.
	opsMu     sync.Mutex
	ops       context.Context
	cancelOps context.CancelFunc

	// tally is the manager's, set by register before the entry is shared;
	// counted says whether the view is in it (guarded by tally.mu).
	tally   *tally
	counted bool
}

func newEntry(v *view) *entry {
	e := &entry{id: v.sb.ID}
	e.cur.Store(v)
	e.renewOps()
	return e
}

func (e *entry) view() *view { return e.cur.Load() }

// publish makes v the sandbox's current view. When the sandbox leaves a
// running stretch, calls bound to it end with cause.
func (e *entry) publish(v *view, cause error) {
	old := e.swap(v)
	if old != nil && old.run != nil && old.run != v.run {
		old.run.stop(cause)
	}
	if old == nil || old.run != v.run {
		// A new running stretch (or none): whether the last one answered
		// says nothing of it; the monitor judges it afresh.
		e.silent.Store(nil)
		e.misses.Store(0)
	}
}

// opContext is ctx, ended too when a kill interrupts the operation.
func (e *entry) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	e.opsMu.Lock()
	ops := e.ops
	e.opsMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(ops, cancel)
	return ctx, func() { stop(); cancel() }
}

// interrupt ends the runtime calls of operations in progress.
func (e *entry) interrupt() {
	e.opsMu.Lock()
	e.cancelOps()
	e.opsMu.Unlock()
}

func (e *entry) renewOps() {
	e.opsMu.Lock()
	e.ops, e.cancelOps = context.WithCancel(context.Background())
	e.opsMu.Unlock()
}

// stoppedError is the cause calls in flight see when a sandbox stops.
func stoppedError(id, why string) error {
	return fmt.Errorf("%w: sandbox %s %s", node.ErrStopped, id, why)
}
