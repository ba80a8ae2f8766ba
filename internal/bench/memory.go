package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// processIndex maps each argument of the host's processes to the processes
// that have it (runsc names its sandbox and gofer processes' last argument
// after the container ID), and each process to its children. Built once
// per measurement, so that measuring N sandboxes reads /proc once, not N
// times.
type processIndex struct {
	byArg    map[string][]int
	children map[int][]int
}

func indexProcesses() processIndex {
	idx := processIndex{byArg: map[string][]int{}, children: map[int][]int{}}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			idx.children[ppid] = append(idx.children[ppid], pid)
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if len(a) > 0 && !seen[string(a)] {
				seen[string(a)] = true
				idx.byArg[string(a)] = append(idx.byArg[string(a)], pid)
			}
		}
	}
	return idx
}

// parentOf reads a process's parent from /proc/<pid>/stat, whose second
// field (the command name, in parentheses) may itself hold spaces and
// parentheses.
func parentOf(pid int) (int, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(stat[i+1:])) // state, ppid, ...
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

// withArg returns the processes one of whose arguments is exactly arg, and
// all their descendants: under gVisor's systrap platform each address space
// of the guest lives in a stub process, a child of the sandbox process
// with no command line of its own, which holds its share of the guest's
// memory.
func (idx processIndex) withArg(arg string) []int {
	return idx.withDescendants(idx.byArg[arg])
}

// withDescendants returns pids and every process below them, once each.
func (idx processIndex) withDescendants(pids []int) []int {
	seen := map[int]bool{}
	var all []int
	for len(pids) > 0 {
		pid := pids[0]
		pids = pids[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		all = append(all, pid)
		pids = append(pids, idx.children[pid]...)
	}
	return all
}

// pssBytes sums the proportional set size of pids: resident memory with
// pages shared between processes divided among them, so summing over many
// sandboxes does not count shared binaries many times.
func pssBytes(pids []int) (int64, error) {
	if len(pids) == 0 {
		return 0, fmt.Errorf("no process to measure")
	}
	var total int64
	measured := 0
	for _, pid := range pids {
		kb, err := pssOf(pid)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // ended since the index was made (a stub of an exec that returned)
		}
		if err != nil {
			return 0, err
		}
		total += kb << 10
		measured++
	}
	if measured == 0 {
		return 0, fmt.Errorf("processes %v ended before they were measured", pids)
	}
	return total, nil
}

// pssOf reads Pss (KiB) from /proc/<pid>/smaps_rollup.
func pssOf(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, fmt.Errorf("memory of process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "Pss:" {
			return strconv.ParseInt(fields[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("memory of process %d: no Pss in smaps_rollup", pid)
}
