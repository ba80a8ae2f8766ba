package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// The prepared pool keeps sandboxes made ahead of demand by the runtime's
// Prepare (for gVisor `runsc create`: the sandbox and gofer processes are
// up, nothing runs in them yet), per shape in use. A restore (a create from
// a snapshot, a fork child) or a boot the warm pool cannot serve claims one
// of its shape and only loads its image or starts envd in it: the part of
// a restore that does not depend on the image is done before the request
// comes. Unclaimed ones have no record and hold a network slot: a restart
// removes them as debris, a shutdown kills them, and a create that finds
// no free slot takes one from them.
//
// The pool adapts to demand. A shape's target grows to the largest burst
// seen (a fork of N asks for N, concurrent launches for as many as run at
// once, and a shape in use gets minPrepared at least), bounded over all
// shapes by PreparedMax and by PreparedMemMB of
// host memory; a shape unused for preparedIdle halves its target, so an
// idle node ends up keeping none. The filler makes one sandbox at a time
// and only while no launch is in progress, so refilling never competes
// with the requests it serves.

// preparedIdle is how long a shape goes unused before its target halves.
const preparedIdle = time.Minute

// minPrepared is the least target of a plain shape in use: with two,
// back-to-back launches find one ready while the next is being made (with
// one, every other launch came while its replacement was still in the
// making, and booted the ordinary way).
const minPrepared = 2

// prepKey is the shape a prepared sandbox fits: everything of its runtime
// spec but the ID and network namespace, which it brings itself. With an
// image, the sandbox is one step further: restored from that image (a
// snapshot template's), envd answering with token, and paused; a create
// from the template resumes it and gives it its identity (see
// launchRestored). Its processes see the time it waited in the pool as a
// pause, as after any pause and resume.
type prepKey struct {
	rootfs   string
	vcpu     int
	memoryMB int
	image    string
	token    string // envd's access token inside the image
	// unheld: rootfs is another node's template's, in the shared cache;
	// the sandboxes take no reference to it (see Manager.local).
	unheld bool
	// envd is the envd build mounted ("": the node's own); see envdOf.
	envd string
	// root is the root file system's form; see rootOf.
	root rootForm
}

// shape is the key of the plain prepared sandboxes a restored one of k is
// made from.
func (k prepKey) shape() prepKey {
	return prepKey{rootfs: k.rootfs, vcpu: k.vcpu, memoryMB: k.memoryMB, unheld: k.unheld, envd: k.envd, root: k.root}
}

type preparedSandbox struct {
	id   string
	slot *network.Slot
	envd *envdclient.Client // restored ones only
}

type preparedPool struct {
	driver runtime.Preparer
	// maxRestored bounds the restored sandboxes kept per snapshot image:
	// they hold the image's memory, so few are kept (0: none).
	maxRestored int
	pool        *pool[prepKey, *preparedSandbox]

	// making counts, per root filesystem, the sandboxes the filler is
	// making (each holds a reference to it); made is closed, and
	// replaced, whenever one is done. Both are guarded by pool.mu.
	making map[string]int
	made   chan struct{}
}

// preparedPolicy keeps, per shape in use, minPrepared plain sandboxes at
// least (restored ones hold an image's memory each, so only as many as
// were asked for at once), and none once idle; max over all shapes,
// memBytes of host memory for the plain ones, maxRestored per image.
type preparedPolicy struct {
	p           *preparedPool
	max         int
	memBytes    uint64
	maxRestored int
}

func (pp preparedPolicy) floor(k prepKey) int {
	if k.image != "" {
		return 0
	}
	return minPrepared
}

func (pp preparedPolicy) keep(prepKey) int { return 0 }

func (pp preparedPolicy) limit(k prepKey, _ uint64) int {
	if k.image != "" {
		return pp.maxRestored
	}
	return pp.max
}

// pick prefers restored sandboxes (they save the most), then the shape
// furthest from its target, within the count and memory budgets; it
// counts the one chosen as being made (see waitMade).
func (pp preparedPolicy) pick(shapes map[prepKey]*poolShape[*preparedSandbox], perItem uint64) (k prepKey, ok bool) {
	total := 0
	for _, s := range shapes {
		total += len(s.ready)
	}
	if total >= pp.max {
		return k, false
	}
	limit := pp.max
	if perItem > 0 {
		limit = min(limit, int(pp.memBytes/perItem))
	}
	deficit := 0
	for key, s := range shapes {
		if key.image == "" && total >= limit {
			continue
		}
		d := s.want - len(s.ready)
		if key.image != "" && d > 0 {
			d += pp.max
		}
		if d > deficit {
			k, deficit = key, d
		}
	}
	if deficit == 0 {
		return k, false
	}
	// Counted under the lock that forget takes: a delete that forgot
	// the shape then waits for this one (waitMade).
	pp.p.making[k.rootfs]++
	return k, true
}

// startPreparedPool starts the filler, unless the pool is off or the
// driver cannot prepare.
func (m *Manager) startPreparedPool() {
	prep, ok := m.driver.(runtime.Preparer)
	if !ok || m.cfg.PreparedMax <= 0 {
		return
	}
	p := &preparedPool{driver: prep, maxRestored: m.cfg.SnapshotPool, making: map[string]int{}, made: make(chan struct{})}
	p.pool = newPool(poolPolicy[prepKey, *preparedSandbox](preparedPolicy{p: p, max: m.cfg.PreparedMax,
		memBytes: uint64(m.cfg.PreparedMemMB) << 20, maxRestored: m.cfg.SnapshotPool}), preparedIdle)
	m.prep = p
	f := filler[prepKey, *preparedSandbox]{
		what:    "prepared pool",
		tracer:  m.cfg.Tracer,
		make:    m.prepareOne,
		done:    func(k prepKey) { p.doneMaking(k.rootfs) },
		discard: m.discardPrepared,
	}
	if !m.goOwned(func(ctx context.Context) { p.pool.fill(ctx, f, m.logger) }) {
		close(p.pool.done)
	}
}

// demand says that n launches of shape k are wanted at once.
func (p *preparedPool) demand(k prepKey, n int) {
	if p != nil {
		p.pool.demand(k, n)
	}
}

// begin counts a launch of shape k in progress and returns a prepared
// sandbox of that shape to use, or nil; end must follow.
func (p *preparedPool) begin(k prepKey) *preparedSandbox {
	if p == nil {
		return nil
	}
	ps, _ := p.pool.begin(k)
	return ps
}

func (p *preparedPool) end(k prepKey) {
	if p != nil {
		p.pool.end(k)
	}
}

// idle says whether no launch that uses the pool is in progress.
func (p *preparedPool) idle() bool {
	return p == nil || p.pool.idleNow()
}

// count is how many prepared sandboxes are ready.
func (p *preparedPool) count() int {
	if p == nil {
		return 0
	}
	ready, _ := p.pool.counts()
	return ready
}

// PreparedPoolStatus is the prepared pool's size, for metrics.
type PreparedPoolStatus struct {
	Ready  int // made ahead and unclaimed, all shapes
	Target int // what the pool fills to, all shapes
}

// PreparedPool reports the prepared pool's size; zero when it is off.
func (m *Manager) PreparedPool() PreparedPoolStatus {
	if m.prep == nil {
		return PreparedPoolStatus{}
	}
	ready, target := m.prep.pool.counts()
	return PreparedPoolStatus{Ready: ready, Target: target}
}

// forgetImage stops keeping sandboxes restored from image (its template
// was deleted) and returns those to remove.
func (p *preparedPool) forgetImage(image string) []*preparedSandbox {
	if p == nil {
		return nil
	}
	return p.pool.forget(func(k prepKey) bool { return k.image == image })
}

// forgetRootfs stops keeping sandboxes made from rootfs (its template is
// being deleted, or was) and returns those to remove.
func (p *preparedPool) forgetRootfs(rootfs string) []*preparedSandbox {
	if p == nil {
		return nil
	}
	return p.pool.forget(func(k prepKey) bool { return k.rootfs == rootfs })
}

// doneMaking ends what pick counted for a sandbox of rootfs.
func (p *preparedPool) doneMaking(rootfs string) {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	if p.making[rootfs]--; p.making[rootfs] <= 0 {
		delete(p.making, rootfs)
	}
	close(p.made)
	p.made = make(chan struct{})
}

// waitMade waits until the filler makes no sandbox from rootfs: once its
// shapes are forgotten, what is being made is discarded when done, and
// its reference dropped.
func (p *preparedPool) waitMade(ctx context.Context, rootfs string) error {
	if p == nil {
		return nil
	}
	for {
		p.pool.mu.Lock()
		n, made := p.making[rootfs], p.made
		p.pool.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-made:
		}
	}
}

func (m *Manager) prepareOne(ctx context.Context, k prepKey) error {
	if k.image != "" {
		return m.restoreOne(ctx, k)
	}
	p := m.prep
	slot, err := m.slots.Acquire(ctx)
	if err != nil {
		return err
	}
	id := NewID()
	if gone, err := m.holdForPrepared(ctx, k, id); err != nil || gone {
		m.releaseSlot(ctx, slot.Index, id)
		return err
	}
	spec := m.spec(id, &store.Template{RootfsPath: k.rootfs}, slot, k.vcpu, k.memoryMB, k.envd, k.root)
	spec.Background = true
	if err := p.driver.Prepare(ctx, spec); err != nil {
		m.releaseSlot(ctx, slot.Index, id)
		m.releasePrepared(ctx, &preparedSandbox{id: id})
		return err
	}
	ps := &preparedSandbox{id: id, slot: slot}
	if !p.pool.add(k, ps, m.memoryOf(ctx, id)) {
		m.discardPrepared(ctx, ps)
	}
	return nil
}

// restoreOne adds to the pool a sandbox restored from k's image and
// paused.
func (m *Manager) restoreOne(ctx context.Context, k prepKey) error {
	p := m.prep
	if err := m.holdImage(k.image); err != nil {
		// The template is gone: stop keeping its sandboxes.
		for _, ps := range p.forgetImage(k.image) {
			m.discardPrepared(ctx, ps)
		}
		return nil
	}
	defer m.dropImage(k.image)
	// A restored sandbox holds about the image's memory: keep one only
	// where it leaves most of the node's memory free.
	if avail, ok := memAvailable(); ok && 4*imageBytes(k.image) > avail {
		for _, ps := range p.forgetImage(k.image) {
			m.discardPrepared(ctx, ps)
		}
		return nil
	}
	ps, _ := p.pool.take(k.shape())
	var err error
	if ps != nil {
		err = p.driver.RestorePrepared(ctx, ps.id, k.image)
	} else {
		slot, aerr := m.slots.Acquire(ctx)
		if aerr != nil {
			return aerr
		}
		ps = &preparedSandbox{id: NewID(), slot: slot}
		if gone, herr := m.holdForPrepared(ctx, k, ps.id); herr != nil || gone {
			m.releaseSlot(ctx, slot.Index, ps.id)
			return herr
		}
		spec := m.spec(ps.id, &store.Template{RootfsPath: k.rootfs}, slot, k.vcpu, k.memoryMB, k.envd, k.root)
		spec.Background = true
		err = m.driver.Restore(ctx, spec, k.image)
	}
	if err != nil {
		m.releaseSlot(ctx, ps.slot.Index, ps.id)
		m.releasePrepared(ctx, ps)
		return err
	}
	ps.envd = envdclient.New(envdURL(ps.id, ps.slot.SandboxIP), m.http, k.token)
	err = m.waitReady(ctx, ps.envd)
	if err == nil {
		err = m.driver.Pause(ctx, ps.id)
	}
	if err != nil {
		m.discardPrepared(ctx, ps)
		return err
	}
	// Its memory is the image's, not a plain sandbox's: not measured.
	if !p.pool.add(k, ps, 0) {
		m.discardPrepared(ctx, ps)
	}
	return nil
}

// launchRestored turns a pooled sandbox restored from tpl's image into
// sb: resume, egress policy, envd identity, then the record, written once
// everything works, as for a warm sandbox.
func (m *Manager) launchRestored(ctx context.Context, sb *store.Sandbox, tpl *store.Template, ps *preparedSandbox) (*entry, error) {
	return m.adopt(ctx, sb, tpl, ps.slot, ps.envd,
		func(ctx context.Context) error { return m.driver.Resume(ctx, ps.id) },
		func(ctx context.Context) { m.discardPrepared(ctx, ps) }, "sandbox started from a restored one")
}

// memoryOf is the host memory instance id holds, 0 when unknown: what a
// pool measures its memory budget by.
func (m *Manager) memoryOf(ctx context.Context, id string) uint64 {
	st, err := m.driver.Stats(ctx, id)
	if err != nil {
		return 0
	}
	return st.MemoryBytes
}

// foreground gives a sandbox made for a pool (with Spec.Background) the
// CPU priority of the request that claimed it.
func (m *Manager) foreground(ctx context.Context, id string) error {
	prep, ok := m.driver.(runtime.Preparer)
	if !ok {
		return nil
	}
	return prep.Foreground(ctx, id)
}

// discardPrepared removes a prepared sandbox that will not be used.
func (m *Manager) discardPrepared(ctx context.Context, ps *preparedSandbox) {
	m.killInstance(ctx, ps.id)
	m.releaseSlot(ctx, ps.slot.Index, ps.id)
	m.releasePrepared(ctx, ps)
}

// holdForPrepared takes the reference of prepared sandbox id to k's root
// filesystem before the runtime uses it. gone: the template was deleted,
// and the pool stops keeping sandboxes of it.
func (m *Manager) holdForPrepared(ctx context.Context, k prepKey, id string) (gone bool, err error) {
	if k.unheld {
		return false, nil
	}
	err = m.store.HoldRootfs(ctx, store.RefPrepared, id, k.rootfs)
	if errors.Is(err, store.ErrNotFound) {
		for _, ps := range m.prep.forgetRootfs(k.rootfs) {
			m.discardPrepared(ctx, ps)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("prepared sandbox %s: %w", id, err)
	}
	return false, nil
}

// releasePrepared drops the reference of prepared sandbox ps: it was
// removed, or claimed by a sandbox whose record holds its own. One left
// by a store failure keeps the template from deletion until the next
// start, which drops them all.
func (m *Manager) releasePrepared(ctx context.Context, ps *preparedSandbox) {
	if err := m.store.ReleaseRefs(context.WithoutCancel(ctx), store.RefPrepared, ps.id); err != nil {
		m.logger.WarnContext(ctx, "release prepared sandbox's reference", "sandbox", ps.id, "err", err)
	}
}

// evictPrepared frees the slot of one prepared sandbox (of the shape with
// the most ready) for a launch that found none free, and holds that
// shape's target at what is left for preparedIdle, so that the filler
// does not take the slot back; false when there was none to take.
func (m *Manager) evictPrepared(ctx context.Context) bool {
	if m.prep == nil {
		return false
	}
	ps, ok := m.prep.pool.evict(time.Now())
	if !ok {
		return false
	}
	m.discardPrepared(context.WithoutCancel(ctx), ps)
	return true
}

// stopPreparedPool kills the unclaimed sandboxes; the filler must have
// stopped (its context ended).
func (m *Manager) stopPreparedPool(ctx context.Context) {
	p := m.prep
	if p == nil {
		return
	}
	<-p.pool.done
	for _, ps := range p.pool.drain() {
		m.discardPrepared(ctx, ps)
	}
}

// errNotPrepared marks a failure of a prepared sandbox, after which the
// launch is tried again the ordinary way.
var errNotPrepared = errors.New("prepared sandbox unusable")
