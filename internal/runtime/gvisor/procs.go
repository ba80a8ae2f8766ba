package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
)

// processesUsing returns the PIDs whose command line mentions dir: runsc
// passes its --root and bundle paths to every process it starts.
func processesUsing(dir string) ([]int, error) {
	if _, err := os.Stat("/proc/self"); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	needle := []byte(filepath.Clean(dir))
	return processesMatching(func(cmdline []byte) bool { return bytes.Contains(cmdline, needle) }), nil
}

// processesMatching returns the PIDs, other than this process, whose
// command line satisfies match.
func processesMatching(match func(cmdline []byte) bool) []int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && match(cmdline) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killProcessesUsing sends SIGKILL to every process whose command line
// mentions dir.
func killProcessesUsing(dir string) error {
	pids, err := processesUsing(dir)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// descendants returns the PIDs of pid's children, their children, and so
// on, read from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		child, ppid, ok := parseProcStat(string(b))
		if ok {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}

// parseProcStat reads the pid and parent pid from a /proc/<pid>/stat line:
// "pid (comm) state ppid ...", where comm may hold spaces and parentheses.
func parseProcStat(line string) (pid, ppid int, ok bool) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return 0, 0, false
	}
	fields := strings.Fields(line[end+1:])
	if len(fields) < 2 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(line[:open]))
	ppid, err2 := strconv.Atoi(fields[1])
	return pid, ppid, err1 == nil && err2 == nil
}

// strayCommandWait bounds the wait for the runsc commands a previous
// process of the driver left running: a pause or resume takes
// milliseconds, a checkpoint of a small sandbox about a second.
const strayCommandWait = 30 * time.Second

// endStrayCommands ends runsc commands (pause, checkpoint, delete, ...) on
// this state dir that an earlier process of the driver started and never
// saw finish (it was killed). Left running they would act on sandboxes
// after this process reconciled them: a pause landing on a sandbox just
// adopted as running, a delete on one adopted as paused. Killed at once
// they would be cut at any point: between a pause's stop of the kernel
// and its record of it (a sandbox recorded running whose kernel is
// stopped), or while rewriting a state file (an empty state file). So
// they are let finish, within strayCommandWait, and only those past it
// are killed (repairStates and Unfreeze then mend what they cut). The
// sandboxes' own processes (runsc-sandbox, runsc-gofer, and the checkpoint
// gofer of a restore whose memory is still arriving, which waits for this
// process's feed) are kept. Only one
// driver uses a state dir at a time (the data dir is locked), so every
// such command is stray.
func (d *Driver) endStrayCommands(ctx context.Context, wait time.Duration) {
	root := []byte("--root=" + d.runscRoot())
	stray := func() []int {
		return processesMatching(func(cmdline []byte) bool {
			if !bytes.Contains(cmdline, root) {
				return false
			}
			argv0, _, _ := bytes.Cut(cmdline, []byte{0})
			name := filepath.Base(string(argv0))
			return name != "runsc-sandbox" && name != "runsc-gofer" && name != ckptgofer.ProcessName
		})
	}
	alive := func(pids []int) []int {
		var out []int
		for _, pid := range pids {
			if processAlive(pid) {
				out = append(out, pid)
			}
		}
		return out
	}
	pids := stray()
	if len(pids) == 0 {
		return
	}
	d.log.WarnContext(ctx, "waiting for runsc commands a previous server left running", "pids", pids, "bound", wait)
	deadline := time.Now().Add(wait)
	for len(pids) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		pids = alive(pids)
	}
	if len(pids) == 0 {
		return
	}
	d.log.WarnContext(ctx, "killing runsc commands a previous server left running", "pids", pids)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Wait (briefly) until they are gone, so that nothing they do lands
	// after reconcile.
	deadline = time.Now().Add(processExitWait)
	for len(alive(pids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// lockHolders returns the processes holding or waiting for a lock on a
// file with the inode of the file at path, read from /proc/locks: a runsc
// command holds its lock of a sandbox for as long as it acts on it. The
// inode alone is matched, not the device: /proc/locks names the device of
// the inode's superblock, which stat does not give on btrfs subvolumes or
// some overlayfs setups. A same-numbered inode of another filesystem can
// match too, so the caller must check what it finds.
//
// /proc/locks is read only when the file is locked (by flock, as runsc
// does): reading it takes the kernel's lock table for writing, ~8 ms of
// waiting on an idle host, a third of a sandbox's delete.
func lockHolders(path string) []int {
	if !flocked(path) {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil
	}
	return parseLockHolders(string(locks), st.Ino)
}

// flocked says whether a process holds a flock on the file at path (and
// so whether any may wait for one), by trying to take it at once; true
// when that cannot be told.
func flocked(path string) bool {
	// O_NONBLOCK: a FIFO at the path does not hang the open.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return !errors.Is(err, unix.ENOENT)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	_ = unix.Flock(fd, unix.LOCK_UN)
	return false
}

// parseLockHolders returns the PIDs of the /proc/locks lines on inode ino.
// A line names its file as "major:minor:inode" (hex, hex, decimal); a
// waiter's line has "->" after its number.
func parseLockHolders(locks string, ino uint64) []int {
	var pids []int
	for _, line := range strings.Split(locks, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 1 && fields[1] == "->" {
			fields = append(fields[:1], fields[2:]...)
		}
		// 1: FLOCK ADVISORY WRITE <pid> <file> <start> <end>
		if len(fields) < 6 {
			continue
		}
		parts := strings.Split(fields[5], ":")
		if len(parts) != 3 || parts[2] != strconv.FormatUint(ino, 10) {
			continue
		}
		// An open file description lock has no owning process: -1.
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processKiller SIGKILLs processes the moment they are found, so that a
// sandbox's processes start exiting while the rest are still looked for,
// then waits for them all. Each process is held by a pidfd from before the
// signal, so a PID reused after the pidfd is opened is neither signalled
// nor waited for (one reused between the caller's finding it and the open
// is, as with kill(2)), and the wait ends the moment the last one exits (a
// pidfd is readable once its process has exited; a zombie counts, holding
// nothing but its PID). Where the kernel has no pidfds it polls /proc.
//
// Before the signal it takes a copy of each packet socket the process
// holds (pidfd_getfd). A sandbox's network stack reads its interface
// through one, and the kernel's release of a packet socket waits for an
// RCU grace period (packet_release calls synchronize_net), which a process
// that closes it while exiting pays before it is gone: ~10 of the ~17 ms
// a sandbox took to exit here. With a copy held the exit only drops a
// reference; the copies are closed in the background once the processes
// are gone, so that wait is no longer on the delete's path. Nobody reads
// them meanwhile. An interface removed in that time unhooks them itself
// (the kernel's netdevice notifier); on a slot reset for reuse they stay
// attached and receive copies of its frames until closed, which takes
// nothing from the next sandbox: its network stack asks the kernel for a
// fanout group of its own (PACKET_FANOUT_FLAG_UNIQUEID).
//
// Its zero value is ready; wait must be called once, to release the
// pidfds and the sockets.
type processKiller struct {
	held    []unix.PollFd   // the processes' pidfds, closed when they exit
	polled  []int           // no pidfd: signalled by PID and polled
	pidOf   map[int32]int   // a pidfd's process
	seen    map[int]bool    // every PID given, signalled once
	sockets []int           // copies of the processes' packet sockets
	taken   map[uint64]bool // the inodes of the sockets copied
}

// kill SIGKILLs pid unless it was given before.
func (k *processKiller) kill(pid int) {
	if k.seen[pid] {
		return
	}
	if k.seen == nil {
		k.seen, k.pidOf = map[int]bool{}, map[int32]int{}
	}
	k.seen[pid] = true
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case err == nil:
		k.held = append(k.held, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		k.pidOf[int32(fd)] = pid
		k.takePacketSockets(fd, pid)
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	case errors.Is(err, unix.ESRCH):
		// Gone already.
	default:
		_ = syscall.Kill(pid, syscall.SIGKILL)
		k.polled = append(k.polled, pid)
	}
}

// wait waits until every process killed has exited or the deadline
// passes, and returns those alive then.
func (k *processKiller) wait(deadline time.Time) []int {
	defer func() {
		for _, p := range k.held {
			unix.Close(int(p.Fd))
		}
		k.held = nil
		if sockets := k.sockets; len(sockets) > 0 {
			k.sockets = nil
			// Each close waits for a grace period; a delete's goroutine
			// waited as long before, so their number is no larger.
			go func() {
				for _, fd := range sockets {
					unix.Close(fd)
				}
			}()
		}
	}()
	for {
		k.polled = slices.DeleteFunc(k.polled, func(pid int) bool { return !processAlive(pid) })
		if len(k.held)+len(k.polled) == 0 {
			break
		}
		// Past the deadline the pidfds are still looked at once, without
		// waiting: what has exited by now is not reported alive.
		wait := max(time.Until(deadline), 0)
		if len(k.polled) > 0 {
			wait = min(wait, 10*time.Millisecond)
		}
		if len(k.held) > 0 {
			ms := int(wait.Milliseconds())
			if wait > 0 {
				ms++ // rounded up: never a busy loop on a sub-millisecond wait
			}
			if _, err := unix.Poll(k.held, ms); err != nil && !errors.Is(err, unix.EINTR) {
				break
			}
			k.held = slices.DeleteFunc(k.held, func(p unix.PollFd) bool {
				if p.Revents == 0 {
					return false
				}
				unix.Close(int(p.Fd))
				return true
			})
		} else if wait > 0 {
			time.Sleep(wait)
		}
		if !time.Now().Before(deadline) {
			k.polled = slices.DeleteFunc(k.polled, func(pid int) bool { return !processAlive(pid) })
			break
		}
	}
	alive := slices.Clone(k.polled)
	for _, p := range k.held {
		alive = append(alive, k.pidOf[p.Fd])
	}
	return alive
}

// takePacketSockets copies into this process the packet sockets that pid
// (held by pidfd) has open, each once, and none copied from another
// process already. What cannot be read or copied is left to close with the
// process. The descriptors are read unsorted and only until every socket
// is found: a sandbox process may hold many.
func (k *processKiller) takePacketSockets(pidfd, pid int) {
	inodes := packetSocketInodes(pid)
	for ino := range inodes {
		if k.taken[ino] {
			delete(inodes, ino)
		}
	}
	if len(inodes) == 0 {
		return
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	f, err := os.Open(dir)
	if err != nil {
		return
	}
	defer f.Close()
	for len(inodes) > 0 {
		names, err := f.Readdirnames(64)
		for _, name := range names {
			link, err := os.Readlink(dir + "/" + name)
			if err != nil {
				continue
			}
			ino, ok := socketInode(link)
			if !ok || !inodes[ino] {
				continue
			}
			if k.copySocket(pidfd, name, ino) {
				delete(inodes, ino)
			}
		}
		if err != nil {
			return
		}
	}
}

// copySocket copies descriptor name of the process held by pidfd if it is
// still the socket ino (the process may have reused the number since): a
// copy of anything else is closed at once, never kept.
func (k *processKiller) copySocket(pidfd int, name string, ino uint64) bool {
	n, err := strconv.Atoi(name)
	if err != nil {
		return false
	}
	fd, err := unix.PidfdGetfd(pidfd, n, 0)
	if err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Ino != ino {
		unix.Close(fd)
		return false
	}
	if k.taken == nil {
		k.taken = map[uint64]bool{}
	}
	k.taken[ino] = true
	k.sockets = append(k.sockets, fd)
	return true
}

// packetSocketInodes returns the inodes of the packet sockets of pid's
// network namespace (/proc/<pid>/net/packet): a sandbox's namespace holds
// only its own, another's may hold other processes' too.
func packetSocketInodes(pid int) map[uint64]bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/packet")
	if err != nil {
		return nil
	}
	return parsePacketInodes(string(data))
}

// parsePacketInodes reads the Inode column of /proc/net/packet.
func parsePacketInodes(table string) map[uint64]bool {
	lines := strings.Split(table, "\n")
	if len(lines) == 0 {
		return nil
	}
	col := slices.Index(strings.Fields(lines[0]), "Inode")
	if col < 0 {
		return nil
	}
	inodes := map[uint64]bool{}
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		if len(fields) <= col {
			continue
		}
		if ino, err := strconv.ParseUint(fields[col], 10, 64); err == nil {
			inodes[ino] = true
		}
	}
	return inodes
}

// socketInode reads a socket's inode from its /proc/<pid>/fd link
// ("socket:[123]").
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(s, 10, 64)
	return ino, err == nil
}
