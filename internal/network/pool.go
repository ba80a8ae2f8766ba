// Package network gives each sandbox its own network: a named network namespace with
// a veth pair and a unique /30, taken from a pool that keeps a few slots ready ahead
// of demand and reuses released ones. A host firewall keeps sandboxes away from the
// host and from each other.
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
)

// slotState is where a reserved index is in its life. Indices without a state are free.
type slotState int

const (
	stateBusy  slotState = iota // being created, reset or destroyed
	stateWarm                   // ready, waiting in the warm pool
	stateInUse                  // handed out by Acquire or adopted by Start
)

// Pool hands out network slots. Its methods are safe for concurrent use.
type Pool struct {
	cfg    Config
	logger *slog.Logger

	mu       sync.Mutex
	starting bool // Start was called
	started  bool // Start finished: slots may be handed out
	closed   bool
	state    map[int]slotState // every reserved index
	warm     int               // indices in stateWarm
	filling  int               // indices the filler is creating
	inflight sync.WaitGroup    // slot work started before closed was set
	fill     chan struct{}     // wakes the filler; capacity 1
	stop     context.CancelFunc
	stopped  chan struct{} // closed when the filler exits
	dns      []netip.Addr  // resolvers sandboxes may query, set by Start

	// policyMu serializes changes to slot policies with the in-use checks guarding
	// them, so a SetPolicy racing a Release cannot leave rules on a released slot.
	policyMu sync.Mutex
}

// NewPool checks cfg and returns a pool that touches nothing until Start.
func NewPool(ctx context.Context, cfg Config, logger *slog.Logger) (*Pool, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new network pool: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Pool{
		cfg:    cfg,
		logger: logger.With("component", "network", "prefix", cfg.Prefix),
		state:  make(map[int]slotState),
		fill:   make(chan struct{}, 1),
	}, nil
}

// Start adopts the slots in inUse (sandboxes that outlived a server restart), removes
// every other netns and veth carrying the prefix (debris of a crash), installs the
// host firewall (keeping the egress policies of the adopted slots, dropping all
// others), enables forwarding on the uplinks and starts filling the warm pool in the
// background, until Close, Destroy or the end of ctx. Call it once.
func (p *Pool) Start(ctx context.Context, inUse []int) error {
	p.mu.Lock()
	if p.starting || p.closed {
		p.mu.Unlock()
		return fmt.Errorf("start network pool: already started or closed")
	}
	for _, i := range inUse {
		if i < 0 || i >= p.cfg.capacity() {
			p.mu.Unlock()
			return fmt.Errorf("start network pool: in-use index %d outside %s", i, p.cfg.CIDR)
		}
	}
	p.starting = true
	for _, i := range inUse {
		p.state[i] = stateInUse
	}
	p.mu.Unlock()

	if err := prepareNetnsDir(); err != nil {
		return fmt.Errorf("start network pool: %w", err)
	}
	keep := make(map[int]bool, len(inUse))
	for _, i := range inUse {
		keep[i] = true
	}
	removed, err := removeSlotsExcept(p.cfg, keep)
	for _, what := range removed {
		p.logger.InfoContext(ctx, "removed leftover of an earlier run", "object", what)
	}
	if err != nil {
		return fmt.Errorf("start network pool: %w", err)
	}
	// After our own leftovers are gone, so that only the slots kept for adopted
	// sandboxes remain of ours, and before the firewall claims the range.
	if err := checkHostRange(p.cfg); err != nil {
		return fmt.Errorf("start network pool: %w", err)
	}
	if err := p.setUpHost(ctx, keep); err != nil {
		return fmt.Errorf("start network pool: %w", err)
	}
	for _, i := range inUse {
		if err := checkSlotExists(p.cfg.slot(i)); err != nil {
			// The sandbox manager's reconcile decides about the sandbox; its
			// Release removes what is left of the slot.
			p.logger.WarnContext(ctx, "adopted slot is incomplete", "slot", i, "err", err)
		}
	}
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	if p.cfg.WarmPool > 0 {
		p.startFiller(ctx)
	}
	return nil
}

// Acquire returns a slot for a new sandbox: a warm one if there is one, else one
// created now. Either way the lowest available index.
func (p *Pool) Acquire(ctx context.Context) (*Slot, error) {
	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	if i, ok := p.lowestWarmLocked(); ok {
		p.state[i] = stateInUse
		p.warm--
		p.mu.Unlock()
		p.wakeFiller()
		return p.cfg.slot(i), nil
	}
	i, err := p.reserveLocked()
	p.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	defer p.inflight.Done()
	p.wakeFiller()

	s := p.cfg.slot(i)
	if err := ctx.Err(); err != nil {
		p.free(i)
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	if err := createSlot(s); err != nil {
		p.free(i)
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	p.setState(i, stateInUse)
	return s, nil
}

// Slot describes an in-use index, or returns nil if index is not in use.
func (p *Pool) Slot(index int) *Slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.state[index]; !ok || st != stateInUse {
		return nil
	}
	return p.cfg.slot(index)
}

// Release takes back an in-use slot. It is reset (addresses, links, the host's
// neighbour and conntrack entries) and kept warm, or destroyed if the warm pool is
// full or the reset fails.
func (p *Pool) Release(ctx context.Context, index int) error {
	p.mu.Lock()
	if err := p.usableLocked(); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("release network slot %d: %w", index, err)
	}
	if st, ok := p.state[index]; !ok || st != stateInUse {
		p.mu.Unlock()
		return fmt.Errorf("release network slot %d: not in use", index)
	}
	p.state[index] = stateBusy
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	s := p.cfg.slot(index)
	p.policyMu.Lock()
	policyErr := removeSlotPolicy(p.cfg, index)
	if p.cfg.Egress != nil {
		// Whatever became of the rules: the sandbox is gone, and so must be
		// its connections through the gateway.
		p.cfg.Egress.ClearSlot(index)
	}
	p.policyMu.Unlock()
	if policyErr != nil {
		// Keep the index reserved: the next sandbox here would inherit the rules.
		// The next Start removes them.
		return fmt.Errorf("release network slot %d: %w", index, policyErr)
	}
	err := resetSlot(s)
	if err == nil {
		if forgetErr := forgetSandbox(s); forgetErr != nil {
			p.logger.DebugContext(ctx, "forget released sandbox", "slot", index, "err", forgetErr)
		}
		if p.keepWarm(index) {
			p.wakeFiller()
			return nil
		}
	} else {
		p.logger.WarnContext(ctx, "reset released slot; destroying it", "slot", index, "err", err)
	}
	if err := destroySlot(s); err != nil {
		// Keep the index reserved: its leftovers would clash with a new slot there.
		// The next Start removes them.
		return fmt.Errorf("release network slot %d: %w", index, err)
	}
	p.free(index)
	p.wakeFiller()
	return nil
}

// Close stops background work and destroys the warm slots. In-use slots stay: their
// sandboxes survive a server restart, and the next Start adopts them.
func (p *Pool) Close(ctx context.Context) error {
	p.shutdown()
	var errs []error
	for _, i := range p.indicesIn(stateWarm) {
		if err := destroySlot(p.cfg.slot(i)); err != nil {
			errs = append(errs, err)
			continue
		}
		p.free(i)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close network pool: %w", err)
	}
	return nil
}

// Destroy stops background work and removes everything carrying the prefix: every
// slot, in use or not, any debris, and the firewall.
func (p *Pool) Destroy(ctx context.Context) error {
	p.shutdown()
	var errs []error
	removed, err := removeSlotsExcept(p.cfg, nil)
	p.logger.DebugContext(ctx, "destroyed network pool", "removed", len(removed))
	if err != nil {
		errs = append(errs, err)
	}
	if err := removeFirewall(p.cfg.Prefix); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy network pool: %w", err)
	}
	p.mu.Lock()
	clear(p.state)
	p.warm = 0
	p.mu.Unlock()
	return nil
}

// shutdown marks the pool closed, stops the filler and waits for slot work in flight.
func (p *Pool) shutdown() {
	p.mu.Lock()
	p.closed = true
	stop, stopped := p.stop, p.stopped
	p.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	p.inflight.Wait()
}

func (p *Pool) usableLocked() error {
	if p.closed {
		return ErrClosed
	}
	if !p.started {
		return errors.New("network pool not started")
	}
	return nil
}

func (p *Pool) lowestWarmLocked() (int, bool) {
	if p.warm == 0 {
		return 0, false
	}
	lowest, found := 0, false
	for i, st := range p.state {
		if st == stateWarm && (!found || i < lowest) {
			lowest, found = i, true
		}
	}
	return lowest, found
}

// reserveLocked marks the lowest free index busy and counts it as work in flight;
// the caller must call p.inflight.Done when done with it.
func (p *Pool) reserveLocked() (int, error) {
	for i := range p.cfg.capacity() {
		if _, taken := p.state[i]; !taken {
			p.state[i] = stateBusy
			p.inflight.Add(1)
			return i, nil
		}
	}
	return 0, fmt.Errorf("all %d slots of %s taken: %w", p.cfg.capacity(), p.cfg.CIDR, ErrExhausted)
}

// keepWarm moves a busy index into the warm pool if there is room and reports whether
// it did.
func (p *Pool) keepWarm(index int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.warm >= p.cfg.WarmPool {
		return false
	}
	p.state[index] = stateWarm
	p.warm++
	return true
}

func (p *Pool) setState(index int, st slotState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state[index] = st
}

func (p *Pool) free(index int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state[index] == stateWarm {
		p.warm--
	}
	delete(p.state, index)
}

func (p *Pool) indicesIn(st slotState) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for i, s := range p.state {
		if s == st {
			out = append(out, i)
		}
	}
	return out
}
