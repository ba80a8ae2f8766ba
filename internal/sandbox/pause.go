package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/store"
)

// armTimer (re)starts the one timer of e for its state: the deadline of a
// running sandbox, or the spill to disk of one paused in memory. e.mu must
// be held or e not yet shared.
func (m *Manager) armTimer(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	id := e.sb.ID
	switch {
	case e.sb.State == store.StateRunning:
		e.timer = time.AfterFunc(time.Until(e.sb.EndAt), func() { m.expire(id) })
	case e.sb.State == store.StatePaused && e.sb.ImageDir == "" && m.cfg.PauseToDiskAfter > 0 &&
		m.driver.Capabilities().Checkpoint:
		wait := m.cfg.PauseToDiskAfter - time.Since(e.sb.UpdatedAt)
		e.timer = time.AfterFunc(wait, func() { m.spill(id) })
	}
}

// withLiveEntry runs fn on the live entry of id under its lock, in the
// background context of a timer.
func (m *Manager) withLiveEntry(id string, fn func(ctx context.Context, e *entry)) {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.gone {
		fn(ctx, e)
	}
}

// expire handles a deadline: the sandbox is paused when it asked for
// autoPause, killed otherwise.
func (m *Manager) expire(id string) {
	m.withLiveEntry(id, func(ctx context.Context, e *entry) {
		if e.sb.State != store.StateRunning {
			return
		}
		if wait := time.Until(e.sb.EndAt); wait > 0 { // extended meanwhile
			m.armTimer(e)
			return
		}
		if e.sb.AutoPause {
			if err := m.pauseLocked(ctx, e); err != nil {
				m.logger.Error("auto-pause at deadline", "sandbox", id, "err", err)
				return
			}
			m.logger.Info("sandbox reached its deadline and was paused", "sandbox", id)
			return
		}
		if err := m.release(ctx, e); err != nil {
			m.logger.Error("kill expired sandbox", "sandbox", id, "err", err)
			return
		}
		if err := m.store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			m.logger.Error("delete expired sandbox record", "sandbox", id, "err", err)
		}
		m.logger.Info("sandbox timed out and was killed", "sandbox", id)
	})
}

// PauseOptions change how a sandbox is paused.
type PauseOptions struct {
	// ToDisk writes it to disk at once and releases its memory (it comes
	// back whole on resume).
	ToDisk bool
	// DropMemory is E2B's keepMemory:false: released at once, and the
	// resume keeps the files but not the processes.
	DropMemory bool
}

// Pause freezes a running sandbox in memory. It uses no CPU while paused;
// after PauseToDiskAfter (or at once, see PauseOptions) it is written to
// disk and its memory released.
func (m *Manager) Pause(ctx context.Context, id string, opts PauseOptions) error {
	caps := m.driver.Capabilities()
	if err := requireCapability(caps.Pause, m.driver.Name(), "pause"); err != nil {
		return err
	}
	if opts.ToDisk || opts.DropMemory {
		if err := requireCapability(caps.Checkpoint, m.driver.Name(), "pause to disk"); err != nil {
			return err
		}
	}
	e, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if e.sb.State == store.StatePaused {
		return fmt.Errorf("%w: sandbox %s is already paused", ErrConflict, id)
	}
	if err := m.pauseLocked(ctx, e); err != nil {
		return err
	}
	if opts.ToDisk || opts.DropMemory {
		return m.spillLocked(ctx, e, opts.DropMemory)
	}
	return nil
}

func (m *Manager) pauseLocked(ctx context.Context, e *entry) error {
	if err := m.driver.Pause(ctx, e.sb.ID); err != nil {
		return fmt.Errorf("pause %s: %w", e.sb.ID, err)
	}
	updated := cloneSandbox(e.sb)
	updated.State = store.StatePaused
	updated.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		// Not acknowledged: undo, so record and instance agree.
		if rerr := m.driver.Resume(context.WithoutCancel(ctx), e.sb.ID); rerr != nil {
			m.logger.ErrorContext(ctx, "resume after failed pause record", "sandbox", e.sb.ID, "err", rerr)
		}
		return err
	}
	e.sb = updated
	m.armTimer(e)
	m.logger.InfoContext(ctx, "sandbox paused", "sandbox", e.sb.ID)
	return nil
}

// Resume continues a paused sandbox with a fresh deadline of timeout (0:
// the lifetime it was created with). A sandbox paused to disk is restored
// into a new network slot. With reboot (or when it was paused without its
// memory) its processes are ended and its files kept. It reports whether
// the sandbox was paused.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration, reboot bool) (*store.Sandbox, bool, error) {
	e, err := m.lookup(ctx, id)
	if err != nil {
		return nil, false, err
	}
	defer e.mu.Unlock()
	if timeout == 0 {
		timeout = time.Duration(e.sb.TimeoutSecs) * time.Second
	}
	if timeout, err = m.checkTimeout(timeout); err != nil {
		return nil, false, err
	}
	if e.sb.State == store.StateRunning {
		return cloneSandbox(e.sb), false, nil
	}
	updated := cloneSandbox(e.sb)
	if e.sb.ImageDir == "" {
		if err := m.driver.Resume(ctx, id); err != nil {
			return nil, false, fmt.Errorf("resume %s: %w", id, err)
		}
	} else if err := m.restoreFromDisk(ctx, e, updated); err != nil {
		return nil, false, err
	}
	if reboot || e.sb.RebootOnResume {
		if err := e.envd.Init(ctx, envdclient.InitRequest{KillProcesses: true}); err != nil {
			return nil, false, fmt.Errorf("resume %s without memory: %w", id, err)
		}
		updated.RebootOnResume = false
	}
	now := time.Now().UTC()
	updated.State = store.StateRunning
	updated.EndAt = now.Add(timeout)
	updated.TimeoutSecs = int(timeout.Seconds())
	updated.UpdatedAt = now
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return nil, false, err
	}
	if e.sb.ImageDir != "" {
		m.removeImage(ctx, e.sb.ImageDir)
	}
	e.sb = updated
	m.armTimer(e)
	m.logger.InfoContext(ctx, "sandbox resumed", "sandbox", id)
	return cloneSandbox(updated), true, nil
}

// restoreFromDisk brings a sandbox paused to disk back up in a new slot;
// updated receives the new slot and loses the image reference.
func (m *Manager) restoreFromDisk(ctx context.Context, e *entry, updated *store.Sandbox) error {
	tpl, err := m.templates.Get(ctx, e.sb.TemplateID)
	if err != nil {
		return fmt.Errorf("resume %s: template %s: %w", e.sb.ID, e.sb.TemplateID, err)
	}
	slot, err := m.acquireSlot(ctx)
	if err != nil {
		return err
	}
	updated.SlotIndex = slot.Index
	if err := m.applyNetwork(ctx, updated, slot); err != nil {
		m.releaseSlot(ctx, slot.Index, e.sb.ID)
		return err
	}
	envd, err := m.bringUp(ctx, updated, tpl, slot, e.sb.ImageDir, e.sb.AccessToken)
	if err != nil {
		m.releaseSlot(ctx, slot.Index, e.sb.ID)
		return fmt.Errorf("resume %s from disk: %w", e.sb.ID, err)
	}
	e.slot, e.envd = slot, envd
	updated.ImageDir = ""
	return nil
}

// spill writes a sandbox paused in memory to disk and releases its
// memory, CPU and network slot.
func (m *Manager) spill(id string) {
	m.withLiveEntry(id, func(ctx context.Context, e *entry) {
		if e.sb.State != store.StatePaused || e.sb.ImageDir != "" {
			return
		}
		if err := m.spillLocked(ctx, e, false); err != nil {
			m.logger.Error("pause to disk", "sandbox", id, "err", err)
		}
	})
}

// spillLocked writes e to disk; with dropMemory its next resume keeps the
// files only.
func (m *Manager) spillLocked(ctx context.Context, e *entry, dropMemory bool) error {
	start := time.Now()
	dir := m.pauseImageDir(e.sb.ID)
	if err := m.checkpoint(ctx, e.sb.ID, dir, false); err != nil {
		return err
	}
	updated := cloneSandbox(e.sb)
	updated.ImageDir = dir
	updated.SlotIndex = -1
	updated.RebootOnResume = updated.RebootOnResume || dropMemory
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return err
	}
	m.killInstance(ctx, e.sb.ID)
	m.releaseSlot(ctx, e.slot.Index, e.sb.ID)
	e.sb, e.slot, e.envd = updated, nil, nil
	m.logger.InfoContext(ctx, "paused sandbox written to disk", "sandbox", e.sb.ID,
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

// checkpoint saves sandbox id into dir (made anew), complete or not at all.
func (m *Manager) checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	partial := dir + ".partial"
	os.RemoveAll(partial)
	if err := m.driver.Checkpoint(ctx, id, partial, leaveRunning); err != nil {
		// runsc reports a full disk as a crash of its save, not as ENOSPC:
		// look at the disk itself before the partial image is removed.
		full := diskNearlyFull(partial)
		os.RemoveAll(partial)
		if full {
			return fmt.Errorf("%w: the disk holding %s is full; checkpoint of %s not written",
				ErrInsufficientStorage, m.cfg.ImagesDir, id)
		}
		return classifyRuntimeError(fmt.Errorf("checkpoint %s: %w", id, err))
	}
	if err := os.WriteFile(filepath.Join(partial, completeMarker), nil, 0o600); err != nil {
		os.RemoveAll(partial)
		return classifyRuntimeError(fmt.Errorf("checkpoint %s: %w", id, err))
	}
	if err := os.Rename(partial, dir); err != nil {
		os.RemoveAll(partial)
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return nil
}

// diskNearlyFull reports whether the filesystem holding dir has less than
// a mebibyte left.
func diskNearlyFull(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	return uint64(st.Bavail)*uint64(st.Bsize) < 1<<20
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
