package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/tracing"
)

// pool is the engine the warm and the prepared pools share: instances
// made ahead of demand, per shape K, that launches claim. It follows
// demand the same way for both:
//
//   - a launch of a shape counts as in progress from begin to end, served
//     or not, and raises the shape's target to the launches in progress at
//     once (and to the policy's floor for a shape in use);
//   - a shape with no launch for idle halves its target, down to what the
//     policy keeps when idle; one left with no target, instance or launch
//     is forgotten;
//   - an instance taken for a launch short of network slots holds its
//     shape's target at what is left for idle: the filler does not take
//     the slot back;
//   - one filler makes one instance at a time, of the shape the policy
//     picks, and only while no launch is in progress: refilling uses the
//     time the node has spare.
//
// What differs between the pools (their shapes, floors, limits and what
// to make next) is their policy.
type pool[K comparable, T any] struct {
	policy poolPolicy[K, T]
	idle   time.Duration

	mu     sync.Mutex
	shapes map[K]*poolShape[T]
	busy   int // launches in progress, all shapes
	// perItem is the most host memory one instance was seen to hold; 0
	// until one was measured.
	perItem uint64
	wake    chan struct{}
	done    chan struct{}
}

// poolShape is one shape's instances and demand; guarded by pool.mu.
type poolShape[T any] struct {
	ready  []T
	want   int // the target the filler makes instances to
	active int // launches of the shape in progress
	// lastUse is when a launch of the shape last began (or its target
	// last halved); lastEvict when one of its instances was last taken
	// for a launch short of slots.
	lastUse, lastEvict time.Time
}

// poolPolicy is what a pool decides for itself; its methods run with
// pool.mu held.
type poolPolicy[K comparable, T any] interface {
	// floor is the least target of a shape with a launch in progress.
	floor(k K) int
	// keep is the least target of an idle shape.
	keep(k K) int
	// limit is the most instances of k the pool keeps, given the memory
	// one was measured to hold (0: not yet measured).
	limit(k K, perItem uint64) int
	// pick chooses the shape the filler makes an instance of next, if
	// any; the pool is idle (no launch in progress) when it is asked.
	pick(shapes map[K]*poolShape[T], perItem uint64) (K, bool)
}

func newPool[K comparable, T any](policy poolPolicy[K, T], idle time.Duration) *pool[K, T] {
	return &pool[K, T]{policy: policy, idle: idle, shapes: map[K]*poolShape[T]{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// shape returns k's entry, made on first use; p.mu is held.
func (p *pool[K, T]) shape(k K) *poolShape[T] {
	s := p.shapes[k]
	if s == nil {
		s = &poolShape[T]{}
		p.shapes[k] = s
	}
	return s
}

func (p *pool[K, T]) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// begin counts a launch of k in progress and returns an instance of k
// ready for it, if any; end must follow.
func (p *pool[K, T]) begin(k K) (t T, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.shape(k)
	p.busy++
	s.active++
	s.want = min(p.policy.limit(k, p.perItem), max(s.want, s.active, p.policy.floor(k)))
	s.lastUse = time.Now()
	if len(s.ready) > 0 {
		t, s.ready = s.ready[0], s.ready[1:]
		ok = true
	}
	return t, ok
}

// end ends what begin counted.
func (p *pool[K, T]) end(k K) {
	p.mu.Lock()
	p.busy--
	if s := p.shapes[k]; s != nil {
		s.active--
	}
	p.mu.Unlock()
	p.poke()
}

// demand says that n launches of k are wanted at once (a fork of n).
func (p *pool[K, T]) demand(k K, n int) {
	p.mu.Lock()
	s := p.shape(k)
	s.want = min(p.policy.limit(k, p.perItem), max(s.want, n, p.policy.floor(k)))
	s.lastUse = time.Now()
	p.mu.Unlock()
	p.poke()
}

// idleNow says whether no launch is in progress.
func (p *pool[K, T]) idleNow() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy == 0
}

// counts returns the instances ready and the targets, all shapes.
func (p *pool[K, T]) counts() (ready, target int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.shapes {
		ready += len(s.ready)
		target += s.want
	}
	return ready, target
}

// next settles every shape (idle ones halve, surplus instances are
// returned for removal, forgotten shapes dropped) and says which shape,
// if any, to make an instance of.
func (p *pool[K, T]) next(now time.Time) (surplus []T, k K, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, s := range p.shapes {
		keep := p.policy.keep(key)
		if s.active == 0 && now.Sub(s.lastUse) >= p.idle && s.want > keep {
			s.want = max(keep, s.want/2)
			s.lastUse = now
		}
		if s.want < keep && now.Sub(s.lastEvict) >= p.idle {
			s.want = keep
		}
		s.want = min(s.want, p.policy.limit(key, p.perItem))
		if extra := len(s.ready) - s.want; extra > 0 {
			surplus = append(surplus, s.ready[len(s.ready)-extra:]...)
			s.ready = s.ready[:len(s.ready)-extra]
		}
		if s.want == 0 && keep == 0 && len(s.ready) == 0 && s.active == 0 {
			delete(p.shapes, key)
		}
	}
	if p.busy > 0 {
		return surplus, k, false
	}
	k, ok = p.policy.pick(p.shapes, p.perItem)
	return surplus, k, ok
}

// add puts a new instance of k in the pool, measured to hold mem bytes,
// unless its target dropped while it was made: then it reports false and
// the caller removes it.
func (p *pool[K, T]) add(k K, t T, mem uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.perItem = max(p.perItem, mem)
	s := p.shapes[k]
	if s == nil || len(s.ready) >= s.want {
		return false
	}
	s.ready = append(s.ready, t)
	return true
}

// take removes the newest ready instance of k, if any.
func (p *pool[K, T]) take(k K) (t T, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.shapes[k]
	if s == nil || len(s.ready) == 0 {
		return t, false
	}
	t, s.ready = s.ready[len(s.ready)-1], s.ready[:len(s.ready)-1]
	return t, true
}

// evict removes an instance for a launch that found no free network slot,
// from the shape with the most ready, and holds that shape's target at
// what it has left for p.idle.
func (p *pool[K, T]) evict(now time.Time) (t T, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *poolShape[T]
	for _, s := range p.shapes {
		if best == nil || len(s.ready) > len(best.ready) {
			best = s
		}
	}
	if best == nil || len(best.ready) == 0 {
		return t, false
	}
	t, best.ready = best.ready[len(best.ready)-1], best.ready[:len(best.ready)-1]
	best.want = len(best.ready)
	best.lastEvict = now
	return t, true
}

// forget drops the shapes match picks and returns their instances, for
// removal. A shape with launches in progress keeps counting them (their
// end balances their begin), with no target: it goes once idle.
func (p *pool[K, T]) forget(match func(K) bool) []T {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []T
	for k, s := range p.shapes {
		if !match(k) {
			continue
		}
		out = append(out, s.ready...)
		if s.active > 0 {
			s.ready, s.want = nil, 0
			continue
		}
		delete(p.shapes, k)
	}
	return out
}

// drain removes every ready instance, for a shutdown.
func (p *pool[K, T]) drain() []T {
	return p.forget(func(K) bool { return true })
}

// filler is what a pool's fill loop does with instances.
type filler[K comparable, T any] struct {
	what string // the pool's name, for logs
	// tracer traces each make (nil: off).
	tracer *tracing.Tracer
	// gate, if set, must also say yes before an instance is made.
	gate func() bool
	// make makes one instance of k and adds it to the pool (or removes it
	// if the pool no longer wants it); done, if set, follows each make.
	make    func(ctx context.Context, k K) error
	done    func(k K)
	discard func(ctx context.Context, t T)
}

// fill keeps the pool at its targets until ctx ends, then closes p.done.
// A failed make is retried after a pause, so that a broken template does
// not spin.
func (p *pool[K, T]) fill(ctx context.Context, f filler[K, T], logger *slog.Logger) {
	defer close(p.done)
	// The ticker shrinks idle shapes and retries while launches run.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		// Nothing new is started once shutdown began: what the pool
		// holds is removed by its stop, and a start would only race it.
		if ctx.Err() != nil {
			return
		}
		surplus, k, ok := p.next(time.Now())
		for _, t := range surplus {
			f.discard(ctx, t)
		}
		if ok && (f.gate == nil || f.gate()) {
			// Each sandbox made is a trace of its own: no request waits
			// on it, but its launch is the same work a create's is.
			mctx, span := f.tracer.Background(ctx, f.what+": make a sandbox")
			err := f.make(mctx, k)
			tracing.End(span, err)
			if f.done != nil {
				f.done(k)
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				logger.WarnContext(ctx, f.what+": making a sandbox failed", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Second):
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		}
	}
}
