package gateway

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errReadsClosed is the answer of a sharedRead once the gateway closes.
var errReadsClosed = errors.New("gateway closing: no more reads of the database")

// sharedRead makes the reads of the cluster's database that requests wait
// for when what the gateway holds may be older than they are: a sandbox
// made a moment ago, a node whose heartbeat just resumed. However many
// requests need one, a read is shared by all that wait for it, and reads
// begin at least gap apart, counted from the last one's start whether it
// gave an answer or failed: while the database fails, each request waiting
// is told so instead of asking again at once.
//
// A read runs on the gateway's context, bounded by timeout, not on any
// one request's: a request that goes away leaves it to those still
// waiting.
type sharedRead struct {
	// read reads the database and keeps what it read; readAt says when
	// the read that gave what is held began (reads made elsewhere, such
	// as a periodic refresh, count too).
	read   func(context.Context) error
	readAt func() time.Time

	gap     time.Duration
	timeout time.Duration
	// base ends when the gateway closes: a read waiting to begin then
	// ends without reading, and one under way is cancelled.
	base context.Context

	mu      sync.Mutex
	pending *readRound // the read requests wait for; nil when none is due
	last    time.Time  // when the last read was due to begin
	closed  bool
	running sync.WaitGroup
}

// readRound is one read: it begins at at, and done closes once it has
// ended, err then saying how.
type readRound struct {
	at   time.Time
	done chan struct{}
	err  error
}

func newSharedRead(read func(context.Context) error, readAt func() time.Time, gap, timeout time.Duration) *sharedRead {
	return &sharedRead{read: read, readAt: readAt, gap: gap, timeout: timeout, base: context.Background()}
}

// since returns once what is held was read by a read begun at or after
// asked. It waits for the read due, or has one made, gap after the last
// began; a read due that began before asked is not enough, and the next
// one is waited for, so a caller waits at most about two gaps and two
// reads. It returns the error of the read it waited for if that failed,
// ctx's if ctx ends first, and errReadsClosed once close was called.
func (s *sharedRead) since(ctx context.Context, asked time.Time) error {
	for {
		if !s.readAt().Before(asked) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return errReadsClosed
		}
		r := s.pending
		if r == nil {
			at := time.Now()
			if next := s.last.Add(s.gap); next.After(at) {
				at = next
			}
			r = &readRound{at: at, done: make(chan struct{})}
			s.pending, s.last = r, at
			s.running.Add(1)
			go s.run(r)
		}
		s.mu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil {
			return r.err
		}
		if !r.at.Before(asked) {
			return nil
		}
		// That read began before this call: the next one.
	}
}

// run makes read r once its time has come.
func (s *sharedRead) run(r *readRound) {
	defer s.running.Done()
	wait := time.NewTimer(time.Until(r.at)) // at most gap: the rate bound
	select {
	case <-wait.C:
	case <-s.base.Done():
		wait.Stop()
	}
	// Both may be ready at once: a gateway closing reads nothing more.
	if s.base.Err() != nil {
		r.err = errReadsClosed
	} else {
		ctx, cancel := context.WithTimeout(s.base, s.timeout)
		r.err = s.read(ctx)
		cancel()
	}
	s.mu.Lock()
	s.pending = nil
	s.mu.Unlock()
	close(r.done)
}

// close makes no more reads (base has ended or is about to: a read under
// way ends with it) and waits for those running.
func (s *sharedRead) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.running.Wait()
}
