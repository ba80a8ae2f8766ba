package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// List returns every sandbox with a directory or runsc state under the
// driver's state, half-made ones reported stopped. Each answer comes from
// that sandbox's state file and process (see instance), so a hung sandbox
// delays no other.
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	ids, err := d.sandboxIDs(false)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	list := make([]runtime.Instance, 0, len(ids))
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		list = append(list, d.instance(id))
	}
	return list, nil
}

// sandboxIDs returns, sorted, the names of the sandbox directories and the
// sandboxes runsc has a state file for; with debris, also those owning any
// other file under runsc's root (lock files, control sockets).
func (d *Driver) sandboxIDs(debris bool) ([]string, error) {
	ids := map[string]bool{}
	entries, err := os.ReadDir(d.sandboxesDir())
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		ids[e.Name()] = true
	}
	entries, err = os.ReadDir(d.runscRoot())
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if owner, ok := runscFileOwner(e.Name()); ok && (debris || strings.HasSuffix(e.Name(), ".state")) {
			ids[owner] = true
		}
	}
	return slices.Sorted(maps.Keys(ids)), nil
}

// cleanupParallel is how many sandboxes Cleanup removes at once: removal
// mostly waits (for killed processes, for runsc), and one hung sandbox
// must not hold up the others.
const cleanupParallel = 4

// Cleanup removes every sandbox not in keep, then the debris no sandbox
// owns: runsc files, cgroups under the parent (killing any process still
// in them) and mounts under the state directory. It is for reconciling at
// startup and at shutdown: a sandbox being started concurrently and not in
// keep would be removed. Each sandbox's removal is bounded (see remove) and
// they run cleanupParallel at a time, so with nothing kept it ends within
// about removeTimeout per cleanupParallel hung sandboxes.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	ids, err := d.sandboxIDs(true)
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if len(keep) == 0 {
		// Nothing stays: kill every process of this driver at once, so that
		// no removal below waits on another sandbox's runsc.
		// runsc names paths below the state dir in every process it starts.
		under := []byte(filepath.Clean(d.cfg.StateDir) + "/")
		for _, pid := range processesMatching(func(cmdline []byte) bool { return bytes.Contains(cmdline, under) }) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, cleanupParallel)
	)
	for _, id := range ids {
		if keep[id] {
			continue
		}
		if !safeName(id) {
			errs = append(errs, fmt.Errorf("cleanup: unexpected name %q under the state dir", id))
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			d.log.InfoContext(ctx, "cleanup: removing sandbox", "sandbox_id", id)
			if err := d.remove(ctx, id); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("cleanup %s: %w", id, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	errs = append(errs, d.cleanupCgroups(keep), d.cleanupMounts(keep))
	return errors.Join(errs...)
}

// cleanupCgroups removes the cgroups under the parent not in keep, and the
// parent itself once empty.
func (d *Driver) cleanupCgroups(keep map[string]bool) error {
	var errs []error
	for name := range d.cgroups.children(d.cfg.CgroupParent) {
		if keep[name] {
			continue
		}
		if err := d.cgroups.removeCgroup(d.cgroupPath(name)); err != nil {
			errs = append(errs, fmt.Errorf("cleanup cgroup %s: %w", name, err))
		}
	}
	if len(d.cgroups.children(d.cfg.CgroupParent)) == 0 {
		for _, dir := range d.cgroups.dirs(d.cfg.CgroupParent) {
			if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("cleanup cgroup parent %s: %w", dir, err))
			}
		}
	}
	return errors.Join(errs...)
}

// cleanupMounts removes mounts under the state directory. runsc's shared
// null network namespace (runsc/null-netns) serves the gofers of kept
// sandboxes, so it goes only when none is kept.
func (d *Driver) cleanupMounts(keep map[string]bool) error {
	if len(keep) == 0 {
		if err := unmountAll(d.cfg.StateDir); err != nil {
			return fmt.Errorf("cleanup mounts: %w", err)
		}
		return nil
	}
	points, err := mountsUnder(d.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("cleanup mounts: %w", err)
	}
	nullNetns := filepath.Join(d.runscRoot(), "null-netns")
	for _, p := range points {
		if p == nullNetns {
			continue
		}
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL {
			return fmt.Errorf("cleanup mounts: unmount %s: %w", p, err)
		}
	}
	return nil
}

// safeName says whether a name found on disk can be joined to a path.
func safeName(name string) bool {
	return name != "" && name != "." && name != ".." && filepath.Base(name) == name
}
