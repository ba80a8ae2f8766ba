package network

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestAcquireReleaseReuse(t *testing.T) {
	p := newTestPool(t, 24, 0)
	ctx := t.Context()

	a, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.Index != 0 || b.Index != 1 {
		t.Fatalf("indices = %d, %d; want 0, 1", a.Index, b.Index)
	}
	assertConfigured(t, a)
	assertConfigured(t, b)
	if got := p.Slot(a.Index); got == nil || *got != *a {
		t.Errorf("Slot(%d) = %+v, want %+v", a.Index, got, a)
	}

	// No warm pool: a released slot is destroyed, and its index is the next one out.
	if err := p.Release(ctx, a.Index); err != nil {
		t.Fatal(err)
	}
	assertGone(t, a)
	if got := p.Slot(a.Index); got != nil {
		t.Errorf("Slot(%d) after release = %+v, want nil", a.Index, got)
	}
	if err := p.Release(ctx, a.Index); err == nil {
		t.Error("second Release of the same index succeeded")
	}
	again, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if *again != *a {
		t.Errorf("reacquired %+v, want %+v", again, a)
	}
	assertConfigured(t, again)
}

func TestWarmPoolServesAcquire(t *testing.T) {
	p := newTestPool(t, 24, 1)
	ctx := t.Context()

	waitWarm(t, p, 1)
	first, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.Index != 0 {
		t.Fatalf("first index = %d, want 0 (the warm slot)", first.Index)
	}
	assertConfigured(t, first)
	waitWarm(t, p, 1) // index 1 now waits

	// The warm pool is full, so the released slot is destroyed ...
	if err := p.Release(ctx, first.Index); err != nil {
		t.Fatal(err)
	}
	assertGone(t, first)
	// ... and the next Acquire gets the warm index 1 while the filler recreates 0.
	second, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second.Index != 1 {
		t.Fatalf("second index = %d, want 1", second.Index)
	}
	assertConfigured(t, second)
	waitWarm(t, p, 1)
	assertConfigured(t, p.cfg.slot(0))
}

// runsc --network=sandbox removes eth0's address from the kernel's view; a released
// slot must come back fully configured.
func TestReleaseReconfiguresLostAddress(t *testing.T) {
	p := newTestPool(t, 29, 2) // two slots, both kept warm
	ctx := t.Context()

	waitWarm(t, p, 2)
	a, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(ctx); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Acquire on a full CIDR: err = %v, want ErrExhausted", err)
	}

	h := netlinkIn(t, a.NetnsPath)
	eth, err := h.LinkByName(sandboxIface)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrDel(eth, slotAddr(a.SandboxIP)); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(eth); err != nil {
		t.Fatal(err)
	}

	// The warm pool has room (exhaustion kept it empty), so the slot is kept.
	if err := p.Release(ctx, a.Index); err != nil {
		t.Fatal(err)
	}
	assertConfigured(t, a)
	again, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if *again != *a {
		t.Errorf("reacquired %+v, want %+v", again, a)
	}
}

func TestConcurrentAcquire(t *testing.T) {
	p := newTestPool(t, 20, 4)
	ctx := t.Context()
	const n = 30

	slots := make([]*Slot, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { slots[i], errs[i] = p.Acquire(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var indices []int
	for _, s := range slots {
		indices = append(indices, s.Index)
		assertConfigured(t, s)
	}
	slices.Sort(indices)
	if len(slices.Compact(slices.Clone(indices))) != n {
		t.Fatalf("indices not unique: %v", indices)
	}

	for i := range n {
		wg.Go(func() { errs[i] = p.Release(ctx, slots[i].Index) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, p, 4)
	if got := len(p.indicesIn(stateInUse)); got != 0 {
		t.Errorf("%d slots still in use after releasing all", got)
	}
}

// A crashed server leaves slots, a half-built veth and a netns without veth behind;
// the next Start keeps the in-use slots it is told about and removes the rest.
func TestStartRemovesDebris(t *testing.T) {
	crashed := newTestPool(t, 24, 2)
	ctx := t.Context()
	for range 3 {
		if _, err := crashed.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitWarm(t, crashed, 2)
	crashed.shutdown() // the process dies: nothing is cleaned up

	cfg := crashed.cfg
	loneVeth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.hostVethName(40)}, PeerName: cfg.Prefix + "40p"}
	if err := netlink.LinkAdd(loneVeth); err != nil {
		t.Fatal(err)
	}
	if err := createNamedNetns(cfg.slot(41).NetnsPath); err != nil {
		t.Fatal(err)
	}

	kept := cfg.slot(1)
	cfg.WarmPool = 0 // nothing new appears while the leftovers are listed
	restarted := startTestPool(t, cfg, []int{kept.Index})

	want := []string{"link " + kept.HostVeth, "netns " + kept.Netns, "nft table " + cfg.Prefix}
	if got := leftovers(t, cfg.Prefix); !slices.Equal(got, want) {
		t.Errorf("after Start: %v, want %v", got, want)
	}
	assertConfigured(t, kept)
	if got := restarted.Slot(kept.Index); got == nil || *got != *kept {
		t.Errorf("Slot(%d) = %+v, want %+v", kept.Index, got, kept)
	}
	if got := restarted.Slot(0); got != nil {
		t.Errorf("Slot(0) = %+v, want nil", got)
	}
	s, err := restarted.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Index == kept.Index {
		t.Errorf("Acquire handed out adopted index %d", s.Index)
	}
}

func TestCloseKeepsInUseSlots(t *testing.T) {
	p := newTestPool(t, 24, 2)
	ctx := t.Context()
	inUse, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, p, 2)
	warm := p.indicesIn(stateWarm)

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertConfigured(t, inUse)
	for _, i := range warm {
		assertGone(t, p.cfg.slot(i))
	}
	if _, err := p.Acquire(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: err = %v, want ErrClosed", err)
	}
}

func TestDestroyLeavesNothing(t *testing.T) {
	p := newTestPool(t, 24, 3)
	ctx := t.Context()
	for range 4 {
		if _, err := p.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, p.cfg.Prefix)
}

// A slot whose netns vanished while in use cannot be reset; Release removes what is
// left and frees the index.
func TestReleaseBrokenSlotDestroysIt(t *testing.T) {
	p := newTestPool(t, 24, 1)
	ctx := t.Context()
	waitWarm(t, p, 1)
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := deleteNamedNetns(s.NetnsPath); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, s.Index); err != nil {
		t.Fatal(err)
	}
	assertGone(t, s)
	waitWarm(t, p, 1)
	if got := len(p.indicesIn(stateInUse)); got != 0 {
		t.Errorf("%d slots in use after release, want 0", got)
	}
}
