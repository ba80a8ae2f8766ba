package sandbox

import (
	"testing"
	"time"
)

// TestPoolEvictHoldsTheShape: an instance taken for a launch short of
// slots comes from the shape with the most ready, and that shape's target
// stays at what is left until the pool has been idle a while, so that the
// filler does not take the slot straight back.
func TestPoolEvictHoldsTheShape(t *testing.T) {
	a, b := prepKey{rootfs: "/a", vcpu: 1, memoryMB: 512}, prepKey{rootfs: "/b", vcpu: 1, memoryMB: 512}
	pp := &preparedPool{making: map[string]int{}, made: make(chan struct{})}
	p := newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{p: pp, max: 8, memBytes: 1 << 30}), preparedIdle)
	now := time.Now()
	for k, n := range map[prepKey]int{a: 3, b: 1} {
		s := p.shape(k)
		s.want, s.lastUse = n, now
		for range n {
			s.ready = append(s.ready, &preparedSandbox{id: NewID()})
		}
	}
	if _, ok := p.evict(now); !ok {
		t.Fatal("nothing evicted")
	}
	if got := len(p.shapes[a].ready); got != 2 {
		t.Fatalf("shape a has %d ready after the eviction, want 2 (the most plentiful gives)", got)
	}
	surplus, k, ok := p.next(now)
	if ok || len(surplus) != 0 {
		t.Errorf("next after an eviction: makes %v (%v), surplus %d; want nothing", k, ok, len(surplus))
	}
	if p.shapes[a].want != 2 {
		t.Errorf("target of the shape that gave a slot: %d, want 2", p.shapes[a].want)
	}
	if p.shapes[b].want != 1 || len(p.shapes[b].ready) != 1 {
		t.Errorf("the shape that gave nothing: target %d, %d ready; want both 1", p.shapes[b].want, len(p.shapes[b].ready))
	}
}

// TestPoolIdleShapeNeverMadeShrinks: a shape whose target was raised but
// none of whose sandboxes was ever made (the filler failing, or busy)
// halves when idle like any other, and is forgotten at zero.
func TestPoolIdleShapeNeverMadeShrinks(t *testing.T) {
	k := prepKey{rootfs: "/a", vcpu: 1, memoryMB: 512}
	pp := &preparedPool{making: map[string]int{}, made: make(chan struct{})}
	p := newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{p: pp, max: 8, memBytes: 1 << 30}), preparedIdle)
	p.demand(k, 4)
	now := time.Now()
	for i, want := range []int{2, 1, 0} {
		now = now.Add(preparedIdle)
		p.busy = 1 // nothing is made: the shape only settles
		p.next(now)
		p.busy = 0
		s := p.shapes[k]
		if want == 0 {
			if s != nil {
				t.Fatalf("round %d: an idle shape with no target, sandbox or launch is kept: %+v", i, s)
			}
			break
		}
		if s == nil || s.want != want {
			t.Fatalf("round %d: target %v, want %d", i, s, want)
		}
	}
}

// TestPoolForgetDuringLaunch: a shape forgotten (its template deleted)
// while a launch of it is in progress keeps counting that launch, so that
// its end balances it; the shape then shrinks away when idle.
func TestPoolForgetDuringLaunch(t *testing.T) {
	k := prepKey{rootfs: "/a", vcpu: 1, memoryMB: 512, image: "/img"}
	pp := &preparedPool{making: map[string]int{}, made: make(chan struct{})}
	p := newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{p: pp, max: 8, memBytes: 1 << 30, maxRestored: 2}), preparedIdle)
	p.begin(k) // launch A
	p.shapes[k].ready = []*preparedSandbox{{id: NewID()}}
	if got := p.forget(func(prepKey) bool { return true }); len(got) != 1 {
		t.Fatalf("forget returned %d sandboxes, want the ready one", len(got))
	}
	p.begin(k) // launch B, after the forget
	p.end(k)
	p.end(k)
	if s := p.shapes[k]; s != nil && s.active != 0 {
		t.Fatalf("launches in progress after both ended: %d", s.active)
	}
	now := time.Now()
	for range 4 {
		now = now.Add(preparedIdle)
		p.busy = 1
		p.next(now)
		p.busy = 0
	}
	if s := p.shapes[k]; s != nil {
		t.Errorf("an idle forgotten shape is kept: %+v", *s)
	}
}
