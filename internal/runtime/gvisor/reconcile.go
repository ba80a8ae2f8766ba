package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// List returns every container runsc holds under the driver's root and
// every sandbox directory, whether or not runsc knows it (those are
// reported stopped).
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	out, err := d.runsc(ctx, "", "list", "--format", "json")
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	var states []containerState
	if err := json.Unmarshal(out, &states); err != nil {
		return nil, fmt.Errorf("list: parse runsc output: %w", err)
	}
	byID := map[string]runtime.Instance{}
	for _, st := range states {
		byID[st.ID] = runtime.Instance{ID: st.ID, State: stateFromRunsc(st.Status), Pid: st.Pid}
	}
	entries, err := os.ReadDir(d.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	for _, e := range entries {
		if _, ok := byID[e.Name()]; !ok {
			byID[e.Name()] = runtime.Instance{ID: e.Name(), State: runtime.StateStopped}
		}
	}
	list := make([]runtime.Instance, 0, len(byID))
	for _, inst := range byID {
		list = append(list, inst)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	return list, nil
}

// Cleanup removes every sandbox not in keep, then the debris no sandbox
// owns: cgroups under the parent (killing any process still in them) and
// mounts under the state directory. It is for reconciling at startup: a
// sandbox being started concurrently and not in keep would be removed.
func (d *Driver) Cleanup(ctx context.Context, keep map[string]bool) error {
	list, err := d.List(ctx)
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	var errs []error
	for _, inst := range list {
		if keep[inst.ID] {
			continue
		}
		if !safeName(inst.ID) {
			errs = append(errs, fmt.Errorf("cleanup: unexpected name %q under the state dir", inst.ID))
			continue
		}
		d.log.InfoContext(ctx, "cleanup: removing sandbox", "sandbox_id", inst.ID, "state", inst.State)
		if err := d.remove(ctx, inst.ID); err != nil {
			errs = append(errs, fmt.Errorf("cleanup %s: %w", inst.ID, err))
		}
	}
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
