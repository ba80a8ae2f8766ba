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

// pidsWithArg returns the host processes one of whose arguments is exactly
// arg: runsc names its sandbox and gofer processes' last argument after the
// container ID.
func pidsWithArg(arg string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if string(a) == arg {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

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
