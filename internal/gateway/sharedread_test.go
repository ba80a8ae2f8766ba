package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// countedReads is a database for a sharedRead: each read takes took,
// fails while down is set, and records when it began.
type countedReads struct {
	took time.Duration

	mu     sync.Mutex
	down   bool
	began  []time.Time
	readAt time.Time // the start of the last read that did not fail
}

func (c *countedReads) read(ctx context.Context) error {
	c.mu.Lock()
	start := time.Now()
	c.began = append(c.began, start)
	down := c.down
	c.mu.Unlock()
	select {
	case <-time.After(c.took):
	case <-ctx.Done():
		return ctx.Err()
	}
	if down {
		return errors.New("connection refused")
	}
	c.mu.Lock()
	c.readAt = start
	c.mu.Unlock()
	return nil
}

func (c *countedReads) at() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readAt
}

func (c *countedReads) reads() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.began...)
}

const (
	testGap     = 250 * time.Millisecond
	testTimeout = time.Second
)

// Each case's time is synctest's: exact, so each count is exact.
func TestSharedRead(t *testing.T) {
	t.Run("callers at once share one read", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: 10 * time.Millisecond}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			asked := time.Now()
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					if err := s.since(t.Context(), asked); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if n := len(db.reads()); n != 1 {
				t.Errorf("20 callers at once made %d reads, want 1", n)
			}
			// What is held is fresh enough for them: no read.
			if err := s.since(t.Context(), asked); err != nil || len(db.reads()) != 1 {
				t.Errorf("a caller the held read serves: %v, %d reads", err, len(db.reads()))
			}
		})
	})
	t.Run("a read begun before the caller came is not enough", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: 100 * time.Millisecond}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			first := make(chan error, 1)
			go func() { first <- s.since(t.Context(), time.Now()) }()
			time.Sleep(50 * time.Millisecond) // the first read is under way
			asked := time.Now()
			if err := s.since(t.Context(), asked); err != nil {
				t.Fatal(err)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			reads := db.reads()
			if len(reads) != 2 {
				t.Fatalf("%d reads, want 2", len(reads))
			}
			if reads[1].Before(asked) || db.at().Before(asked) {
				t.Errorf("the second caller was served by a read begun at %v, before it asked at %v", db.at(), asked)
			}
			if d := reads[1].Sub(reads[0]); d != testGap {
				t.Errorf("reads %v apart, want the gap, %v", d, testGap)
			}
		})
	})
	t.Run("failing reads fail their waiters, a gap apart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: 10 * time.Millisecond, down: true}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			calls, failed := 0, 0
			for range 8 {
				wg.Go(func() {
					for time.Since(start) < 4*testGap {
						err := s.since(t.Context(), time.Now())
						mu.Lock()
						calls++
						if err != nil {
							failed++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			reads := db.reads()
			if want := int(time.Since(start)/testGap) + 1; len(reads) != want {
				t.Errorf("%d reads in %v while the database failed, want %d (one per gap)", len(reads), time.Since(start), want)
			}
			for i := 1; i < len(reads); i++ {
				if d := reads[i].Sub(reads[i-1]); d < testGap {
					t.Errorf("reads %d and %d %v apart, under the gap", i-1, i, d)
				}
			}
			if failed != calls {
				t.Errorf("%d of %d calls failed while every read did", failed, calls)
			}
			db.mu.Lock()
			db.down = false
			db.mu.Unlock()
			if err := s.since(t.Context(), time.Now()); err != nil {
				t.Errorf("the database back: %v", err)
			}
		})
	})
	t.Run("a caller gone leaves the read to those waiting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: 10 * time.Millisecond}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			s.last = time.Now() // the next read is due a gap from now
			ctx, gone := context.WithCancel(t.Context())
			first, second := make(chan error, 1), make(chan error, 1)
			go func() { first <- s.since(ctx, time.Now()) }()
			synctest.Wait()
			go func() { second <- s.since(t.Context(), time.Now()) }()
			synctest.Wait()
			gone()
			if err := <-first; !errors.Is(err, context.Canceled) {
				t.Errorf("the caller gone: %v, want its context's end", err)
			}
			if err := <-second; err != nil {
				t.Errorf("the caller waiting: %v", err)
			}
			if n := len(db.reads()); n != 1 {
				t.Errorf("%d reads, want 1", n)
			}
		})
	})
	t.Run("a read that hangs ends at its bound", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: time.Hour}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			start := time.Now()
			if err := s.since(t.Context(), start); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a hung read: %v, want its bound's end", err)
			}
			if took := time.Since(start); took != testTimeout {
				t.Errorf("a hung read ended after %v, want %v", took, testTimeout)
			}
		})
	})
	t.Run("closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db := &countedReads{took: 10 * time.Millisecond}
			s := newSharedRead(db.read, db.at, testGap, testTimeout)
			base, stop := context.WithCancel(t.Context())
			s.base = base
			s.last = time.Now()
			waiting := make(chan error, 1)
			go func() { waiting <- s.since(t.Context(), time.Now()) }()
			synctest.Wait() // its read waits for the gap
			stop()
			s.close()
			if err := <-waiting; !errors.Is(err, errReadsClosed) {
				t.Errorf("a caller waiting when the gateway closed: %v", err)
			}
			if err := s.since(t.Context(), time.Now()); !errors.Is(err, errReadsClosed) {
				t.Errorf("a caller after close: %v", err)
			}
			if n := len(db.reads()); n != 0 {
				t.Errorf("%d reads after the gateway closed, want 0", n)
			}
		})
	})
}
