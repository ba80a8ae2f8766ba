package gvisor

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/mountinfo"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// unlimitedV1 is at or above what cgroup v1 reports for "no memory limit"
// (the largest page-aligned int64).
const unlimitedV1 = 1 << 62

// cgroupHierarchies are the host's mounted cgroup hierarchies. runsc creates
// a sandbox's cgroup in each v1 hierarchy it knows, or in the unified one.
type cgroupHierarchies struct {
	// v1 maps a v1 controller (memory, cpuacct, pids, ...) to its mount point.
	v1 map[string]string
	// unified is the cgroup2 mount point, "" if none.
	unified string
	// all lists every hierarchy's mount point, v1 and v2.
	all []string
}

// findCgroupHierarchies reads the cgroup mounts from /proc/self/mountinfo.
func findCgroupHierarchies() (cgroupHierarchies, error) {
	h := cgroupHierarchies{v1: map[string]string{}}
	mounts, err := mountinfo.Read()
	if err != nil {
		return h, err
	}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			h.unified = m.Point
		case "cgroup":
			for _, opt := range strings.Split(m.SuperOptions, ",") {
				h.v1[opt] = m.Point
			}
		default:
			continue
		}
		h.all = append(h.all, m.Point)
	}
	if len(h.all) == 0 {
		return h, errors.New("find cgroup hierarchies: no cgroup mounted")
	}
	return h, nil
}

// usesV1 says whether resource control (and so stats) is in v1 hierarchies.
func (h cgroupHierarchies) usesV1() bool {
	return h.v1["memory"] != ""
}

// dirs returns the directories of cgroup path rel in every hierarchy.
func (h cgroupHierarchies) dirs(rel string) []string {
	out := make([]string, 0, len(h.all))
	for _, root := range h.all {
		out = append(out, filepath.Join(root, rel))
	}
	return out
}

// cpuWeightFile is the file of the cgroup at path rel that holds its CPU
// weight, and the value a cgroup nobody set one for has: cgroup v1's
// cpu.shares 1024, v2's cpu.weight 100. (The background weight is set by
// runsc at create, from the spec's backgroundCPUShares.)
func (h cgroupHierarchies) cpuWeightFile(rel string) (file, normal string, err error) {
	switch {
	case h.usesV1() && h.v1["cpu"] != "":
		return filepath.Join(h.v1["cpu"], rel, "cpu.shares"), "1024", nil
	case !h.usesV1() && h.unified != "":
		return filepath.Join(h.unified, rel, "cpu.weight"), "100", nil
	}
	return "", "", errors.New("no cpu cgroup controller")
}

// setDefaultCPUWeight gives the cgroup at path rel the default CPU weight.
func (h cgroupHierarchies) setDefaultCPUWeight(rel string) error {
	file, normal, err := h.cpuWeightFile(rel)
	if err == nil {
		err = os.WriteFile(file, []byte(normal), 0)
	}
	if err != nil {
		return fmt.Errorf("set CPU weight: %w", err)
	}
	return nil
}

// stats reads a sandbox's figures from its cgroup at path rel.
func (h cgroupHierarchies) stats(rel string) (runtime.Stats, error) {
	if h.usesV1() {
		return h.statsV1(rel)
	}
	return h.statsV2(rel)
}

func (h cgroupHierarchies) statsV1(rel string) (runtime.Stats, error) {
	var s runtime.Stats
	mem := filepath.Join(h.v1["memory"], rel)
	usage, err := readUint(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return s, err
	}
	s.MemoryBytes = usage - min(usage, statField(filepath.Join(mem, "memory.stat"), "total_inactive_file"))
	if s.MemoryLimitBytes, err = readUint(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return s, err
	}
	if s.MemoryLimitBytes >= unlimitedV1 {
		s.MemoryLimitBytes = 0
	}
	if s.CPUUsageNanos, err = readUint(filepath.Join(h.v1["cpuacct"], rel, "cpuacct.usage")); err != nil {
		return s, err
	}
	pids, err := readUint(filepath.Join(h.v1["pids"], rel, "pids.current"))
	s.PidsCurrent = int(pids)
	return s, err
}

func (h cgroupHierarchies) statsV2(rel string) (runtime.Stats, error) {
	var s runtime.Stats
	dir := filepath.Join(h.unified, rel)
	usage, err := readUint(filepath.Join(dir, "memory.current"))
	if err != nil {
		return s, err
	}
	s.MemoryBytes = usage - min(usage, statField(filepath.Join(dir, "memory.stat"), "inactive_file"))
	if b, err := os.ReadFile(filepath.Join(dir, "memory.max")); err == nil && strings.TrimSpace(string(b)) != "max" {
		s.MemoryLimitBytes, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	s.CPUUsageNanos = statField(filepath.Join(dir, "cpu.stat"), "usage_usec") * 1000
	pids, err := readUint(filepath.Join(dir, "pids.current"))
	s.PidsCurrent = int(pids)
	return s, err
}

// removeCgroup removes the cgroup at rel, and any children, from every
// hierarchy. Processes still inside are killed first: the cgroup belongs to
// a sandbox being removed, so nothing in it may survive.
func (h cgroupHierarchies) removeCgroup(rel string) error {
	var errs []error
	for _, dir := range h.dirs(rel) {
		if err := removeCgroupDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// children lists the names of the cgroups directly below rel, over all
// hierarchies.
func (h cgroupHierarchies) children(rel string) map[string]bool {
	names := map[string]bool{}
	for _, dir := range h.dirs(rel) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				names[e.Name()] = true
			}
		}
	}
	return names
}

// procs returns the PIDs in the cgroup at rel and its children, over all
// hierarchies.
func (h cgroupHierarchies) procs(rel string) []int {
	var pids []int
	for _, dir := range h.dirs(rel) {
		_ = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// kill SIGKILLs every process in the cgroup at rel and its children at
// once where the kernel offers cgroup.kill (cgroup v2, Linux 5.14+); the
// caller kills what procs lists as well, for older kernels and v1.
func (h cgroupHierarchies) kill(rel string) {
	if h.unified == "" {
		return
	}
	_ = os.WriteFile(filepath.Join(h.unified, rel, "cgroup.kill"), []byte("1"), 0)
}

func removeCgroupDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroupDir(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	// A cgroup can be removed only once its processes have exited, which
	// takes a moment after SIGKILL.
	for attempt := 0; ; attempt++ {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || attempt == 50 {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		killCgroupProcs(dir)
		time.Sleep(20 * time.Millisecond)
	}
}

func killCgroupProcs(dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read cgroup file: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// statField returns the value of key in a "key value" per line file, 0 when
// absent.
func statField(path, key string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}
