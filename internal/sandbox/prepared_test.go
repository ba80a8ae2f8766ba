package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

func withPrepared(n int) func(*Config) {
	return func(c *Config) { c.PreparedMax, c.PreparedMemMB = n, 1024 }
}

// waitPrepared waits until the driver holds n prepared instances and the
// pool has all n ready (one still being made is on the driver's list but
// cannot be claimed yet).
func (w *world) waitPrepared(n int) []string {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids := w.driver.prepared()
		ready := w.m.PreparedPool().Ready
		if len(ids) == n && ready == n {
			return ids
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("prepared instances: %d, ready in the pool: %d, want %d", len(ids), ready, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForkChildrenUsePreparedSandboxes: a fork asks the pool for as many
// sandboxes as it has children; the next fork's children are restored into
// them, and each still gets its own token, slot and deadline. On a node
// that boots over root images, a checkpoint taken over the directory (the
// fake driver records no root image) restores over the directory: the
// fork asks for prepared sandboxes of that form, the one its children's
// restores take.
func TestForkChildrenUsePreparedSandboxes(t *testing.T) {
	for _, rootImage := range []bool{false, true} {
		t.Run(fmt.Sprintf("root image %v", rootImage), func(t *testing.T) {
			forkChildrenUsePrepared(t, rootImage)
		})
	}
}

func forkChildrenUsePrepared(t *testing.T, rootImage bool) {
	w := newWorld(t, withPrepared(8), func(c *Config) { c.RootImage = rootImage })
	parent := w.create()
	ctx := context.Background()
	if _, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 4}); err != nil {
		t.Fatal(err)
	}
	ready := 4
	if rootImage {
		ready += 2 // of the boots' form, which the parent's create used: a shape in use keeps two
	}
	prepared := w.waitPrepared(ready)
	restores, intoPrepared := w.faults.count("restore"), w.faults.count("restorePrepared")
	res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	tokens, slots := map[string]bool{parent.AccessToken: true}, map[int]bool{parent.SlotIndex: true}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("child: %v", r.Err)
		}
		c := r.Sandbox
		if !slices.Contains(prepared, c.ID) {
			t.Errorf("child %s was not one of the prepared sandboxes %v", c.ID, prepared)
		}
		if tokens[c.AccessToken] || slots[c.SlotIndex] {
			t.Errorf("child %s shares a token or slot", c.ID)
		}
		tokens[c.AccessToken], slots[c.SlotIndex] = true, true
		if rec := w.record(c.ID); rec == nil || rec.State != "running" || rec.EndAt.IsZero() {
			t.Errorf("child %s record: %+v", c.ID, rec)
		}
		if e := w.m.entry(c.ID); e == nil || e.timer == nil {
			t.Errorf("child %s has no deadline armed", c.ID)
		}
		if got := w.driver.state(c.ID); got != "running" {
			t.Errorf("child %s: runtime state %s", c.ID, got)
		}
	}
	if got := w.faults.count("restorePrepared") - intoPrepared; got != 4 {
		t.Errorf("restores into prepared sandboxes: %d, want 4", got)
	}
	if got := w.faults.count("restore"); got != restores {
		t.Errorf("ordinary restores during the second fork: %d, want 0", got-restores)
	}
}

// TestPreparedFailureFallsBack: a prepared sandbox whose restore or start
// fails is gone, and the launch is done the ordinary way instead.
func TestPreparedFailureFallsBack(t *testing.T) {
	for _, step := range []string{"restorePrepared", "startPrepared"} {
		t.Run(step, func(t *testing.T) {
			w := newWorld(t, withPrepared(4))
			ctx := context.Background()
			parent := w.create()
			w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 2)
			w.waitPrepared(2)
			w.faults.set(step, errInjected)
			var ids []string
			if step == "restorePrepared" {
				res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 2})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil {
						t.Fatalf("child: %v", r.Err)
					}
					ids = append(ids, r.Sandbox.ID)
				}
			} else {
				sb := w.create()
				ids = append(ids, sb.ID)
			}
			for _, id := range ids {
				if w.driver.state(id) != "running" || w.record(id) == nil {
					t.Errorf("sandbox %s is not running", id)
				}
			}
			w.faults.set(step, nil)
			for _, id := range append(ids, parent.ID) {
				if err := w.m.Kill(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			w.stop()
			w.stoppedEmpty()
		})
	}
}

// TestPreparedSandboxesGoAtRestartAndShutdown: prepared sandboxes have no
// record; after a crash the next start removes them with their slots, and
// a shutdown kills them.
func TestPreparedSandboxesGoAtRestartAndShutdown(t *testing.T) {
	w := newWorld(t, withPrepared(4))
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 3)
	before := w.waitPrepared(3)
	w.crash()
	for _, id := range before {
		if w.driver.state(id) != "" {
			t.Errorf("prepared sandbox %s survived the restart", id)
		}
	}
	w.settle(0)
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 2)
	w.waitPrepared(2)
	w.stop()
	w.stoppedEmpty()
}

// stoppedEmpty checks that a stopped manager left no instance, slot or
// record behind.
func (w *world) stoppedEmpty() {
	w.t.Helper()
	if ids := w.driver.ids(); len(ids) != 0 {
		w.t.Errorf("instances left: %v", ids)
	}
	if n := w.slots.inUse(); n != 0 {
		w.t.Errorf("slots left in use: %d", n)
	}
	all, _ := w.store.Store.ListSandboxes(context.Background(), store.SandboxFilter{})
	if len(all) != 0 {
		w.t.Errorf("records left: %d", len(all))
	}
}

// TestPreparedSandboxesGiveUpSlots: a launch that finds no free slot takes
// one from a prepared sandbox, and a fork counts them as free.
func TestPreparedSandboxesGiveUpSlots(t *testing.T) {
	w := newWorld(t, withPrepared(12), func(c *Config) { c.MaxForkCount = 16 })
	ctx := context.Background()
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 2, memoryMB: 1024}, 12)
	w.waitPrepared(12)
	// 4 slots are free; 6 sandboxes of another shape need 2 more.
	var ids []string
	for range 6 {
		sb, err := w.m.Create(ctx, createReq())
		if err != nil {
			t.Fatalf("create with prepared sandboxes holding the slots: %v", err)
		}
		ids = append(ids, sb.ID)
	}
	res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: ids[0], Count: 10})
	if err != nil {
		t.Fatalf("fork counting prepared slots as free: %v", err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("child: %v", r.Err)
		}
	}
	if _, err := w.m.Create(ctx, createReq()); !errors.Is(err, node.ErrUnavailable) {
		t.Errorf("create with every slot taken: %v, want unavailable", err)
	}
}

// TestPreparedPoolAdapts: targets grow with bursts, within the count and
// memory budgets, and halve for shapes idle long enough, giving their
// surplus back.
func TestPreparedPoolAdapts(t *testing.T) {
	a, b := prepKey{rootfs: "/a", vcpu: 1, memoryMB: 512}, prepKey{rootfs: "/b", vcpu: 1, memoryMB: 512}
	now := time.Now()
	tests := []struct {
		name        string
		max         int
		memMB       int
		perSandbox  uint64
		want        map[prepKey]int
		ready       map[prepKey]int
		lastUse     time.Time
		busy        int
		wantNext    bool
		wantKey     prepKey
		wantSurplus int
		wantTarget  map[prepKey]int
	}{
		{name: "deficit is filled", max: 8, memMB: 1024, want: map[prepKey]int{a: 4}, ready: map[prepKey]int{a: 1},
			lastUse: now, wantNext: true, wantKey: a, wantTarget: map[prepKey]int{a: 4}},
		{name: "largest deficit first", max: 8, memMB: 1024, want: map[prepKey]int{a: 2, b: 5}, ready: map[prepKey]int{a: 1, b: 1},
			lastUse: now, wantNext: true, wantKey: b, wantTarget: map[prepKey]int{a: 2, b: 5}},
		{name: "waits while launches run", max: 8, memMB: 1024, want: map[prepKey]int{a: 4}, ready: map[prepKey]int{},
			lastUse: now, busy: 1, wantTarget: map[prepKey]int{a: 4}},
		{name: "count budget", max: 3, memMB: 1024, want: map[prepKey]int{a: 3, b: 3}, ready: map[prepKey]int{a: 3},
			lastUse: now, wantTarget: map[prepKey]int{a: 3, b: 3}},
		{name: "memory budget", max: 8, memMB: 100, perSandbox: 40 << 20, want: map[prepKey]int{a: 4}, ready: map[prepKey]int{a: 2},
			lastUse: now, wantTarget: map[prepKey]int{a: 4}},
		{name: "idle shape halves and gives back", max: 8, memMB: 1024, want: map[prepKey]int{a: 8}, ready: map[prepKey]int{a: 8},
			lastUse: now.Add(-2 * preparedIdle), wantSurplus: 4, wantTarget: map[prepKey]int{a: 4}},
		{name: "idle shape ends at none", max: 8, memMB: 1024, want: map[prepKey]int{a: 1}, ready: map[prepKey]int{a: 1},
			lastUse: now.Add(-2 * preparedIdle), wantSurplus: 1, wantTarget: map[prepKey]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pp := &preparedPool{making: map[string]int{}, made: make(chan struct{})}
			p := newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{p: pp, max: tt.max,
				memBytes: uint64(tt.memMB) << 20}), preparedIdle)
			p.perItem, p.busy = tt.perSandbox, tt.busy
			for k, n := range tt.want {
				s := p.shape(k)
				s.want, s.lastUse = n, tt.lastUse
				for range tt.ready[k] {
					s.ready = append(s.ready, &preparedSandbox{id: NewID()})
				}
			}
			surplus, k, ok := p.next(now)
			if ok != tt.wantNext || (ok && k != tt.wantKey) {
				t.Errorf("next: %v %v, want %v %v", k, ok, tt.wantKey, tt.wantNext)
			}
			if ok && pp.making[k.rootfs] != 1 {
				t.Errorf("the sandbox next chose is not counted as being made: %v", pp.making)
			}
			if len(surplus) != tt.wantSurplus {
				t.Errorf("surplus: %d, want %d", len(surplus), tt.wantSurplus)
			}
			got := map[prepKey]int{}
			for k, s := range p.shapes {
				got[k] = s.want
			}
			if len(got) != len(tt.wantTarget) {
				t.Errorf("targets: %v, want %v", got, tt.wantTarget)
			}
			for k, n := range tt.wantTarget {
				if got[k] != n {
					t.Errorf("target of %v: %d, want %d", k, got[k], n)
				}
			}
		})
	}
}

// TestPreparedDemandIsBounded: a burst raises a shape's target to its
// size, never past the pool's maximum.
func TestPreparedDemandIsBounded(t *testing.T) {
	p := newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{max: 5}), preparedIdle)
	want := func(k prepKey) int {
		if s := p.shapes[k]; s != nil {
			return s.want
		}
		return 0
	}
	k := prepKey{rootfs: "/a", vcpu: 1, memoryMB: 512}
	p.demand(k, 3)
	if want(k) != 3 {
		t.Errorf("target after a burst of 3: %d", want(k))
	}
	p.demand(k, 1)
	if want(k) != 3 {
		t.Errorf("a smaller burst lowered the target to %d", want(k))
	}
	p.demand(k, 50)
	if want(k) != 5 {
		t.Errorf("target after a burst of 50: %d, want the maximum 5", want(k))
	}
	// One launch at a time still keeps two, so that back-to-back launches
	// find one ready while the next is made.
	single := prepKey{rootfs: "/b", vcpu: 1, memoryMB: 512}
	p.begin(single)
	p.end(single)
	if want(single) != minPrepared {
		t.Errorf("target of a shape used once: %d, want %d", want(single), minPrepared)
	}
	for range 4 {
		p.begin(k)
	}
	if p.busy != 4 || p.shapes[k].active != 4 {
		t.Errorf("launches counted: busy %d, active %d", p.busy, p.shapes[k].active)
	}
	for range 4 {
		p.end(k)
	}
	if p.busy != 0 || p.shapes[k].active != 0 || p.shapes[single].active != 0 {
		t.Errorf("launches left counted: busy %d", p.busy)
	}
}

// pooledRestored lists instances restored and paused by the pool: paused,
// with no record.
func (w *world) pooledRestored() []string {
	w.driver.mu.Lock()
	var ids []string
	for id, in := range w.driver.inst {
		if in.state == runtime.StatePaused {
			ids = append(ids, id)
		}
	}
	w.driver.mu.Unlock()
	var out []string
	for _, id := range ids {
		if w.record(id) == nil {
			out = append(out, id)
		}
	}
	return out
}

// TestCreateFromSnapshotResumesARestoredOne: once a snapshot template is
// in use, the pool keeps a sandbox restored from it and paused; the next
// create resumes that one and gives it its own token, slot and deadline.
// Deleting the template removes what the pool kept of it.
func TestCreateFromSnapshotResumesARestoredOne(t *testing.T) {
	w := newWorld(t, withPrepared(8), func(c *Config) { c.SnapshotPool = 2 })
	ctx := context.Background()
	src := w.create()
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: src.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.m.Create(ctx, node.CreateRequest{Template: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	var pooled []string
	waitFor(t, func() bool { pooled = w.pooledRestored(); return len(pooled) == 1 })
	resumes := w.faults.count("resume")
	second, err := w.m.Create(ctx, node.CreateRequest{Template: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != pooled[0] {
		t.Errorf("create from the snapshot made %s, not the pooled %s", second.ID, pooled[0])
	}
	if w.faults.count("resume") != resumes+1 {
		t.Errorf("the pooled sandbox was not resumed")
	}
	if second.AccessToken == first.AccessToken || second.SlotIndex == first.SlotIndex || second.SlotIndex == src.SlotIndex {
		t.Errorf("second create shares a token or slot: %+v", second)
	}
	w.driver.mu.Lock()
	in := w.driver.inst[second.ID]
	w.driver.mu.Unlock()
	if in == nil || in.state != runtime.StateRunning || in.token != second.AccessToken {
		t.Errorf("pooled sandbox after the create: %+v", in)
	}
	if e := w.m.entry(second.ID); e == nil || e.timer == nil || w.record(second.ID).State != store.StateRunning {
		t.Errorf("created sandbox is not running with a deadline")
	}
	waitFor(t, func() bool { return len(w.pooledRestored()) >= 1 })
	for _, id := range []string{first.ID, second.ID} {
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.m.DeleteTemplate(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(w.pooledRestored()) == 0 })
	if err := w.m.Kill(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.stoppedEmpty()
}

// TestPooledSandboxesRunInTheBackground: what the pools make ahead of
// demand (prepared and restored sandboxes) is made at background CPU
// priority, so that filling them takes only idle time, and every sandbox
// handed to a request was given the foreground first, whichever way it
// was made. When Foreground fails, the launch is done the ordinary way and
// the pooled sandbox is gone. (The warm pool's are checked in warm_test.go.)
func TestPooledSandboxesRunInTheBackground(t *testing.T) {
	w := newWorld(t, withPrepared(8), func(c *Config) { c.SnapshotPool = 1 })
	ctx := context.Background()
	// check: a sandbox with a record is never in the background; it
	// returns how many pooled ones are.
	check := func(when string) int {
		t.Helper()
		pooled := 0
		for id := range w.driver.background() {
			if w.record(id) != nil {
				t.Errorf("%s: sandbox %s was handed out at background priority", when, id)
			}
			pooled++
		}
		return pooled
	}
	src := w.create()
	ids := []string{src.ID}
	create := func(req node.CreateRequest) *store.Sandbox {
		t.Helper()
		sb, err := w.m.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		return sb
	}

	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: src.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	create(node.CreateRequest{Template: snap.ID})
	waitFor(t, func() bool { return len(w.pooledRestored()) == 1 })
	small := prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 256}
	w.m.prep.demand(small, 2)
	waitFor(t, func() bool {
		w.m.prep.pool.mu.Lock()
		defer w.m.prep.pool.mu.Unlock()
		s := w.m.prep.pool.shapes[small]
		return s != nil && len(s.ready) == 2
	})
	if n := check("pools filled"); n < 3 {
		t.Errorf("%d pooled sandboxes in the background, want the restored and the prepared ones (3 or more)", n)
	}

	foregrounds := w.faults.count("foreground")
	create(node.CreateRequest{Template: snap.ID}) // the restored one
	check("create from a snapshot")
	req := createReq()
	req.MemoryMB = 256
	create(req) // a prepared one, started
	check("create of another shape")
	if got := w.faults.count("foreground") - foregrounds; got != 2 {
		t.Errorf("Foreground calls for two pooled sandboxes: %d", got)
	}

	w.faults.set("foreground", errInjected)
	sb := create(req)
	check("create when Foreground fails")
	if w.driver.state(sb.ID) != runtime.StateRunning {
		t.Errorf("sandbox made after a failed Foreground: %s", w.driver.state(sb.ID))
	}
	w.faults.set("foreground", nil)
	for _, id := range ids {
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.m.DeleteTemplate(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.stoppedEmpty()
}

// TestClaimedPreparedSandboxGoesOnEarlyFailure: a launch that claimed a
// prepared sandbox and failed before booting it (here, its egress policy)
// removes the instance with its slot: the slot is free for another
// sandbox, and nothing is left in its network namespace.
func TestClaimedPreparedSandboxGoesOnEarlyFailure(t *testing.T) {
	w := newWorld(t, withPrepared(2))
	w.m.prep.demand(prepKey{rootfs: w.base.RootfsPath, vcpu: 1, memoryMB: 512}, 2)
	ids := w.waitPrepared(2)
	w.faults.set("policy", errInjected)
	_, err := w.m.Create(context.Background(), createReq())
	w.faults.set("policy", nil)
	if err == nil {
		t.Fatal("create succeeded despite the failing policy")
	}
	claimed := 0
	for _, id := range ids {
		if w.driver.state(id) == "" {
			claimed++
		}
	}
	ready := w.m.PreparedPool().Ready
	if claimed+ready < 2 || claimed == 0 {
		t.Errorf("after the failed create: %d prepared instances removed, %d still ready; want the claimed one removed", claimed, ready)
	}
	for _, id := range w.driver.ids() {
		if !slices.Contains(ids, id) && w.record(id) == nil {
			t.Errorf("instance %s left without a record", id)
		}
	}
	w.stop()
	w.stoppedEmpty()
}
