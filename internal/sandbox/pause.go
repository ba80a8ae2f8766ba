package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"gvisor.dev/gvisor/pkg/cleanup"

	"github.com/aenv-dev/aenv/internal/diskspace"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// expire handles a deadline: the sandbox is paused when it asked for
// autoPause, killed otherwise. A kill that fails is retried with a
// growing delay, never in a tight loop.
func (m *Manager) expire(ctx context.Context, e *entry, seq uint64) {
	ctx, cancel := context.WithTimeout(ctx, backgroundOpTimeout)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.armed(seq) {
		return // stopped or replaced after it fired
	}
	v := e.view()
	if v.phase != phaseRunning {
		return
	}
	if time.Until(v.sb.EndAt) > 0 { // extended meanwhile
		e.settle()
		return
	}
	action := "kill"
	if v.sb.AutoPause {
		action = "pause"
	}
	ctx, span := m.cfg.Tracer.Background(ctx, "deadline: "+action, tracing.SandboxID.String(e.id))
	var err error
	defer func() { tracing.End(span, err) }()
	if v.sb.AutoPause {
		if err = m.pauseLocked(ctx, e, "reached its deadline and was paused"); err != nil {
			m.retryExpiry(e, "auto-pause at deadline", err)
			return
		}
		e.retry = 0
		if v.sb.AutoPauseDropMemory && m.driver.Capabilities().Checkpoint {
			// Its memory is not wanted: release it now. Should that fail,
			// the sandbox stays paused in memory and the spill timer
			// tries again later.
			if err := m.spillLocked(ctx, e, true); err != nil {
				m.logger.Error("pause without memory at deadline", "sandbox", e.id, "err", err)
			}
		}
		m.logger.Info("sandbox reached its deadline and was paused", "sandbox", e.id)
		return
	}
	if err = m.killLocked(ctx, e, "reached its deadline and was killed"); err != nil {
		if e.view().phase != phaseGone {
			m.retryExpiry(e, "kill expired sandbox", err)
			return
		}
		// Killed; only its record stayed (a full disk): reconcile removes it.
		m.logger.Error("delete expired sandbox record", "sandbox", e.id, "err", err)
	}
	m.logger.Info("sandbox timed out and was killed", "sandbox", e.id)
}

// retryExpiry schedules another expiry attempt after a failure, doubling
// the delay up to maxKillRetry; each failure is logged once per attempt,
// so at most once a minute once the delay is at its bound. e.mu held.
func (m *Manager) retryExpiry(e *entry, what string, err error) {
	e.retry = min(max(2*e.retry, time.Second), maxKillRetry)
	m.logger.Error(what+"; retrying", "sandbox", e.id, "in", e.retry, "err", err)
	e.arm(e.retry, m.expire)
}

// Pause freezes a running sandbox in memory. It uses no CPU while paused;
// after PauseToDiskAfter (or at once, see PauseOptions) it is written to
// disk and its memory released.
func (m *Manager) Pause(ctx context.Context, id string, opts node.PauseOptions) error {
	caps := m.driver.Capabilities()
	if err := requireCapability(caps.Pause, m.driver.Name(), "pause"); err != nil {
		return err
	}
	if opts.ToDisk || opts.DropMemory {
		if err := requireCapability(caps.Checkpoint, m.driver.Name(), "pause to disk"); err != nil {
			return err
		}
	}
	e, err := m.lock(ctx, id, opPause)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	opCtx, done := e.opContext(ctx)
	defer done()
	before := e.view().sb
	if err := m.pauseLocked(opCtx, e, "was paused"); err != nil {
		return err
	}
	if opts.ToDisk || opts.DropMemory {
		if err := m.spillLocked(opCtx, e, opts.DropMemory); err != nil {
			// One outcome for a failed call: the sandbox as it was.
			return m.unpauseLocked(opCtx, e, before, err)
		}
	}
	return nil
}

// unpauseLocked puts e, paused in memory by a pause to disk that then failed
// with cause, back to running with its record as before, and returns cause
// saying where the sandbox is: running, or (should that fail too) paused in
// memory, whole and resumable.
func (m *Manager) unpauseLocked(ctx context.Context, e *entry, before *store.Sandbox, cause error) error {
	// The call may have been cut; the sandbox must still be put back.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundOpTimeout)
	defer cancel()
	v := e.view()
	if v.phase != phasePaused {
		return fmt.Errorf("%w; the sandbox is %s", cause, v.phase)
	}
	if err := m.driver.Resume(ctx, e.id); err != nil {
		m.logger.ErrorContext(ctx, "resume after failed pause to disk", "sandbox", e.id, "err", err)
		return fmt.Errorf("%w; the sandbox stays paused in memory (resume it to continue)", cause)
	}
	restored := cloneSandbox(before)
	restored.State = phaseRunning.stored()
	restored.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, restored); err != nil {
		// The record says paused: pause the instance again so they agree.
		m.logger.ErrorContext(ctx, "record running after failed pause to disk", "sandbox", e.id, "err", err)
		if err := m.driver.Pause(ctx, e.id); err != nil {
			m.logger.ErrorContext(ctx, "pause again after failed record", "sandbox", e.id, "err", err)
		}
		return fmt.Errorf("%w; the sandbox stays paused in memory (resume it to continue)", cause)
	}
	e.transition(phaseRunning, restored, v.slot, v.envd, nil)
	m.logger.InfoContext(ctx, "sandbox running again after failed pause to disk", "sandbox", e.id, "err", cause)
	return fmt.Errorf("%w; the sandbox was not paused and is still running", cause)
}

func (m *Manager) pauseLocked(ctx context.Context, e *entry, why string) error {
	v := e.view()
	updated, err := e.next(phasePaused)
	if err != nil {
		return err
	}
	var undo cleanup.Cleanup
	defer undo.Clean()
	if err := m.driver.Pause(ctx, e.id); err != nil {
		return fmt.Errorf("pause %s: %w", e.id, err)
	}
	undo.Add(func() {
		// Not acknowledged: undo, so record and instance agree.
		if err := m.driver.Resume(context.WithoutCancel(ctx), e.id); err != nil {
			m.logger.ErrorContext(ctx, "resume after failed pause record", "sandbox", e.id, "err", err)
		}
	})
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return storeError("record paused sandbox", err)
	}
	undo.Release()
	e.transition(phasePaused, updated, v.slot, v.envd, stoppedError(e.id, why))
	m.logger.InfoContext(ctx, "sandbox paused", "sandbox", e.id)
	return nil
}

// Resume continues a paused sandbox with a fresh deadline of timeout (0:
// the lifetime it was created with). A sandbox paused to disk is restored
// into a new network slot. With reboot (or when it was paused without its
// memory) its processes are ended and its files kept. It reports whether
// the sandbox was paused. A failed resume leaves it paused as it was.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration, reboot bool) (*store.Sandbox, bool, error) {
	ctx, span := tracing.Child(ctx, "resume sandbox", tracing.SandboxID.String(id))
	sb, paused, err := m.resume(ctx, id, timeout, reboot)
	if span.IsRecording() {
		span.SetAttributes(attribute.Bool("aenv.resume.was_paused", paused))
	}
	tracing.End(span, err)
	return sb, paused, err
}

func (m *Manager) resume(ctx context.Context, id string, timeout time.Duration, reboot bool) (*store.Sandbox, bool, error) {
	e, err := m.lockEntry(ctx, id, opResume)
	if errors.Is(err, node.ErrNotFound) && m.cfg.Shared != nil {
		// Another node's, paused to disk, that node gone: take it over.
		switch terr := m.takeOver(ctx, id); {
		case terr == nil:
			e, err = m.lockEntry(ctx, id, opResume)
		case !errors.Is(terr, store.ErrNotFound):
			err = terr
		}
	}
	if err != nil {
		return nil, false, err
	}
	defer e.mu.Unlock()
	v := e.view()
	if v.phase == phaseRunning {
		return cloneSandbox(v.sb), false, nil // E2B's connect of a running sandbox
	}
	if err := allowed(opResume, id, v.phase); err != nil {
		return nil, false, err
	}
	if timeout == 0 {
		timeout = time.Duration(v.sb.TimeoutSecs) * time.Second
	}
	if timeout, err = m.checkTimeout(timeout); err != nil {
		return nil, false, err
	}
	opCtx, done := e.opContext(ctx)
	defer done()

	updated, err := e.next(phaseRunning)
	if err != nil {
		return nil, false, err
	}
	var undo cleanup.Cleanup
	defer undo.Clean()
	slot, envd := v.slot, v.envd
	if v.phase == phasePaused {
		if err := m.driver.Resume(opCtx, id); err != nil {
			return nil, false, fmt.Errorf("resume %s: %w", id, err)
		}
		undo.Add(func() {
			if err := m.driver.Pause(context.WithoutCancel(ctx), id); err != nil {
				m.logger.ErrorContext(ctx, "pause again after failed resume", "sandbox", id, "err", err)
			}
		})
		// Rules given while it was paused: its connections are
		// intercepted from now on, under a CA it must trust. (From disk,
		// bringUp's identify does it.)
		if err := m.trustEgressCA(opCtx, envd, updated); err != nil {
			return nil, false, fmt.Errorf("resume %s: %w", id, err)
		}
	} else {
		slot, envd, err = m.restoreFromDisk(opCtx, &undo, updated)
		if err != nil {
			return nil, false, err
		}
	}
	if filesystemOnly(v.sb.ImageDir) {
		updated.RebootOnResume = false // booted afresh: nothing to end
	} else if reboot || v.sb.RebootOnResume {
		if err := envd.Init(opCtx, envdclient.InitRequest{KillProcesses: true}); err != nil {
			return nil, false, envdRefusedServer("resume "+id+" without memory", err)
		}
		updated.RebootOnResume = false
	}
	now := time.Now().UTC()
	updated.EndAt = now.Add(timeout)
	updated.TimeoutSecs = int(timeout.Seconds())
	updated.UpdatedAt = now
	if err := m.store.UpdateSandbox(opCtx, updated); err != nil {
		return nil, false, storeError("record resumed sandbox", err)
	}
	undo.Release()
	if v.sb.ImageDir != "" {
		m.removeImage(ctx, v.sb.ImageDir)
		m.forgetUploaded(v.sb)
	}
	e.transition(phaseRunning, updated, slot, envd, nil)
	m.logger.InfoContext(ctx, "sandbox resumed", "sandbox", id)
	return cloneSandbox(updated), true, nil
}

// restoreFromDisk brings a sandbox paused to disk back up in a new slot;
// updated receives the new slot and loses the image reference. undo gets
// the steps that take the new instance down again; the image is kept
// until the resume is recorded.
func (m *Manager) restoreFromDisk(ctx context.Context, undo *cleanup.Cleanup, updated *store.Sandbox) (*network.Slot, *envdclient.Client, error) {
	tpl, err := m.GetTemplate(ctx, updated.TemplateID)
	if err != nil {
		return nil, nil, fmt.Errorf("resume %s: template %s: %w", updated.ID, updated.TemplateID, err)
	}
	slot, err := m.acquireSlot(ctx)
	if err != nil {
		return nil, nil, err
	}
	undo.Add(func() { m.releaseSlot(ctx, slot.Index, updated.ID) })
	updated.SlotIndex = slot.Index
	if err := m.applyNetwork(ctx, updated, slot); err != nil {
		return nil, nil, err
	}
	img := image{rootfsUpper: filepath.Join(updated.ImageDir, rootfsUpperFile)}
	if !filesystemOnly(updated.ImageDir) {
		img = image{dir: updated.ImageDir, token: updated.AccessToken, envd: m.envdOf(updated.ImageDir),
			root: m.rootOf(ctx, updated.ImageDir, tpl.RootfsPath)}
	}
	envd, err := m.bringUp(ctx, updated, tpl, slot, img)
	if err != nil {
		return nil, nil, fmt.Errorf("resume %s from disk: %w", updated.ID, err)
	}
	undo.Add(func() { m.killInstance(ctx, updated.ID) })
	updated.ImageDir = ""
	return slot, envd, nil
}

// spill writes a sandbox paused in memory to disk and releases its
// memory, CPU and network slot.
func (m *Manager) spill(ctx context.Context, e *entry, seq uint64) {
	ctx, cancel := context.WithTimeout(ctx, backgroundOpTimeout)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.armed(seq) {
		return // stopped or replaced after it fired
	}
	if e.view().phase != phasePaused {
		return
	}
	ctx, span := m.cfg.Tracer.Background(ctx, "pause to disk", tracing.SandboxID.String(e.id))
	opCtx, done := e.opContext(ctx)
	defer done()
	err := m.spillLocked(opCtx, e, false)
	tracing.End(span, err)
	if err != nil {
		m.logger.Error("pause to disk", "sandbox", e.id, "err", err)
	}
}

// spillLocked writes e, paused in memory, to disk; with dropMemory only
// its files are kept, and its next resume boots a fresh sandbox over them
// (or, on a runtime without filesystem snapshots, restores it and ends its
// processes). The checkpoint leaves the instance
// paused as it was: only once the image is complete and recorded is the
// instance stopped. A failed or interrupted spill (a full disk, a kill -9
// of the server) thus leaves the sandbox paused in memory, whole.
func (m *Manager) spillLocked(ctx context.Context, e *entry, dropMemory bool) error {
	start := time.Now()
	v := e.view()
	if err := allowed(opSpill, e.id, v.phase); err != nil {
		return err
	}
	dir := m.pauseImageDir(e.id)
	var err error
	if dropMemory && m.driver.Capabilities().FilesystemSnapshot {
		// Only the files are wanted: the resume boots afresh over them.
		err = m.exportFilesystem(ctx, e.id, dir)
		if err == nil {
			if err = m.checkBootable(ctx, v.sb, dir); err != nil {
				m.removeImage(ctx, dir)
			}
		}
	} else {
		err = m.checkpoint(ctx, e.id, dir, true)
	}
	if err != nil {
		return err
	}
	updated, err := e.next(phaseOnDisk)
	if err != nil {
		m.removeImage(ctx, dir)
		return err
	}
	updated.ImageDir = dir
	updated.SlotIndex = -1
	updated.RebootOnResume = updated.RebootOnResume || dropMemory
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		m.removeImage(ctx, dir)
		return storeError("record sandbox paused to disk", err)
	}
	e.transition(phaseOnDisk, updated, nil, nil, nil)
	// The image is the state now. An instance that will not die is
	// removed by the next reconcile (no record keeps it).
	if err := m.killInstance(ctx, e.id); err == nil {
		m.releaseSlotLater(v.slot.Index, e.id)
	}
	m.uploadPaused(ctx, updated)
	m.logger.InfoContext(ctx, "paused sandbox written to disk", "sandbox", e.id,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// pauseImageDir is where a sandbox paused to disk keeps its checkpoint; a
// fixed path lets reconcile find an image whose record update a crash cut.
func (m *Manager) pauseImageDir(id string) string {
	return filepath.Join(m.cfg.ImagesDir, "pause-"+id)
}

// completeMarker is written into an image dir once its checkpoint is whole.
const completeMarker = "aenv-complete"

// checkpoint saves sandbox id (memory, processes and files) into dir,
// made anew, complete or not at all.
func (m *Manager) checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	return m.writeImage(id, dir, "checkpoint", func(partial string) error {
		return m.driver.Checkpoint(ctx, id, partial, leaveRunning)
	})
}

// rootfsUpperFile is the tar of a sandbox's files in an image taken
// without its memory (E2B's keepMemory: false).
const rootfsUpperFile = "rootfs-upper.tar"

// exportFilesystem saves sandbox id's files, not its memory, into dir,
// made anew, complete or not at all. The sandbox is left as it was.
func (m *Manager) exportFilesystem(ctx context.Context, id, dir string) error {
	return m.writeImage(id, dir, "save the files of", func(partial string) error {
		if err := os.MkdirAll(partial, 0o700); err != nil {
			return err
		}
		return m.driver.ExportRootfs(ctx, id, filepath.Join(partial, rootfsUpperFile))
	})
}

// checkBootable refuses files a sandbox could not boot over (a /tmp the
// sandbox made a link to nowhere): paused without its memory, it could
// then never be resumed.
func (m *Manager) checkBootable(ctx context.Context, sb *store.Sandbox, dir string) error {
	tpl, err := m.GetTemplate(ctx, sb.TemplateID)
	if errors.Is(err, node.ErrNotFound) {
		// Its files alone could not be booted: the resume boots the
		// template's root filesystem under them.
		return fmt.Errorf("%w: cannot pause %s without its memory: its template %s is gone", node.ErrConflict, sb.ID, sb.TemplateID)
	}
	if err != nil {
		return fmt.Errorf("pause %s without memory: template %s: %w", sb.ID, sb.TemplateID, err)
	}
	if err := runtime.CheckTmpOver(tpl.RootfsPath, filepath.Join(dir, rootfsUpperFile)); err != nil {
		return fmt.Errorf("pause %s without memory: %w", sb.ID, err)
	}
	return nil
}

// filesystemOnly reports whether an image holds files without memory.
func filesystemOnly(dir string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, rootfsUpperFile))
	return err == nil
}

// writeImage runs write into dir+".partial" and renames it to dir once it
// is whole, with its completion marker; on failure nothing is left.
func (m *Manager) writeImage(id, dir, what string, write func(partial string) error) error {
	partial := dir + ".partial"
	os.RemoveAll(partial)
	if err := os.MkdirAll(m.cfg.ImagesDir, 0o700); err != nil {
		return classifyRuntimeError(fmt.Errorf("%s %s: %w", what, id, err))
	}
	if err := write(partial); err != nil {
		// runsc reports a full disk as a crash of its save, not as ENOSPC:
		// look at the disk itself before the partial image is removed.
		full := diskNearlyFull(partial)
		os.RemoveAll(partial)
		if full {
			return fmt.Errorf("%w: the disk holding %s is full; image of %s not written",
				node.ErrInsufficientStorage, m.cfg.ImagesDir, id)
		}
		return classifyRuntimeError(fmt.Errorf("%s %s: %w", what, id, err))
	}
	// Images hold the sandbox's memory or files: secrets. Readable by root
	// only, whatever the data dir's mode.
	if err := os.Chmod(partial, 0o700); err != nil {
		os.RemoveAll(partial)
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	if err := os.WriteFile(filepath.Join(partial, completeMarker), nil, 0o600); err != nil {
		os.RemoveAll(partial)
		return classifyRuntimeError(fmt.Errorf("%s %s: %w", what, id, err))
	}
	if err := os.Rename(partial, dir); err != nil {
		os.RemoveAll(partial)
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	return nil
}

// diskNearlyFull reports whether the filesystem holding dir has less than
// a mebibyte left.
func diskNearlyFull(dir string) bool {
	avail, _, err := diskspace.Free(dir)
	return err == nil && avail < 1<<20
}

func imageComplete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, completeMarker))
	return err == nil
}

func (m *Manager) removeImage(ctx context.Context, dir string) {
	if err := os.RemoveAll(dir); err != nil {
		m.logger.WarnContext(ctx, "remove checkpoint image", "dir", dir, "err", err)
	}
}

// uploadPaused queues the upload of the image of sb, just paused to disk,
// to the object store (if there is one), so that another node can resume
// it should this one be gone. Its template is shared with it: the root
// filesystem must be in the store too.
func (m *Manager) uploadPaused(ctx context.Context, sb *store.Sandbox) {
	if m.cfg.Shared == nil || len(sb.VolumeMounts) > 0 {
		// A sandbox that mounts volumes resumes only where they are:
		// another node could not take it over.
		return
	}
	tpl, err := m.GetTemplate(ctx, sb.TemplateID)
	if err != nil {
		m.logger.WarnContext(ctx, "upload of a paused sandbox: its template", "sandbox", sb.ID, "err", err)
		return
	}
	if tpl.Upload == store.UploadNone && !m.cfg.Shared.Remote(tpl) {
		if err := m.cfg.Shared.Share(tpl); err != nil {
			m.logger.WarnContext(ctx, "upload of a paused sandbox: share its template", "sandbox", sb.ID, "err", err)
			return
		}
		if err := m.store.PutTemplate(ctx, tpl); err != nil {
			m.logger.WarnContext(ctx, "upload of a paused sandbox: record its template", "sandbox", sb.ID, "err", err)
			return
		}
		m.share(ctx, tpl, "", nil)
	}
	m.cfg.Shared.UploadSandbox(sb, tpl.RootfsPath, tpl.RootfsID)
}

// forgetUploaded drops the stored image of sb, whose image on disk is
// gone (resumed or killed).
func (m *Manager) forgetUploaded(sb *store.Sandbox) {
	if m.cfg.Shared != nil {
		m.cfg.Shared.ForgetSandbox(sb.ID)
	}
}

// takeOver makes another node's sandbox paused to disk this node's, that
// node being gone: its image is fetched from the object store, its record
// claimed, and it is held here as paused on disk.
func (m *Manager) takeOver(ctx context.Context, id string) error {
	m.takeOverMu.Lock()
	defer m.takeOverMu.Unlock()
	if m.entry(id) != nil {
		return nil // taken over by a call just before
	}
	if err := os.MkdirAll(m.cfg.ImagesDir, 0o700); err != nil {
		return fmt.Errorf("take over %s: %w", id, err)
	}
	dir := m.pauseImageDir(id)
	// No record of this node names dir: what is there is debris.
	os.RemoveAll(dir)
	sb, err := m.cfg.Shared.TakeOver(ctx, id, dir)
	if err != nil {
		return err
	}
	e := newEntry(newView(phaseOnDisk, sb, nil, nil))
	m.register(e)
	e.mu.Lock()
	e.settle()
	e.mu.Unlock()
	m.logger.InfoContext(ctx, "took over a sandbox paused to disk", "sandbox", id)
	return nil
}
