package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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
// sandboxes does not count shared binaries many times. A process that
// shares its parent's address space is left out, as its pages are its
// parent's (see onePerAddressSpace).
func pssBytes(pids []int) (int64, error) {
	if len(pids) == 0 {
		return 0, fmt.Errorf("no process to measure")
	}
	var total int64
	measured := 0
	for _, pid := range onePerAddressSpace(pids) {
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

// onePerAddressSpace drops from pids each process that shares its parent's
// address space without being one of its threads. gVisor's systrap
// platform makes one such process per "sysmsg thread" of a stub (cloned
// with CLONE_VM but not CLONE_THREAD): each has a PID and an smaps of its
// own, and each smaps counts the whole shared address space, so summing
// them counted a multi-threaded guest's memory once per sysmsg thread.
// Threads proper are one PID already and need nothing.
func onePerAddressSpace(pids []int) []int {
	in := make(map[int]bool, len(pids))
	for _, pid := range pids {
		in[pid] = true
	}
	var kept []int
	for _, pid := range pids {
		ppid, ok := parentOf(pid)
		if ok && in[ppid] && sameSize(pid, ppid) && sharesAddressSpace(pid, ppid) {
			continue
		}
		kept = append(kept, pid)
	}
	return kept
}

// sameSize reports whether two processes have address spaces of the same
// size (the first field of /proc/<pid>/statm): true of processes sharing
// one, and a cheap test before sharesAddressSpace reads page tables. (The
// resident size is not compared: the guest runs while it is read.)
func sameSize(a, b int) bool {
	sa, errA := os.ReadFile(fmt.Sprintf("/proc/%d/statm", a))
	sb, errB := os.ReadFile(fmt.Sprintf("/proc/%d/statm", b))
	if errA != nil || errB != nil {
		return false
	}
	fa, fb := strings.Fields(string(sa)), strings.Fields(string(sb))
	return len(fa) > 0 && len(fb) > 0 && fa[0] == fb[0]
}

// Entries of /proc/<pid>/pagemap (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagemapPresent = 1 << 63
	pagemapPFNMask = 1<<55 - 1
)

// sharesAddressSpace reports whether processes a and b have one address
// space. The kernel does not name address spaces, so this finds a page
// that a maps and that one mapping alone maps in the whole host
// (/proc/kpagecount 1): b shares a's address space exactly when it has
// that very page at the same address, as two address spaces cannot both
// map a page mapped once. Page frame numbers need CAP_SYS_ADMIN; without
// it (or when a maps no such page) the answer is false, and both are
// counted, as before. Anonymous mappings (stacks, heaps: most of their
// pages mapped once) are searched first, so that the search does not read
// through the binaries' pages, which every sandbox maps. (A kernel that
// counts mappings per folio on average, CONFIG_NO_PAGE_MAPCOUNT, would
// need another test; Debian's counts them per page.)
func sharesAddressSpace(a, b int) bool {
	if a == b {
		return true
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a))
	if err != nil {
		return false
	}
	pagemapA, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", a))
	if err != nil {
		return false
	}
	defer pagemapA.Close()
	pagemapB, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", b))
	if err != nil {
		return false
	}
	defer pagemapB.Close()
	counts, err := os.Open("/proc/kpagecount")
	if err != nil {
		return false
	}
	defer counts.Close()
	pageSize := uint64(os.Getpagesize())
	buf := make([]byte, 8*512)
	lines := strings.Split(string(maps), "\n")
	named := func(line string) int { // 1 for a mapping of a file or a [name], 0 for an anonymous one
		if len(strings.Fields(line)) > 5 {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(lines, func(x, y string) int { return cmp.Compare(named(x), named(y)) })
	for _, line := range lines {
		start, end, ok := mapRange(line)
		if !ok {
			continue
		}
		for page := start / pageSize; page < end/pageSize; {
			n := min(end/pageSize-page, 512)
			got, _ := pagemapA.ReadAt(buf[:8*n], int64(page*8))
			for i := 0; i+8 <= got; i += 8 {
				entry := binary.LittleEndian.Uint64(buf[i:])
				pfn := entry & pagemapPFNMask
				if entry&pagemapPresent == 0 || pfn == 0 || mapCount(counts, pfn) != 1 {
					continue
				}
				var other [8]byte
				if _, err := pagemapB.ReadAt(other[:], int64((page+uint64(i/8))*8)); err != nil {
					return false
				}
				otherEntry := binary.LittleEndian.Uint64(other[:])
				return otherEntry&pagemapPresent != 0 && otherEntry&pagemapPFNMask == pfn
			}
			page += n
		}
	}
	return false
}

// mapRange parses the address range that starts a line of
// /proc/<pid>/maps, skipping [vsyscall], whose page table is not the
// process's own.
func mapRange(line string) (start, end uint64, ok bool) {
	fields := strings.Fields(line)
	if len(fields) == 0 || strings.HasSuffix(line, "[vsyscall]") {
		return 0, 0, false
	}
	from, to, ok := strings.Cut(fields[0], "-")
	if !ok {
		return 0, 0, false
	}
	start, errStart := strconv.ParseUint(from, 16, 64)
	end, errEnd := strconv.ParseUint(to, 16, 64)
	return start, end, errStart == nil && errEnd == nil && start < end
}

// mapCount reads how many mappings map page frame pfn (/proc/kpagecount).
func mapCount(counts *os.File, pfn uint64) uint64 {
	var b [8]byte
	if _, err := counts.ReadAt(b[:], int64(pfn*8)); err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
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
