package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// A sandbox can stop answering while its process lives (a stopped or
// wedged sentry): calls into it would wait for as long as their callers
// do. The monitor probes the envd of each sandbox with calls in flight
// and, when it does not answer within answerTimeout, ends those calls
// and refuses new ones with node.ErrUnavailable (503) until it answers
// again.

// answerTimeout bounds envd's answer to a health check of a sandbox that
// has calls in flight. envd answers in milliseconds even while commands
// run; a loaded machine may take seconds.
const answerTimeout = 5 * time.Second

// callSet is the calls in flight into one sandbox.
type callSet struct {
	mu     sync.Mutex
	next   uint64
	cancel map[uint64]context.CancelCauseFunc
}

// add registers a call; forget unregisters it.
func (c *callSet) add(cancel context.CancelCauseFunc) (forget func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil {
		c.cancel = map[uint64]context.CancelCauseFunc{}
	}
	c.next++
	key := c.next
	c.cancel[key] = cancel
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.cancel, key)
	}
}

// len is how many calls are in flight.
func (c *callSet) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cancel)
}

// endAll ends every call in flight with cause.
func (c *callSet) endAll(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.cancel {
		cancel(cause)
	}
}

// checkAnswers probes, in the background, the envd of running sandbox e
// if calls are in flight into it or it was found silent; one probe per
// sandbox at a time.
func (m *Manager) checkAnswers(e *entry) {
	if e.calls.len() == 0 && e.silent.Load() == nil {
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

// probeAnswers asks e's envd for its health within answerTimeout and
// marks e silent or answering accordingly.
func (m *Manager) probeAnswers(ctx context.Context, e *entry) {
	v := e.view()
	if v.phase != phaseRunning || v.envd == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, answerTimeout)
	err := v.envd.Health(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		if e.silent.Swap(nil) != nil {
			m.logger.InfoContext(ctx, "monitor: sandbox answers again", "sandbox", e.id)
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
	silent := fmt.Errorf("%w: sandbox %s is not answering (no answer to a health check within %v); it may be overloaded or hung",
		node.ErrUnavailable, e.id, answerTimeout)
	if e.silent.Swap(&silent) == nil {
		m.logger.WarnContext(ctx, "monitor: sandbox not answering; ending its calls", "sandbox", e.id, "err", err)
	}
	e.calls.endAll(silent)
}
