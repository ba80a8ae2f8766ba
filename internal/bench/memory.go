package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// processIndex maps each argument of the host's processes to the processes
// that have it: runsc names its sandbox and gofer processes' last argument
// after the container ID. Built once per measurement, so that measuring N
// sandboxes reads /proc once, not N times.
type processIndex map[string][]int

func indexProcesses() processIndex {
	idx := processIndex{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if len(a) > 0 && !seen[string(a)] {
				seen[string(a)] = true
				idx[string(a)] = append(idx[string(a)], pid)
			}
		}
	}
	return idx
}

// withArg returns the processes one of whose arguments is exactly arg.
func (idx processIndex) withArg(arg string) []int { return idx[arg] }

// pssBytes sums the proportional set size of pids: resident memory with
// pages shared between processes divided among them, so summing over many
// sandboxes does not count shared binaries many times.
func pssBytes(pids []int) (int64, error) {
	if len(pids) == 0 {
		return 0, fmt.Errorf("no process to measure")
	}
	var total int64
	for _, pid := range pids {
		kb, err := pssOf(pid)
		if err != nil {
			return 0, err
		}
		total += kb << 10
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
