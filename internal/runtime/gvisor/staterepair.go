package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
)

// runsc rewrites a sandbox's state file in place (truncate, then write),
// so a runsc command killed at that moment leaves it empty or cut short,
// and runsc can no longer manage a sandbox that still runs. The driver
// keeps its own copy of the state file, replaced atomically after each
// command that changed it, to rebuild runsc's from.

// stateBackupPath is the driver's copy of sandbox id's runsc state file.
func (d *Driver) stateBackupPath(id string) string {
	return filepath.Join(d.sandboxDir(id), "runsc-state.json")
}

// runscLockPath is the file runsc flocks while it reads or writes sandbox
// id's state.
func (d *Driver) runscLockPath(id string) string {
	return filepath.Join(d.runscRoot(), id+"_sandbox:"+id+".lock")
}

// saveStateBackup copies sandbox id's runsc state file, once it parses, to
// the driver's copy. It is called after every runsc command that changes
// the state; a failure only loses the means to repair, so it is logged.
func (d *Driver) saveStateBackup(ctx context.Context, id string) {
	b, err := os.ReadFile(d.runscStatePath(id))
	if err == nil {
		err = json.Unmarshal(b, &runscStateFile{})
	}
	if err == nil {
		err = atomicfile.Write(d.stateBackupPath(id), bytes.NewReader(b), 0o640)
	}
	if err != nil {
		d.log.WarnContext(ctx, "save copy of runsc state", "sandbox_id", id, "err", err)
	}
}

// readStateBackup reads the driver's copy of sandbox id's runsc state.
func (d *Driver) readStateBackup(id string) (runscStateFile, error) {
	var st runscStateFile
	b, err := os.ReadFile(d.stateBackupPath(id))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse copy of runsc state: %w", err)
	}
	return st, nil
}

// sentryPid returns the PID of sandbox id's sandbox process (the sentry),
// 0 if it does not run: hint (the PID a state file recorded) if that is a
// process of the sandbox, else a runsc-sandbox process naming it.
func (d *Driver) sentryPid(id string, hint int) int {
	if d.processOf(hint, id) {
		return hint
	}
	for _, pid := range processesMatching(func(cmdline []byte) bool {
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		return filepath.Base(string(argv0)) == "runsc-sandbox" && d.namesSandbox(cmdline, id)
	}) {
		if processAlive(pid) {
			return pid
		}
	}
	return 0
}

// repairStates rebuilds the unreadable runsc state files of sandboxes
// whose sandbox process lives. It runs at start, when no runsc command of
// this driver runs (see endStrayCommands).
func (d *Driver) repairStates(ctx context.Context) {
	ids, err := d.sandboxIDs(false)
	if err != nil {
		d.log.WarnContext(ctx, "repair runsc states", "err", err)
		return
	}
	for _, id := range ids {
		if !safeName(id) {
			continue
		}
		if err := d.repairState(id); err != nil {
			d.log.WarnContext(ctx, "repair runsc state", "sandbox_id", id, "err", err)
		}
	}
}

// errNoRepair says a state file is unreadable and cannot be rebuilt.
var errNoRepair = errors.New("cannot rebuild runsc state")

// repairState rebuilds sandbox id's runsc state file from the driver's
// copy when the file is unreadable and the sandbox process recorded in the
// copy still runs. A readable file, or a sandbox without a live process,
// is left alone (Kill removes the latter).
func (d *Driver) repairState(id string) error {
	_, err := d.readRunscState(id)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	backup, berr := d.readStateBackup(id)
	if berr != nil {
		if d.sentryPid(id, 0) == 0 {
			return nil
		}
		return fmt.Errorf("%w: the sandbox process runs but there is no copy: %w", errNoRepair, berr)
	}
	if !d.processOf(backup.sandboxPid(), id) {
		return nil
	}
	b, err := os.ReadFile(d.stateBackupPath(id))
	if err != nil {
		return fmt.Errorf("%w: %w", errNoRepair, err)
	}
	unlock, err := d.lockRunscState(context.Background(), id, stateLockWait)
	if err != nil {
		return err
	}
	defer unlock()
	if err := atomicfile.Write(d.runscStatePath(id), bytes.NewReader(b), 0o640); err != nil {
		return fmt.Errorf("rewrite runsc state: %w", err)
	}
	d.log.Warn("rebuilt an unreadable runsc state file from the driver's copy", "sandbox_id", id, "status", backup.Status)
	return nil
}

// setRunscStatus rewrites the status runsc recorded for sandbox id,
// keeping every other field as runsc wrote it.
func (d *Driver) setRunscStatus(id, status string) error {
	unlock, err := d.lockRunscState(context.Background(), id, stateLockWait)
	if err != nil {
		return err
	}
	defer unlock()
	return d.setRunscStatusLocked(id, status)
}

// setRunscStatusLocked is setRunscStatus for a caller holding runsc's lock
// of the state (lockRunscState).
func (d *Driver) setRunscStatusLocked(id, status string) error {
	b, err := os.ReadFile(d.runscStatePath(id))
	if err != nil {
		return fmt.Errorf("set runsc status: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return fmt.Errorf("set runsc status: parse state: %w", err)
	}
	if fields["status"], err = json.Marshal(status); err != nil {
		return fmt.Errorf("set runsc status: %w", err)
	}
	if b, err = json.Marshal(fields); err != nil {
		return fmt.Errorf("set runsc status: %w", err)
	}
	if err := atomicfile.Write(d.runscStatePath(id), bytes.NewReader(b), 0o640); err != nil {
		return fmt.Errorf("set runsc status: %w", err)
	}
	return nil
}

// stateLockWait bounds the repairs' wait for runsc's lock of a sandbox's
// state.
const stateLockWait = 5 * time.Second

// lockRunscState takes runsc's lock of sandbox id's state, so that no
// runsc command reads or writes it meanwhile. It waits at most wait, or
// until ctx is done.
func (d *Driver) lockRunscState(ctx context.Context, id string, wait time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(d.runscLockPath(id), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("lock runsc state: %w", err)
	}
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock runsc state of %s: %w", id, err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock runsc state of %s: %w", id, ctx.Err())
		}
	}
}
