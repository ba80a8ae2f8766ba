package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aenv-dev/aenv/internal/meminfo"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// Fork makes Count children with the source's memory, processes and
// filesystem at this instant. Each gets its own network slot, address,
// envd token and deadline; the source keeps running. Children are
// restored in parallel; some may fail while others succeed. Children stay
// starting until the whole fork is done, so a crash before the answer
// leaves none (reconcile removes starting sandboxes), and a cancelled
// request takes its children down with it.
func (m *Manager) Fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	ctx, span := tracing.Child(ctx, "fork", attribute.String("aenv.fork.sandbox", req.SandboxID),
		attribute.String("aenv.fork.snapshot", req.SnapshotID), attribute.Int("aenv.fork.count", req.Count))
	results, err := m.fork(ctx, req)
	tracing.End(span, err)
	return results, err
}

func (m *Manager) fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	if err := requireCapability(m.driver.Capabilities().Fork, m.driver.Name(), "fork"); err != nil {
		return nil, err
	}
	if req.Count < 1 || req.Count > m.cfg.MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", node.ErrInvalid, m.cfg.MaxForkCount)
	}
	if req.Timeout < 0 || req.Timeout > m.cfg.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1 and %d seconds", node.ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	if len(req.CopyVolumes) > 0 {
		// Before the parent is stopped and its volumes frozen (or a
		// snapshot's): the slots (the memory is checked once the image is
		// taken).
		if err := m.checkCapacity(req.Count, 0); err != nil {
			return nil, err
		}
	}
	src, err := m.forkSource(ctx, req)
	if err != nil {
		return nil, err
	}
	defer src.release()
	if src.resumeParent != nil {
		// The children are restored from their own image, the parent
		// from its own beside them (the slot it let go is free for it:
		// the capacity was checked while it held it). The answer waits
		// for it.
		resumed := make(chan struct{})
		go func() {
			defer close(resumed)
			src.resumeParent()
		}()
		defer func() { <-resumed }()
	}
	if err := m.checkCapacity(req.Count, src.memoryBytes); err != nil {
		return nil, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = src.timeout
	}
	if timeout, err = m.checkTimeout(timeout); err != nil {
		return nil, err
	}

	if len(src.volumeMounts) == 0 && m.prep != nil {
		// Children with volumes take no pooled instance (see plan). The
		// key is the one the children's restores take (launch's plan):
		// with the envd and root form of the image.
		m.prep.demand(prepKey{rootfs: src.tpl.RootfsPath, vcpu: src.vcpu, memoryMB: src.memoryMB,
			unheld: !m.local(src.tpl), envd: m.envdOf(src.img.dir),
			root: m.rootOf(ctx, src.img.dir, src.tpl.RootfsPath)}, req.Count)
	}
	start := time.Now()
	results := make([]node.ForkResult, req.Count)
	children := make([]*entry, req.Count)
	clones := make([][]*store.Volume, req.Count) // each child's copies of volumes
	sem := make(chan struct{}, max(1, m.cfg.ForkParallelism))
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				results[i].Err = err
				return
			}
			now := time.Now().UTC()
			child := &store.Sandbox{
				TemplateID: src.tpl.ID, Alias: src.tpl.Name,
				VCPU: src.vcpu, MemoryMB: src.memoryMB, Metadata: src.metadata,
				EnvVars: src.envVars, AccessToken: newAccessToken(), AutoPause: src.autoPause,
				AutoPauseDropMemory: src.autoPauseDropMemory, AutoResume: src.autoResume,
				StartedAt: now, EndAt: now.Add(timeout), UpdatedAt: now, TimeoutSecs: int(timeout.Seconds()),
				Network: src.network, TeamID: src.team,
				// Shared: the children mount the parent's volumes.
				VolumeMounts: slices.Clone(src.volumeMounts),
			}
			if src.private {
				child.TrafficToken = newAccessToken()
			}
			if src.img.token == "" {
				child.AccessToken = "" // the children of an insecure sandbox are insecure too
			}
			var err error
			if clones[i], err = m.cloneVolumes(ctx, child, src.frozen); err != nil {
				results[i].Err = err
				return
			}
			e, err := m.launch(ctx, child, src.tpl, src.img, true)
			if err != nil {
				m.deleteClones(ctx, clones[i])
				results[i].Err = err
				return
			}
			children[i] = e
		}()
	}
	wg.Wait()
	ok := 0
	for i, e := range children {
		if e == nil {
			continue
		}
		err := ctx.Err()
		if err == nil {
			err = m.finish(ctx, e)
		}
		if err != nil {
			// The request is gone (or the record failed): nobody would
			// learn of this child.
			m.discard(ctx, e)
			m.deleteClones(ctx, clones[i])
			results[i].Err = err
			continue
		}
		results[i].Sandbox = cloneSandbox(e.view().sb)
		ok++
	}
	m.logger.InfoContext(ctx, "fork done", "source", src.name, "children", ok, "failed", req.Count-ok,
		"took", time.Since(start).Round(time.Millisecond))
	return results, nil
}

// discard removes a sandbox nobody was told about.
func (m *Manager) discard(ctx context.Context, e *entry) {
	ctx = context.WithoutCancel(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := m.release(ctx, e, "was discarded"); err != nil {
		m.logger.ErrorContext(ctx, "discard sandbox", "sandbox", e.id, "err", err)
		return
	}
	m.deleteRecord(ctx, e.id)
}

// forkSource is what children are restored from: the record they come
// from as it is stored (a snapshot, or the parent's template: its root
// filesystem and defaults), the checkpoint image taken of it, and the
// shape and settings the children inherit.
type forkSource struct {
	name      string
	tpl       *store.Template
	img       image
	vcpu      int
	memoryMB  int
	envVars   map[string]string
	metadata  map[string]string
	autoPause bool
	// autoPauseDropMemory and autoResume are the parent's lifecycle.
	autoPauseDropMemory, autoResume bool
	timeout                         time.Duration
	memoryBytes                     uint64 // resident memory of the source, to size the fork
	network                         *store.NetworkPolicy
	private                         bool
	team                            string // the children's
	volumeMounts                    []store.VolumeMount
	// frozen are the parent's volumes each child gets a copy of, by
	// mount path, frozen for it.
	frozen  map[string]*store.Volume
	release func()
	// resumeParent, if set, resumes the parent, stopped for the copies
	// of its volumes, once its image is taken (beside the children).
	resumeParent func()
}

func (m *Manager) forkSource(ctx context.Context, req node.ForkRequest) (_ *forkSource, err error) {
	if req.SnapshotID != "" {
		tpl, err := m.GetTemplate(ctx, req.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("%w: snapshot %q", node.ErrNotFound, req.SnapshotID)
		}
		if tpl.ImageDir == "" {
			return nil, fmt.Errorf("%w: template %q has no checkpoint to fork; create sandboxes from it instead", node.ErrInvalid, req.SnapshotID)
		}
		if err := snapshotVolumesUsable(tpl, req.TeamID); err != nil {
			return nil, err
		}
		frozen, err := m.freezeSnapshotCopies(ctx, tpl, req.CopyVolumes, req.CopySources)
		if err != nil {
			return nil, err
		}
		img, release, err := m.holdTemplateImage(ctx, tpl)
		if err != nil {
			m.releaseFrozen(context.WithoutCancel(ctx), frozen)
			return nil, err
		}
		return &forkSource{name: tpl.ID, tpl: tpl, img: img, vcpu: tpl.VCPU, memoryMB: tpl.MemoryMB,
			envVars: tpl.EnvVars, memoryBytes: imageBytes(img.dir), timeout: m.cfg.DefaultTimeout,
			team: req.TeamID, volumeMounts: tpl.VolumeMounts, frozen: frozen,
			release: func() {
				release()
				m.releaseFrozen(context.WithoutCancel(ctx), frozen)
			}}, nil
	}
	e, err := m.lock(ctx, req.SandboxID, opFork)
	if err != nil {
		return nil, err
	}
	// The parent is locked only while its image is taken.
	defer e.mu.Unlock()
	v := e.view()
	frozen, resume, err := m.freezeCopies(ctx, e, req.CopyVolumes)
	if err != nil {
		return nil, err
	}
	releaseFrozen := func() { m.releaseFrozen(context.WithoutCancel(ctx), frozen) }
	defer func() {
		if err != nil {
			releaseFrozen()
		}
	}()
	if resume != nil {
		defer func() {
			if err != nil {
				// The parent was stopped for the fork that failed: put it
				// back once its lock, held here, is let go.
				go resume()
			}
		}()
		v = e.view()
	}
	base, err := m.GetTemplate(ctx, v.sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("fork %s: template %s: %w", e.id, v.sb.TemplateID, err)
	}
	var mem uint64
	if v.slot != nil {
		if st, err := m.driver.Stats(ctx, e.id); err == nil {
			mem = st.MemoryBytes
		}
	}
	dir := filepath.Join(m.cfg.ImagesDir, "fork-"+NewID())
	opCtx, done := e.opContext(ctx)
	defer done()
	if err = m.imageOf(opCtx, e, dir); err != nil {
		return nil, err
	}
	if mem == 0 {
		mem = imageBytes(dir)
	}
	// The children keep the parent's template and its defaults; the image
	// is the parent's state now, and its shape and variables theirs.
	return &forkSource{
		name: e.id, tpl: base, img: image{dir: dir, token: v.sb.AccessToken},
		vcpu: v.sb.VCPU, memoryMB: v.sb.MemoryMB, envVars: v.sb.EnvVars, metadata: v.sb.Metadata, autoPause: v.sb.AutoPause,
		autoPauseDropMemory: v.sb.AutoPauseDropMemory, autoResume: v.sb.AutoResume,
		network: v.sb.Network, private: v.sb.TrafficToken != "", team: v.sb.TeamID, volumeMounts: v.sb.VolumeMounts,
		frozen: frozen, resumeParent: resume,
		timeout: time.Duration(v.sb.TimeoutSecs) * time.Second, memoryBytes: mem,
		// Restores load the image whole; it is not needed afterwards.
		release: func() {
			m.removeImage(context.WithoutCancel(ctx), dir)
			releaseFrozen()
		},
	}, nil
}

// releaseFrozen lets go of what the freezes of frozen made for their
// clones.
func (m *Manager) releaseFrozen(ctx context.Context, frozen map[string]*store.Volume) {
	for _, fv := range frozen {
		m.cfg.Volumes.Release(ctx, fv)
	}
}

// checkCapacity refuses a fork the node cannot hold, before anything is
// made: children need network slots and about the source's memory each.
func (m *Manager) checkCapacity(count int, perChild uint64) error {
	// Pooled sandboxes give up their slots to whoever needs one.
	if free := m.slots.Free() + m.prep.count() + m.WarmPool().Ready; free < count {
		return fmt.Errorf("%w: %d children need %d network slots, %d are free", node.ErrUnavailable, count, count, free)
	}
	if avail, ok := memAvailable(); ok && perChild > 0 {
		need := perChild * uint64(count)
		// Keep a tenth of the available memory for everything else.
		if need > avail-avail/10 {
			return fmt.Errorf("%w: %d children need about %d MiB of memory, the node has %d MiB available",
				node.ErrUnavailable, count, need>>20, avail>>20)
		}
	}
	return nil
}

// memAvailable is the memory the kernel can give without swapping, in
// bytes.
func memAvailable() (uint64, bool) {
	v, err := meminfo.Read("MemAvailable")
	return v, err == nil
}

// imageBytes is the size of the memory pages in a checkpoint image.
func imageBytes(dir string) uint64 {
	var total uint64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "pages") {
			total += uint64(info.Size())
		}
	}
	return total
}

// freezeCopies readies the copies of the volumes of parent e (locked)
// mounted at paths: each is frozen (its files become a layer its clones
// share), which needs the parent stopped, since a running sandbox would go
// on writing into the layer. A parent running or paused in memory is
// therefore written to disk first, and resume (nil if it was not running)
// starts it again, over its volumes as they are now. No other sandbox may
// mount a copied volume, unless volumes are in a pool (where a copy is a
// snapshot, and the parent is stopped so that its memory and its copies
// agree).
func (m *Manager) freezeCopies(ctx context.Context, e *entry, paths []string) (map[string]*store.Volume, func(), error) {
	if len(paths) == 0 {
		return nil, nil, nil
	}
	v := e.view()
	mounted := map[string]store.VolumeMount{}
	for _, mt := range v.sb.VolumeMounts {
		mounted[mt.Path] = mt
	}
	for _, p := range paths {
		if _, ok := mounted[p]; !ok {
			return nil, nil, fmt.Errorf("%w: sandbox %s mounts no volume at %s to copy", node.ErrInvalid, e.id, p)
		}
	}
	if m.cfg.Volumes == nil {
		return nil, nil, fmt.Errorf("%w: this node keeps no volumes", node.ErrInvalid)
	}
	// Refused before the parent is stopped when another sandbox mounts a
	// copied volume (they are all on this node); the freeze checks again.
	// A pool's copies are snapshots, which other writers do not reach.
	if !m.cfg.Volumes.Pooled() {
		if name, other := m.mountedBy(e, mounted, paths); other != "" {
			return nil, nil, fmt.Errorf("%w: volume %s is mounted by sandbox %s as well: a copy is made of a volume only its fork's parent mounts",
				node.ErrConflict, name, other)
		}
	}
	opCtx, done := e.opContext(ctx)
	defer done()
	var resume func()
	switch v.phase {
	case phaseRunning:
		before := v.sb
		if err := m.pauseLocked(opCtx, e, "is being forked with copies of its volumes"); err != nil {
			return nil, nil, err
		}
		if err := m.spillLocked(opCtx, e, false); err != nil {
			return nil, nil, m.unpauseLocked(opCtx, e, before, err)
		}
		resume = func() {
			ctx := context.WithoutCancel(ctx)
			// As any resume: a fresh deadline of the sandbox's lifetime.
			if _, _, err := m.Resume(ctx, e.id, 0, false); err != nil {
				m.logger.ErrorContext(ctx, "resume a sandbox after a fork with volume copies; it stays paused", "sandbox", e.id, "err", err)
			}
		}
	case phasePaused:
		if err := m.spillLocked(opCtx, e, false); err != nil {
			return nil, nil, err
		}
	}
	frozen := map[string]*store.Volume{}
	for _, p := range paths {
		fv, err := m.cfg.Volumes.Freeze(opCtx, mounted[p].VolumeID, e.id)
		if err != nil {
			m.releaseFrozen(ctx, frozen)
			if resume != nil {
				// The lock is held: resume once it is let go.
				go resume()
			}
			return nil, nil, err
		}
		frozen[p] = fv
	}
	return frozen, resume, nil
}

// freezeSnapshotCopies readies the copies of the volumes snapshot tpl
// mounts at paths, for a fork of it: each is frozen as it is now (a
// snapshot records its mounts, not their files), or, for a path sources
// names, that volume of this node instead (a copy brought from the
// snapshot's node). No sandbox may mount a copied volume, unless volumes
// are in a pool: a running sandbox would go on writing into the frozen
// layer. Another node's snapshot is forked here only with every volume a
// copy brought here.
func (m *Manager) freezeSnapshotCopies(ctx context.Context, tpl *store.Template, paths []string,
	sources map[string]string) (map[string]*store.Volume, error) {
	if m.cfg.Shared != nil && m.cfg.Shared.Remote(tpl) && len(tpl.VolumeMounts) > 0 {
		for _, mt := range tpl.VolumeMounts {
			if sources[mt.Path] == "" {
				// Unavailable, not a conflict: a gateway then offers it to
				// the next node, which may be the volumes'.
				return nil, fmt.Errorf("%w: snapshot %s mounts volumes of node %s: fork it there, or with every volume copied "+
					"through a gateway", node.ErrUnavailable, tpl.Name, tpl.NodeID)
			}
		}
	}
	if len(paths) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, fmt.Errorf("%w: this node keeps no volumes", node.ErrInvalid)
	}
	mounted := map[string]store.VolumeMount{}
	for _, mt := range tpl.VolumeMounts {
		if src := sources[mt.Path]; src != "" {
			mt.VolumeID = src
		}
		mounted[mt.Path] = mt
	}
	for _, p := range paths {
		if _, ok := mounted[p]; !ok {
			return nil, fmt.Errorf("%w: snapshot %s mounts no volume at %s to copy", node.ErrInvalid, tpl.ID, p)
		}
	}
	if !m.cfg.Volumes.Pooled() {
		// Refused with the sandbox named; the freeze checks again.
		if name, other := m.mountedBy(nil, mounted, paths); other != "" {
			return nil, fmt.Errorf("%w: volume %s is mounted by sandbox %s: a fork of a snapshot copies a volume "+
				"no sandbox mounts (kill or fork that sandbox instead), unless volumes are in a pool (--volume-pool-gb)",
				node.ErrConflict, name, other)
		}
	}
	// A source named by a gateway must be of the snapshot's team, checked
	// before it is frozen.
	for p, id := range sources {
		if _, err := m.cfg.Volumes.Get(ctx, tpl.TeamID, false, id); err != nil {
			return nil, fmt.Errorf("%w: copy source %s for %s: %v", node.ErrInvalid, id, p, err)
		}
	}
	frozen := map[string]*store.Volume{}
	for _, p := range paths {
		fv, err := m.cfg.Volumes.Freeze(ctx, mounted[p].VolumeID, "")
		if err != nil {
			m.releaseFrozen(context.WithoutCancel(ctx), frozen)
			return nil, err
		}
		// Its children's copies are named after the volume the
		// snapshot mounts, not the copy brought here.
		fv.Name = mounted[p].Name
		frozen[p] = fv
	}
	return frozen, nil
}

// mountedBy names a sandbox other than except (nil: none) that mounts one
// of the volumes mounted at paths, and that volume's name; "" for none.
func (m *Manager) mountedBy(except *entry, mounted map[string]store.VolumeMount, paths []string) (volume, sandbox string) {
	copied := make(map[string]string, len(paths))
	for _, p := range paths {
		copied[mounted[p].VolumeID] = mounted[p].Name
	}
	for _, other := range m.entries() {
		if other == except {
			continue
		}
		for _, mt := range other.view().sb.VolumeMounts {
			if name, ok := copied[mt.VolumeID]; ok {
				return name, other.id
			}
		}
	}
	return "", ""
}

// cloneVolumes gives child, about to be launched, its copies of the
// frozen volumes: each mount of one of them is of a new clone instead.
func (m *Manager) cloneVolumes(ctx context.Context, child *store.Sandbox, frozen map[string]*store.Volume) ([]*store.Volume, error) {
	var clones []*store.Volume
	for i, mt := range child.VolumeMounts {
		fv := frozen[mt.Path]
		if fv == nil {
			continue
		}
		c, err := m.cfg.Volumes.Clone(ctx, fv)
		if err != nil {
			m.deleteClones(ctx, clones)
			return nil, fmt.Errorf("copy volume %s for a child: %w", fv.Name, err)
		}
		clones = append(clones, c)
		child.VolumeMounts[i].VolumeID, child.VolumeMounts[i].Name = c.ID, c.Name
	}
	return clones, nil
}

// deleteClones deletes the volume copies of a child that was not made.
func (m *Manager) deleteClones(ctx context.Context, clones []*store.Volume) {
	for _, c := range clones {
		if err := m.cfg.Volumes.Delete(context.WithoutCancel(ctx), c); err != nil {
			m.logger.WarnContext(ctx, "delete the volume copy of a child that was not made", "volume", c.ID, "err", err)
		}
	}
}
