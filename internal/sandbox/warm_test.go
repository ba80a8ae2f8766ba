package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

func TestWarmPoolAdapts(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name        string
		floor, max  int
		memMB       int
		perSandbox  uint64
		want, ready int
		active      int
		lastUse     time.Time
		lastEvict   time.Time
		wantBoot    bool
		wantSurplus int
		wantTarget  int
	}{
		{name: "fills to the target", floor: 2, max: 8, want: 5, ready: 1, lastUse: now, wantBoot: true, wantTarget: 5},
		{name: "waits while creates run", floor: 2, max: 8, want: 5, ready: 1, active: 1, lastUse: now, wantTarget: 5},
		{name: "full", floor: 2, max: 8, want: 5, ready: 5, lastUse: now, wantTarget: 5},
		{name: "memory budget caps the target", floor: 1, max: 8, memMB: 100, perSandbox: 30 << 20, want: 8, ready: 3,
			lastUse: now, wantTarget: 3},
		{name: "memory budget never below the floor", floor: 2, max: 8, memMB: 10, perSandbox: 30 << 20, want: 2, ready: 1,
			lastUse: now, wantBoot: true, wantTarget: 2},
		{name: "idle pool halves and gives back", floor: 2, max: 16, want: 16, ready: 16, lastUse: now.Add(-2 * warmIdle),
			wantSurplus: 8, wantTarget: 8},
		{name: "idle pool stops at the floor", floor: 2, max: 16, want: 3, ready: 3, lastUse: now.Add(-2 * warmIdle),
			wantSurplus: 1, wantTarget: 2},
		{name: "busy pool does not shrink", floor: 2, max: 16, want: 16, ready: 4, active: 2, lastUse: now.Add(-2 * warmIdle),
			wantTarget: 16},
		{name: "held below the floor after giving up slots", floor: 2, max: 16, want: 0, lastUse: now, lastEvict: now,
			wantTarget: 0},
		{name: "floor again a while after", floor: 2, max: 16, want: 0, lastUse: now, lastEvict: now.Add(-2 * warmIdle),
			wantBoot: true, wantTarget: 2},
	}
	key := warmKey{templateID: "base", vcpu: 1, memoryMB: 512}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := warmPolicy{key: key, least: tt.floor, max: tt.max, memBytes: uint64(tt.memMB) << 20}
			p := newPool(poolPolicy[warmKey, *warmSandbox](policy), warmIdle)
			p.perItem, p.busy = tt.perSandbox, tt.active
			s := p.shape(key)
			s.want, s.active, s.lastUse, s.lastEvict = tt.want, tt.active, tt.lastUse, tt.lastEvict
			for range tt.ready {
				s.ready = append(s.ready, &warmSandbox{id: NewID()})
			}
			surplus, k, boot := p.next(now)
			if boot && k != key {
				t.Errorf("next: boot of %v, not the pool's shape", k)
			}
			if boot != tt.wantBoot || len(surplus) != tt.wantSurplus || s.want != tt.wantTarget {
				t.Errorf("next: boot %v, surplus %d, target %d; want %v, %d, %d",
					boot, len(surplus), s.want, tt.wantBoot, tt.wantSurplus, tt.wantTarget)
			}
			if len(s.ready)+len(surplus) != tt.ready {
				t.Errorf("%d ready + %d surplus, had %d", len(s.ready), len(surplus), tt.ready)
			}
			if p.shapes[key] != s {
				t.Error("the warm shape was forgotten: its floor would never come back")
			}
		})
	}
}

// TestWarmPoolServesTheNextBurst: a burst of creates bigger than the pool
// grows it to the burst's size (bounded by WarmMax), the pool refills
// after the burst, and the next burst of that size is served from it; every sandbox handed out was given the foreground, and
// the pooled ones wait in the background.
func TestWarmPoolServesTheNextBurst(t *testing.T) {
	const burst = 6
	w := newWorld(t, func(c *Config) { c.WarmSandboxes, c.WarmMax = 1, burst })
	ctx := context.Background()
	waitFor(t, func() bool { return w.m.WarmPool() == WarmPoolStatus{Ready: 1, Target: 1} })

	createAll := func() []string {
		t.Helper()
		ids := make([]string, burst)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				sb, err := w.m.Create(ctx, createReq())
				if err != nil {
					t.Errorf("create: %v", err)
					return
				}
				ids[i] = sb.ID
			})
		}
		wg.Wait()
		return ids
	}
	// Creates held at their first step, so that all are in progress at
	// once whatever the scheduler does.
	release := make(chan struct{})
	w.driver.mu.Lock()
	w.driver.onInit = func(string) { <-release }
	w.driver.mu.Unlock()
	var first []string
	done := make(chan struct{})
	go func() { first = createAll(); close(done) }()
	waitFor(t, func() bool { return w.m.WarmPool().Target == burst })
	close(release)
	<-done
	waitFor(t, func() bool { return w.m.WarmPool() == WarmPoolStatus{Ready: burst, Target: burst} })
	pooled := w.driver.background()
	if len(pooled) != burst {
		t.Errorf("%d sandboxes in the background, want the %d pooled ones", len(pooled), burst)
	}

	// (The pool may start refilling between two of its creates; those
	// boots are the pool's, not the burst's.)
	second := createAll()
	for _, id := range second {
		if !pooled[id] {
			t.Errorf("sandbox %s of the second burst did not come from the pool", id)
		}
		if w.driver.background()[id] {
			t.Errorf("sandbox %s was handed out at background priority", id)
		}
	}
	for _, id := range append(first, second...) {
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	w.stop()
	w.stoppedEmpty()
}

// TestWarmSandboxesGiveUpSlots: a grown warm pool holds network slots only
// while nobody else needs them: launches of other shapes take them, the
// pool then stops refilling past what it has left, and a fork counts them
// as free.
func TestWarmSandboxesGiveUpSlots(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.WarmSandboxes, c.WarmMax, c.MaxForkCount = 1, 12, 16 })
	ctx := context.Background()
	w.m.warm.pool.demand(w.m.warm.key, 12)
	waitFor(t, func() bool { return w.m.WarmPool().Ready == 12 })
	// 4 of the 16 slots are free; 6 sandboxes of another shape need 2 more.
	req := createReq()
	req.MemoryMB = 256
	var ids []string
	for range 6 {
		sb, err := w.m.Create(ctx, req)
		if err != nil {
			t.Fatalf("create with warm sandboxes holding the slots: %v", err)
		}
		ids = append(ids, sb.ID)
	}
	if got := w.m.WarmPool(); got.Ready != 10 || got.Target != 10 {
		t.Errorf("warm pool after giving up 2 slots: %+v, want 10 ready and a target of 10", got)
	}
	// The fork takes the rest, below the floor; the pool does not take
	// them back.
	res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: ids[0], Count: 10})
	if err != nil {
		t.Fatalf("fork counting warm slots as free: %v", err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("child: %v", r.Err)
		}
	}
	if got := w.m.WarmPool(); got.Ready != 0 || got.Target != 0 {
		t.Errorf("warm pool after the fork took its slots: %+v, want it held empty", got)
	}
	if _, err := w.m.Create(ctx, req); !errors.Is(err, node.ErrUnavailable) {
		t.Errorf("create with every slot taken: %v, want unavailable", err)
	}
}

// TestLaunchTriesEachWayInTurn: a launch whose warm sandbox fails to be
// claimed, and then its prepared one, ends in a new instance; the sandbox
// has one ID throughout its record, driver and answer (the new
// instance's), and the two pooled ones are gone, with no record.
func TestLaunchTriesEachWayInTurn(t *testing.T) {
	w := newWorld(t, withPrepared(4), func(c *Config) { c.WarmSandboxes, c.WarmMax = 1, 1 })
	ctx := context.Background()
	waitFor(t, func() bool { return w.m.WarmPool().Ready == 1 })
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 2)
	w.waitPrepared(2)
	pooled := w.driver.background()
	if len(pooled) != 3 {
		t.Fatalf("%d pooled instances, want 1 warm and 2 prepared", len(pooled))
	}

	// Claiming a pooled instance starts by giving it the foreground;
	// a new one never asks.
	w.faults.set("foreground", errInjected)
	sb := w.create()
	w.faults.set("foreground", nil)
	if pooled[sb.ID] {
		t.Fatalf("sandbox %s is a pooled instance whose claim failed", sb.ID)
	}
	if got := w.faults.count("foreground"); got != 2 {
		t.Errorf("%d claims tried, want the warm one and a prepared one", got)
	}
	if rec := w.record(sb.ID); rec == nil || rec.State != store.StateRunning {
		t.Fatalf("record of %s: %+v", sb.ID, rec)
	}
	if w.driver.state(sb.ID) != runtime.StateRunning {
		t.Errorf("instance of %s: %s", sb.ID, w.driver.state(sb.ID))
	}
	gone := 0
	for id := range pooled {
		if w.record(id) != nil {
			t.Errorf("pooled instance %s has a record", id)
		}
		if w.driver.state(id) == "" {
			gone++
		}
	}
	if gone != 2 {
		t.Errorf("%d of the pooled instances removed, want the 2 whose claim failed", gone)
	}
	if err := w.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.stoppedEmpty()
}

// TestPlanAsksEachPoolOnce: a launch that tries again after a pooled
// sandbox failed does not ask the pools it asked before: each counts the
// launch once, so one create cannot raise a pool's target to two.
func TestPlanAsksEachPoolOnce(t *testing.T) {
	w := newWorld(t, withPrepared(4), func(c *Config) { c.WarmSandboxes, c.WarmMax = 1, 4 })
	ctx := context.Background()
	waitFor(t, func() bool { return w.m.WarmPool().Ready == 1 })
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 2)
	w.waitPrepared(2)
	key := w.m.warm.key
	ws, ok := w.m.warm.pool.take(key) // the warm pool is empty for this launch
	if !ok {
		t.Fatal("no warm sandbox to take")
	}
	defer w.m.discardWarm(ctx, ws)

	tpl, err := w.m.GetTemplate(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{VCPU: key.vcpu, MemoryMB: key.memoryMB}
	first := w.m.plan(ctx, sb, tpl, image{}, false, 0)
	if first.source != fromPrepared || first.asked != fromWarm|fromPrepared {
		t.Fatalf("first try: from %s, asked %b; want the prepared pool, having asked warm and prepared", first.source, first.asked)
	}
	second := w.m.plan(ctx, sb, tpl, image{}, false, first.asked)
	if second.source != fromNew || second.asked != 0 {
		t.Errorf("second try: from %s, asked %b; want a new instance, asking no pool again", second.source, second.asked)
	}
	w.m.warm.pool.mu.Lock()
	active := w.m.warm.pool.shapes[key].active
	w.m.warm.pool.mu.Unlock()
	if active != 1 {
		t.Errorf("the warm pool counts %d launches for one create", active)
	}
	second.end()
	first.end()
	w.m.discardPrepared(ctx, first.prepared)
}
