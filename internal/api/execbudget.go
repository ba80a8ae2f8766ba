package api

import (
	"context"
	"fmt"
	"sync"
)

// DefaultExecOutputBudget is the output /execute calls of a node may hold
// together when Config.ExecOutputBudget is 0.
const DefaultExecOutputBudget = 512 << 20

// maxExecStreamBytes caps what one /execute call keeps of each of stdout
// and stderr; past it the output is dropped and the answer says
// "truncated". A budget smaller than four times it lowers it (see
// newOutputBudget).
const maxExecStreamBytes = 64 << 20

// outputChunkBytes is the unit /execute output is kept and reserved in: it
// is never copied again to grow, and is given back as soon as it has been
// written to the client.
const outputChunkBytes = 64 << 10

// outputBudget bounds the output that the /execute calls of a node hold at
// once. A call reserves each chunk before keeping it and gives it back
// once written to its client; while the budget is spent, a call's reader
// waits, envd stops reading the command's pipe and the command blocks in
// write: back-pressure, never a failure.
//
// A plain weighted semaphore could deadlock here: every call may hold part
// of its output while waiting for more, and none can finish to give any
// back. So the oldest call holding (or asking for) output, the head,
// always keeps room to reach its whole limit: other calls get bytes only
// while what is left covers the head's remainder. The head never waits,
// finishes, and gives back at least a whole limit's worth for the next
// head.
type outputBudget struct {
	total   int64 // bytes all calls may hold together
	perCall int64 // bytes one call may hold: stdout's and stderr's caps

	mu      sync.Mutex
	free    int64
	calls   []*outputCall // calls that hold or asked for bytes, oldest first
	changed chan struct{} // closed (and replaced) whenever bytes come back
	peak    int64         // most bytes held at once
	waits   int           // times a call had to wait
}

// newOutputBudget makes a budget of total bytes; 0 means
// DefaultExecOutputBudget.
func newOutputBudget(total int64) *outputBudget {
	if total <= 0 {
		total = DefaultExecOutputBudget
	}
	// Each stream of a call gets a quarter of the budget at most, so that
	// one call's whole limit leaves half of it to the others.
	stream := min(int64(maxExecStreamBytes), total/4)
	return &outputBudget{total: total, perCall: 2 * stream, free: total, changed: make(chan struct{})}
}

// streamLimit is what one call keeps of each output stream.
func (b *outputBudget) streamLimit() int { return int(b.perCall / 2) }

// outputCall is one /execute call's share of the budget.
type outputCall struct {
	b      *outputBudget
	held   int64
	joined bool // in b.calls
}

func (b *outputBudget) call() *outputCall { return &outputCall{b: b} }

// reserve takes n bytes for c, waiting while the budget cannot give them.
// It fails only when ctx ends.
func (c *outputCall) reserve(ctx context.Context, n int64) error {
	b := c.b
	if c.held+n > b.perCall {
		return fmt.Errorf("reserve %d output bytes: over the %d a call may hold", n, b.perCall)
	}
	b.mu.Lock()
	if !c.joined {
		c.joined = true
		b.calls = append(b.calls, c)
	}
	waited := false
	for !b.fits(c, n) {
		if !waited {
			waited = true
			b.waits++
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for output budget: %w", context.Cause(ctx))
		case <-changed:
		}
		b.mu.Lock()
	}
	b.free -= n
	c.held += n
	b.peak = max(b.peak, b.total-b.free)
	b.mu.Unlock()
	return nil
}

// fits says whether c may take n bytes now: the head may take whatever is
// free (its limit always is), another call only what leaves the head
// room to finish.
func (b *outputBudget) fits(c *outputCall, n int64) bool {
	if n > b.free {
		return false
	}
	head := b.calls[0]
	return c == head || b.free-n >= b.perCall-head.held
}

// release gives n of c's bytes back.
func (c *outputCall) release(n int64) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	c.held -= n
	b.free += n
	b.wake()
}

// done gives back all c holds and ends its turn; c is not used after.
func (c *outputCall) done() {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.joined {
		return
	}
	b.free += c.held
	c.held = 0
	for i, other := range b.calls {
		if other == c {
			b.calls = append(b.calls[:i], b.calls[i+1:]...)
			break
		}
	}
	c.joined = false
	b.wake()
}

// wake lets waiting calls look again; b.mu is held.
func (b *outputBudget) wake() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// budgetStats is what tests and metrics read of a budget.
type budgetStats struct {
	held, peak int64
	calls      int // calls holding or asking for bytes
	waits      int
}

func (b *outputBudget) stats() budgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return budgetStats{held: b.total - b.free, peak: b.peak, calls: len(b.calls), waits: b.waits}
}

// outputBuffer keeps one output stream of a call in chunks reserved from
// its budget, up to max bytes; beyond that output is dropped and
// *truncated set. It is an io.Writer for envd's client; a Write that must
// wait for the budget blocks, which is the back-pressure.
type outputBuffer struct {
	ctx       context.Context
	call      *outputCall
	max       int
	n         int
	chunks    [][]byte
	truncated *bool
}

func (o *outputBuffer) Write(p []byte) (int, error) {
	written := len(p)
	if room := o.max - o.n; len(p) > room {
		*o.truncated = true
		p = p[:room]
	}
	for len(p) > 0 {
		last := len(o.chunks) - 1
		if last < 0 || len(o.chunks[last]) == cap(o.chunks[last]) {
			size := min(outputChunkBytes, o.max-o.n)
			if err := o.call.reserve(o.ctx, int64(size)); err != nil {
				return 0, err
			}
			o.chunks = append(o.chunks, make([]byte, 0, size))
			last++
		}
		chunk := o.chunks[last]
		k := min(len(p), cap(chunk)-len(chunk))
		o.chunks[last] = append(chunk, p[:k]...)
		o.n += k
		p = p[k:]
	}
	return written, nil
}

// writeString writes the kept output as a string field of out, giving
// each chunk back to the budget once it is written.
func (o *outputBuffer) writeString(out *jsonStream, name string) {
	out.openString(name)
	for i, chunk := range o.chunks {
		out.stringPart(chunk)
		o.chunks[i] = nil
		o.call.release(int64(cap(chunk)))
	}
	o.chunks = nil
	out.closeString()
}
