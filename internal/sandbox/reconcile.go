package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// Start reconciles the records with what the runtime and the kernel hold
// (after a clean stop or a kill -9 alike), then starts the monitor:
//   - running sandboxes whose instance still runs are adopted: exec works
//     and their deadlines fire again;
//   - records whose instance is gone are marked dead;
//   - records of half-created sandboxes are removed with their instance;
//   - instances, network slots, mounts and cgroups no record owns are removed.
func (m *Manager) Start(ctx context.Context) error {
	// Prepared sandboxes do not outlive the server (what is left of them
	// is debris), and neither do their references.
	if err := m.store.ReleaseRefs(ctx, store.RefPrepared, ""); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	records, err := m.store.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	instances, err := m.driver.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list runtime instances: %w", err)
	}
	state := map[string]runtime.State{}
	for _, in := range instances {
		state[in.ID] = in.State
	}

	keep := map[string]bool{}
	keepImages := map[string]bool{}
	var inUse []int
	var adopted []*store.Sandbox
	for _, sb := range records {
		switch sb.State {
		case store.StateStarting:
			m.logger.InfoContext(ctx, "reconcile: removing half-created sandbox", "sandbox", sb.ID)
			if err := m.store.DeleteSandbox(ctx, sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("reconcile: %w", err)
			}
		case store.StateRunning, store.StatePaused:
			adopt, err := m.reconcileRecord(ctx, sb, state[sb.ID])
			if err != nil {
				return err
			}
			if !adopt {
				continue
			}
			if sb.ImageDir != "" {
				keepImages[sb.ImageDir] = true
			} else {
				keep[sb.ID] = true
				inUse = append(inUse, sb.SlotIndex)
			}
			adopted = append(adopted, sb)
		}
	}
	if err := m.slots.Start(ctx, inUse); err != nil {
		return fmt.Errorf("reconcile: network slots: %w", err)
	}
	if err := m.driver.Cleanup(ctx, keep); err != nil {
		return fmt.Errorf("reconcile: runtime cleanup: %w", err)
	}
	if err := m.collectImages(ctx, keepImages); err != nil {
		return fmt.Errorf("reconcile: images: %w", err)
	}
	var entries []*entry
	for _, sb := range adopted {
		v := newView(phaseOnDisk, sb, nil, nil)
		if sb.ImageDir == "" {
			slot := m.slots.Slot(sb.SlotIndex)
			envd := envdclient.New(envdURL(sb.ID, slot.SandboxIP), m.http, sb.AccessToken)
			p := phasePaused
			if sb.State == store.StateRunning {
				p = phaseRunning
			}
			v = newView(p, sb, slot, envd)
			// The policy is the record's, whatever the firewall kept.
			if err := m.applyNetwork(ctx, sb, v.slot); err != nil {
				m.logger.ErrorContext(ctx, "reconcile: egress policy", "sandbox", sb.ID, "err", err)
			}
		}
		e := newEntry(v)
		entries = append(entries, e)
		m.register(e)
		if v.slot != nil {
			m.watch(e)
		}
		m.logger.InfoContext(ctx, "reconcile: adopted sandbox", "sandbox", sb.ID, "state", sb.State,
			"on_disk", sb.ImageDir != "", "endAt", sb.EndAt)
		if sb.ImageDir != "" && sb.ImageUpload != store.UploadUploaded {
			// An upload a stop cut short, or an image from before the
			// object store was configured.
			m.uploadPaused(ctx, sb)
		}
	}

	m.checkAdopted(ctx, entries)
	// Deadlines are armed once the runtime's repairs are done: a pause or
	// kill beside one would undo it (a second stop of a stopped kernel).
	for _, e := range entries {
		e.mu.Lock()
		e.settle()
		e.mu.Unlock()
	}

	m.monitorDone = make(chan struct{})
	if !m.goOwned(m.monitor) {
		close(m.monitorDone)
	}
	// The warm pool's filler reads m.prep: the prepared pool comes first.
	m.startPreparedPool()
	if err := m.startWarmPool(m.ctx); err != nil {
		return err
	}
	return nil
}

// reconcileRecord decides what a running or paused record becomes given
// the runtime's state of its instance; it updates the record and reports
// whether the sandbox is adopted.
func (m *Manager) reconcileRecord(ctx context.Context, sb *store.Sandbox, instance runtime.State) (bool, error) {
	// A crash between a spill's checkpoint and its record update leaves a
	// complete image at the fixed path: the sandbox is paused on disk.
	if sb.State == store.StatePaused && sb.ImageDir == "" && instance != runtime.StatePaused &&
		imageComplete(m.pauseImageDir(sb.ID)) {
		sb.ImageDir = m.pauseImageDir(sb.ID)
		sb.SlotIndex = -1
		return true, m.store.UpdateSandbox(ctx, sb)
	}
	switch {
	case sb.ImageDir != "":
		if imageComplete(sb.ImageDir) {
			return true, nil
		}
	case sb.SlotIndex >= 0 && (instance == runtime.StateRunning || instance == runtime.StatePaused):
		// The instance is the truth: a crash may have cut a pause or a
		// resume between the runtime and the record.
		want := store.StateRunning
		if instance == runtime.StatePaused {
			want = store.StatePaused
		}
		if sb.State != want {
			sb.State = want
			sb.UpdatedAt = time.Now().UTC()
			if err := m.store.UpdateSandbox(ctx, sb); err != nil {
				return false, fmt.Errorf("reconcile: %w", err)
			}
		}
		return true, nil
	}
	sb.State, sb.EndedReason, sb.SlotIndex, sb.ImageDir = store.StateDead, "sandbox was gone after a server restart", -1, ""
	sb.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return false, fmt.Errorf("reconcile: %w", err)
	}
	m.logger.WarnContext(ctx, "reconcile: sandbox gone", "sandbox", sb.ID)
	return false, nil
}

// adoptProbeTimeout bounds the first look at the envd of a sandbox
// adopted as running. A healthy one answers in milliseconds; one that does
// not is only examined further (see checkRunning), so the bound need not
// allow for the slowest machine.
const adoptProbeTimeout = 2 * time.Second

// adoptCheckParallel is how many adopted sandboxes are checked at once.
const adoptCheckParallel = 8

// checkAdopted makes sure that every sandbox adopted as running runs: a
// kill -9 can cut the runtime's pause between stopping the sandbox and
// recording it, leaving one recorded running in which every call would
// wait. It returns once each is answering, repaired or marked dead.
func (m *Manager) checkAdopted(ctx context.Context, entries []*entry) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, adoptCheckParallel)
	for _, e := range entries {
		if e.view().phase != phaseRunning {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			m.checkRunning(ctx, e)
		})
	}
	wg.Wait()
}

// checkRunning probes the envd of adopted sandbox e; if it does not
// answer, the runtime is asked to resume a sandbox stopped behind its back
// (runtime.Unfreezer). One the runtime finds running is kept (a slow
// machine, not a frozen sandbox), and so is one the runtime could not
// examine (a runtime slow under load, a sentry stopped on the host): it
// is marked silent, so that calls into it are answered 503 until it
// answers, and the monitor keeps trying. One resumed that stays silent,
// or whose instance is gone, is marked dead and removed, so that its
// state is told, not a hang.
func (m *Manager) checkRunning(ctx context.Context, e *entry) {
	v := e.view()
	err := m.probe(ctx, v.envd, adoptProbeTimeout)
	if err == nil {
		return
	}
	m.logger.WarnContext(ctx, "reconcile: adopted sandbox does not answer", "sandbox", e.id, "err", err)
	// The lifecycle lock keeps a pause, resume or kill from running
	// beside the runtime's repair.
	e.mu.Lock()
	defer e.mu.Unlock()
	if now := e.view(); now.phase != phaseRunning || now.run != v.run {
		return // paused, killed or expired meanwhile
	}
	reason := "sandbox did not answer after a server restart"
	if u, ok := m.driver.(runtime.Unfreezer); ok {
		ctx, cancel := e.opContext(ctx)
		defer cancel()
		resumed, err := u.Unfreeze(ctx, e.id)
		switch {
		case err != nil:
			sctx, cancel := context.WithTimeout(ctx, m.cfg.MonitorTimeout)
			state, serr := m.driver.State(sctx, e.id)
			cancel()
			if errors.Is(serr, runtime.ErrNotFound) || (serr == nil && state == runtime.StateStopped) {
				reason = "sandbox was gone after a server restart"
				break
			}
			m.logger.ErrorContext(ctx, "reconcile: unfreeze failed; keeping the sandbox, answering 503 until it answers",
				"sandbox", e.id, "err", err)
			reason := fmt.Sprintf("sandbox %s is not answering since the server restarted; it may be overloaded or hung", e.id)
			silent := fmt.Errorf("%w: %s", node.ErrUnavailable, reason)
			e.silent.Store(&silent)
			m.recordUnresponsive(ctx, e.id, reason)
			return
		case !resumed:
			m.logger.WarnContext(ctx, "reconcile: the runtime says the sandbox runs; keeping it", "sandbox", e.id)
			return
		default:
			if err := m.probe(ctx, v.envd, m.cfg.ReadyTimeout); err == nil {
				m.logger.WarnContext(ctx, "reconcile: resumed a sandbox left stopped by a pause cut short", "sandbox", e.id)
				return
			}
			reason = "sandbox was left stopped by a pause cut short and did not answer once resumed"
		}
	}
	m.markDead(ctx, e, reason)
}

// probe waits, within timeout, for envd to answer its health check.
func (m *Manager) probe(ctx context.Context, envd *envdclient.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return m.waitReady(ctx, envd)
}

// collectImages removes checkpoint images no template or sandbox refers
// to: partial ones a crash left, fork images, deleted snapshots.
func (m *Manager) collectImages(ctx context.Context, keep map[string]bool) error {
	if err := os.MkdirAll(m.cfg.ImagesDir, 0o700); err != nil {
		return err
	}
	templates, err := m.store.ListTemplates(ctx)
	if err != nil {
		return err
	}
	for _, t := range templates {
		if t.ImageDir == "" {
			continue
		}
		if !imageComplete(t.ImageDir) {
			m.logger.WarnContext(ctx, "reconcile: snapshot image missing; removing the snapshot", "template", t.ID)
			if err := m.store.DeleteTemplate(ctx, t.ID); err != nil {
				return err
			}
			continue
		}
		keep[t.ImageDir] = true
	}
	entries, err := os.ReadDir(m.cfg.ImagesDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		dir := filepath.Join(m.cfg.ImagesDir, e.Name())
		if !keep[dir] {
			m.logger.InfoContext(ctx, "reconcile: removing unreferenced image", "dir", dir)
			m.removeImage(ctx, dir)
		}
	}
	return nil
}

// monitor notices sandboxes that died on their own (OOM, init killed) and
// releases their resources; it also drops old records of dead sandboxes.
func (m *Manager) monitor(ctx context.Context) {
	defer close(m.monitorDone)
	ticker := time.NewTicker(m.cfg.MonitorInterval)
	defer ticker.Stop()
	var swept time.Time
	collected := time.Now() // the driver collected as it started
	var envdCollected time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		m.checkLiveness(ctx)
		m.pruneDead(ctx)
		if m.cfg.NodeID != "" && time.Since(swept) >= goneImagesSweep {
			m.sweepGoneImages(ctx)
			swept = time.Now()
		}
		if time.Since(collected) >= m.cfg.RootImageCollectInterval {
			m.collectRootImages(ctx)
			collected = time.Now()
		}
		// The driver does not collect the pinned envd builds as it starts:
		// the first tick does.
		if envdCollected.IsZero() || time.Since(envdCollected) >= m.cfg.RootImageCollectInterval {
			if n, err := m.collectEnvdBuilds(ctx); err != nil {
				m.logger.WarnContext(ctx, "envd builds: collect", "err", err)
			} else if n > 0 {
				m.logger.InfoContext(ctx, "envd builds: removed those unused", "removed", n)
			}
			envdCollected = time.Now()
		}
	}
}

// collectRootImages has a driver that runs sandboxes over root images
// remove those of deleted templates, which would otherwise stay on disk
// until the next start (a template's image is as large as its rootfs).
func (m *Manager) collectRootImages(ctx context.Context) {
	ri, ok := m.driver.(runtime.RootImager)
	if !ok {
		return
	}
	removed, err := ri.CollectRootImages(ctx)
	if err != nil {
		m.logger.WarnContext(ctx, "root images: collect", "err", err)
	} else if removed > 0 {
		m.logger.InfoContext(ctx, "root images: removed what no template needs", "removed", removed)
	}
}

// goneImagesSweep is how often a cluster node looks for template records
// of its own that went without it (sweepGoneImages).
const goneImagesSweep = time.Minute

// sweepGoneImages drops the checkpoint images of this node's templates
// whose records went without this node removing them: another node's
// snapshot or build that takes over a team's name (names are the
// cluster's) deletes this node's record, and only this node has the
// files. Only images a record named before the sweep's read are dropped
// (seen by the last sweep, or recorded by this node since: noteRecorded),
// so nothing on its way to a record is touched; an image a restore holds
// goes when the restore lets it go.
func (m *Manager) sweepGoneImages(ctx context.Context) {
	read := time.Now()
	templates, err := m.store.ListTemplates(ctx)
	if err != nil {
		m.logger.WarnContext(ctx, "sweep of replaced templates' images: list templates", "err", err)
		return
	}
	recorded := make(map[string]bool, len(templates))
	for _, t := range templates {
		if t.ImageDir != "" {
			recorded[t.ImageDir] = true
		}
	}
	var gone []string
	m.mu.Lock()
	for dir, at := range m.recordedImages {
		if !recorded[dir] && at.Before(read) {
			gone = append(gone, dir)
			delete(m.recordedImages, dir)
		}
	}
	for dir := range recorded {
		if _, ok := m.recordedImages[dir]; !ok {
			m.recordedImages[dir] = read
		}
	}
	m.mu.Unlock()
	for _, dir := range gone {
		m.logger.InfoContext(ctx, "removing the image of a template record deleted elsewhere", "dir", dir)
		m.dropImageOf(ctx, dir)
	}
}

// noteRecorded tells the sweep of gone records (sweepGoneImages) that a
// record of this node names dir now.
func (m *Manager) noteRecorded(dir string) {
	if m.cfg.NodeID == "" {
		return // a single server sweeps nothing: its records go through it
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recordedImages[dir] = time.Now()
}

func (m *Manager) checkLiveness(ctx context.Context) {
	var watched []*entry
	for _, e := range m.entries() {
		if v := e.view(); v.slot != nil && (v.phase == phaseRunning || v.phase == phasePaused) {
			watched = append(watched, e)
			// Sandboxes that came up since the last tick (or whose
			// instance the runtime could not watch then).
			m.watch(e)
			if v.phase == phaseRunning {
				m.checkAnswers(e)
			}
		}
	}
	if len(watched) == 0 {
		return
	}
	listCtx, cancel := context.WithTimeout(ctx, m.cfg.MonitorTimeout)
	instances, err := m.driver.List(listCtx)
	cancel()
	suspects := watched
	if err == nil {
		state := map[string]runtime.State{}
		for _, in := range instances {
			state[in.ID] = in.State
		}
		suspects = suspects[:0]
		for _, e := range watched {
			if s, ok := state[e.id]; !ok || s == runtime.StateStopped {
				suspects = append(suspects, e)
			}
		}
	} else {
		m.logger.WarnContext(ctx, "monitor: list runtime instances; checking each sandbox", "err", err)
	}
	// Each suspect on its own: one whose runtime hangs, or whose lifecycle
	// lock a long operation holds, does not delay the others' verdicts.
	for _, e := range suspects {
		m.goOwned(func(ctx context.Context) { m.checkOne(ctx, e) })
	}
}

// checkOne asks the runtime about one sandbox and, if it is gone, marks it
// dead. Only one check per sandbox runs at a time.
func (m *Manager) checkOne(ctx context.Context, e *entry) {
	if !e.checking.CompareAndSwap(false, true) {
		return
	}
	defer e.checking.Store(false)
	stateCtx, cancel := context.WithTimeout(ctx, m.cfg.MonitorTimeout)
	s, err := m.driver.State(stateCtx, e.id)
	cancel()
	if err == nil && s != runtime.StateStopped {
		return
	}
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		m.logger.WarnContext(ctx, "monitor: sandbox state", "sandbox", e.id, "err", err)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Look again under the lock: a kill, spill or resume may have raced.
	if v := e.view(); v.slot == nil || (v.phase != phaseRunning && v.phase != phasePaused) {
		return
	}
	stateCtx, cancel = context.WithTimeout(ctx, m.cfg.MonitorTimeout)
	s, err = m.driver.State(stateCtx, e.id)
	cancel()
	if errors.Is(err, runtime.ErrNotFound) || (err == nil && s == runtime.StateStopped) {
		m.markDead(ctx, e, "sandbox stopped on its own (out of memory, or its init process exited)")
	}
}

func (m *Manager) pruneDead(ctx context.Context) {
	dead, err := m.store.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateDead}})
	if err != nil {
		return
	}
	for _, sb := range dead {
		if time.Since(sb.UpdatedAt) > m.cfg.DeadRetention {
			m.store.DeleteSandbox(ctx, sb.ID)
		}
	}
}

// Shutdown stops the monitor, timers and every goroutine the manager
// started, and waits for them: after it returns nothing touches the store.
// Sandboxes keep running (the next start adopts them) unless killAll is
// set. Operations in progress are interrupted; ctx bounds the whole.
func (m *Manager) Shutdown(ctx context.Context, killAll bool) error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	entries := m.entries()
	for _, e := range entries {
		e.interrupt()
	}
	waited := make(chan struct{})
	go func() {
		m.owned.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("shutdown: background work did not finish: %w", ctx.Err())
	}
	m.stopWarmPool(ctx)
	m.stopPreparedPool(ctx)
	// Sandboxes are released side by side, so that one whose runtime
	// hangs costs one kill bound, not one per sandbox.
	var (
		errsMu sync.Mutex
		errs   []error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 8)
	)
	for _, e := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			e.mu.Lock()
			defer e.mu.Unlock()
			e.stopTimer()
			if !killAll || e.view().phase == phaseGone || ctx.Err() != nil {
				return
			}
			if err := m.killLocked(ctx, e, "was killed: the server stopped"); err != nil {
				errsMu.Lock()
				errs = append(errs, err)
				errsMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("shutdown: %w", err))
	}
	if killAll && len(errs) == 0 {
		// Nothing is kept: the driver removes its shared debris too.
		if err := m.driver.Cleanup(ctx, map[string]bool{}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
