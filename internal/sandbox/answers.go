package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// A sandbox can stop answering while its process lives (a stopped or
// wedged sentry): calls into it would wait for as long as their callers
// do. The monitor probes the envd of each sandbox with a call open longer
// than answerTimeout and, when it misses answerMisses health checks in a
// row, ends its calls and refuses new ones with node.ErrUnavailable (503)
// until it answers again.

// defaultAnswerTimeout bounds envd's answer to a health check (see
// Config.AnswerTimeout). envd answers in milliseconds even while commands
// run; a loaded machine may take seconds.
const defaultAnswerTimeout = 5 * time.Second

// answerMisses is how many health checks in a row a sandbox must miss
// before its calls are ended: a busy sandbox on a loaded node (make -j on
// two cores) misses one now and then, and ending its long exec streams
// and websockets for that would be worse than the wait.
const answerMisses = 3

// callSet is the calls in flight into one sandbox.
type callSet struct {
	mu    sync.Mutex
	next  uint64
	calls map[uint64]call
}

type call struct {
	cancel context.CancelCauseFunc
	since  time.Time
}

// add registers a call; forget unregisters it.
func (c *callSet) add(cancel context.CancelCauseFunc) (forget func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[uint64]call{}
	}
	c.next++
	key := c.next
	c.calls[key] = call{cancel: cancel, since: time.Now()}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.calls, key)
	}
}

// oldest is when the oldest call in flight began; false if there is none.
func (c *callSet) oldest() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, cl := range c.calls {
		if first.IsZero() || cl.since.Before(first) {
			first = cl.since
		}
	}
	return first, !first.IsZero()
}

// endAll ends every call in flight with cause.
func (c *callSet) endAll(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cl := range c.calls {
		cl.cancel(cause)
	}
}

// checkAnswers probes, in the background, the envd of running sandbox e
// if wantsProbe says so; one probe per sandbox at a time.
func (m *Manager) checkAnswers(e *entry) {
	if !m.wantsProbe(e, time.Now()) {
		// No call waits on it: misses before are no longer in a row.
		e.misses.Store(0)
		return
	}
	if !e.probing.CompareAndSwap(false, true) {
		return
	}
	if !m.goOwned(func(ctx context.Context) {
		defer e.probing.Store(false)
		m.probeAnswers(ctx, e)
	}) {
		e.probing.Store(false)
	}
}

// wantsProbe says whether e's envd is to be probed at now: when it was
// found silent (to see it answer again), or when a call into it has been
// open longer than a health check may take. A call that young could not
// have been cut for silence anyway, and most calls are short: with
// thousands of sandboxes holding streams open, probing all of them each
// tick would cost more than the hangs it finds.
func (m *Manager) wantsProbe(e *entry, now time.Time) bool {
	if e.silent.Load() != nil {
		return true
	}
	oldest, ok := e.calls.oldest()
	return ok && now.Sub(oldest) > m.cfg.AnswerTimeout
}

// probeAnswers asks e's envd for its health within the answer timeout
// and marks e silent after answerMisses misses in a row, or answering.
func (m *Manager) probeAnswers(ctx context.Context, e *entry) {
	v := e.view()
	if v.phase != phaseRunning || v.envd == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.AnswerTimeout)
	err := v.envd.Health(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		e.misses.Store(0)
		if e.silent.Swap(nil) != nil {
			m.logger.InfoContext(ctx, "monitor: sandbox answers again", "sandbox", e.id)
			m.recordUnresponsive(ctx, e.id, "")
		}
		return
	}
	if e.view() != v {
		return // it stopped or changed meanwhile: not this probe's verdict
	}
	// A sandbox that died does not answer either; that is checkOne's
	// verdict (dead), not this one.
	sctx, cancel := context.WithTimeout(ctx, m.cfg.MonitorTimeout)
	state, serr := m.driver.State(sctx, e.id)
	cancel()
	if serr != nil || state == runtime.StateStopped {
		m.checkOne(ctx, e)
		return
	}
	if misses := e.misses.Add(1); misses < answerMisses && e.silent.Load() == nil {
		m.logger.DebugContext(ctx, "monitor: sandbox missed a health check", "sandbox", e.id, "misses", misses, "err", err)
		return
	}
	reason := fmt.Sprintf("sandbox %s is not answering (%d health checks in a row unanswered within %v); it may be overloaded or hung",
		e.id, answerMisses, m.cfg.AnswerTimeout)
	silent := fmt.Errorf("%w: %s", node.ErrUnavailable, reason)
	if e.silent.Swap(&silent) == nil {
		m.logger.WarnContext(ctx, "monitor: sandbox not answering; ending its calls", "sandbox", e.id, "err", err)
		m.recordUnresponsive(ctx, e.id, reason)
	}
	e.calls.endAll(silent)
	m.unfreezeSilent(ctx, e, v)
}

// unfreezeSilent asks the runtime to resume silent sandbox e if its
// kernel was left stopped behind the runtime's back (a pause cut short by
// its bound while the kernel was still stopping; see runtime.Unfreezer).
// It runs under the lifecycle lock, so that no pause or resume of the
// sandbox runs beside it, and only for silent sandboxes, whose cost it is.
func (m *Manager) unfreezeSilent(ctx context.Context, e *entry, v *view) {
	u, ok := m.driver.(runtime.Unfreezer)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if now := e.view(); now.phase != phaseRunning || now.run != v.run {
		return // paused, resumed or gone meanwhile
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	resumed, err := u.Unfreeze(ctx, e.id)
	switch {
	case err != nil:
		// A sentry stopped on the host, or a runtime too slow to tell:
		// it stays silent, and the next probe looks again.
		m.logger.DebugContext(ctx, "monitor: unfreeze silent sandbox", "sandbox", e.id, "err", err)
	case resumed:
		m.logger.WarnContext(ctx, "monitor: resumed a silent sandbox left stopped by a pause cut short", "sandbox", e.id)
	}
}

// recordUnresponsive writes into e's record why it does not answer ("":
// it answers again), so that GET and lists say so, through a gateway too.
// The record is only what clients read: a failed write is logged, and the
// calls into the sandbox are answered from memory either way.
func (m *Manager) recordUnresponsive(ctx context.Context, id, reason string) {
	if err := m.store.SetSandboxUnresponsive(ctx, id, reason); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.logger.WarnContext(ctx, "monitor: record whether the sandbox answers", "sandbox", id, "err", err)
	}
}
