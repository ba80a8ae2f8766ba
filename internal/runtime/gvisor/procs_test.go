package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startProcess starts a command in a process group of its own and kills
// the group at the end of the test.
func startProcess(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
	return cmd
}

// TestLockHolders finds the process holding a file's flock and the one
// waiting for it, as the kill of a sandbox finds runsc commands acting on
// it, and nothing for a file nobody locks.
func TestLockHolders(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("flock (util-linux) is needed: %v", err)
	}
	dir := t.TempDir()
	lock, other := filepath.Join(dir, "x.lock"), filepath.Join(dir, "y.lock")
	for _, p := range []string{lock, other} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	holder := startProcess(t, "flock", "--exclusive", "--close", lock, "sleep", "3600")
	waitFor(t, 10*time.Second, "the holder's lock", func() bool { return slices.Contains(lockHolders(lock), holder.Process.Pid) })
	waiter := startProcess(t, "flock", "--exclusive", "--close", lock, "true")
	waitFor(t, 10*time.Second, "the waiter", func() bool { return slices.Contains(lockHolders(lock), waiter.Process.Pid) })
	if got := lockHolders(other); len(got) != 0 {
		t.Errorf("lockHolders(unlocked file) = %v; want none", got)
	}
	if got := lockHolders(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("lockHolders(missing file) = %v; want none", got)
	}
	// Whether a file is locked is told without /proc/locks, and telling
	// takes no lock that stays.
	if !flocked(lock) || flocked(other) || flocked(filepath.Join(dir, "missing")) {
		t.Errorf("flocked: %v for the held file, %v for the free one, %v for a missing one",
			flocked(lock), flocked(other), flocked(filepath.Join(dir, "missing")))
	}
	if err := exec.Command("flock", "--exclusive", "--nonblock", other, "true").Run(); err != nil {
		t.Errorf("the free file after flocked: %v", err)
	}
}

// TestKillAndWait kills processes and returns once they have exited, a
// PID that is gone already included; a deadline in the past returns at
// once with what is still alive.
func TestKillAndWait(t *testing.T) {
	a, b := startProcess(t, "sleep", "3600"), startProcess(t, "sleep", "3600")
	gone := startProcess(t, "true")
	waitFor(t, 10*time.Second, "true to exit", func() bool { return !processAlive(gone.Process.Pid) })

	c := startProcess(t, "sleep", "3600")
	if alive := killAndWait(nil, time.Now().Add(-time.Second)); len(alive) != 0 {
		t.Errorf("killAndWait(none) = %v", alive)
	}
	start := time.Now()
	if alive := killAndWait([]int{a.Process.Pid, b.Process.Pid, gone.Process.Pid}, time.Now().Add(30*time.Second)); len(alive) != 0 {
		t.Errorf("killAndWait = %v alive; want none", alive)
	}
	for _, cmd := range []*exec.Cmd{a, b} {
		if processAlive(cmd.Process.Pid) {
			t.Errorf("process %d alive after killAndWait", cmd.Process.Pid)
		}
	}
	t.Logf("two processes killed and gone in %v", time.Since(start))
	if !processAlive(c.Process.Pid) {
		t.Errorf("a process not named was killed")
	}
}

// TestKillAndWaitPastDeadline looks at the processes once even when the
// deadline has passed: one that has exited (here a zombie, not yet reaped)
// is not reported alive.
func TestKillAndWaitPastDeadline(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	waitFor(t, 10*time.Second, "true to exit", func() bool { return !processAlive(cmd.Process.Pid) })
	if alive := killAndWait([]int{cmd.Process.Pid}, time.Now().Add(-time.Second)); len(alive) != 0 {
		t.Errorf("killAndWait(exited, past deadline) = %v alive; want none", alive)
	}
}

// TestKillTakesPacketSockets: the killer copies a process's packet sockets
// before it signals it, so that the process's exit does not wait on their
// release, and closes the copies once the process is gone. A packet socket
// needs CAP_NET_RAW.
func TestKillTakesPacketSockets(t *testing.T) {
	sock, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			t.Fatalf("a packet socket: %v", err)
		}
		t.Skipf("a packet socket needs CAP_NET_RAW: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(sock, &st); err != nil {
		t.Fatal(err)
	}
	// The child holds the socket; this process closes its own.
	file := os.NewFile(uintptr(sock), "packet")
	cmd := exec.Command("sleep", "3600")
	cmd.ExtraFiles = []*os.File{file}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	file.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
	if !packetSocketInodes(cmd.Process.Pid)[st.Ino] {
		t.Fatalf("socket %d is not among the packet sockets of the child's namespace", st.Ino)
	}

	var k processKiller
	k.kill(cmd.Process.Pid)
	k.kill(cmd.Process.Pid) // given twice, taken and signalled once
	if len(k.held) != 1 || len(k.seen) != 1 {
		t.Fatalf("the process given twice is held %d times, seen %d times; want once", len(k.held), len(k.seen))
	}
	if len(k.sockets) != 1 || !k.taken[st.Ino] {
		t.Fatalf("copies taken: %v (inodes %v); want the child's one socket %d", k.sockets, k.taken, st.Ino)
	}
	var copied unix.Stat_t
	if err := unix.Fstat(k.sockets[0], &copied); err != nil || copied.Ino != st.Ino {
		t.Fatalf("the copy: %v, inode %d; want %d", err, copied.Ino, st.Ino)
	}
	copyFd := k.sockets[0]
	if alive := k.wait(time.Now().Add(30 * time.Second)); len(alive) != 0 {
		t.Fatalf("alive after the wait: %v", alive)
	}
	if k.sockets != nil {
		t.Errorf("the killer still lists its copies after the wait: %v", k.sockets)
	}
	// The copy is closed in the background, off the wait.
	waitFor(t, 10*time.Second, "the copy's close", func() bool {
		var now unix.Stat_t
		return unix.Fstat(copyFd, &now) != nil || now.Ino != st.Ino
	})
}

// TestParsePacketInodes reads /proc/net/packet's Inode column.
func TestParsePacketInodes(t *testing.T) {
	table := "sk               RefCnt Type Proto  Iface R Rmem   User   Inode\n" +
		"00000000e28a1211 3      3    0003   2     1 0      0      3209290\n" +
		"00000000aa8a1211 3      3    0003   5     1 0      0      77\n"
	got := parsePacketInodes(table)
	if len(got) != 2 || !got[3209290] || !got[77] {
		t.Errorf("parsePacketInodes = %v", got)
	}
	if got := parsePacketInodes("sk RefCnt\n"); len(got) != 0 {
		t.Errorf("no Inode column: %v", got)
	}
	for link, want := range map[string]uint64{"socket:[42]": 42, "pipe:[42]": 0, "socket:[x]": 0, "socket:[7": 0} {
		if ino, ok := socketInode(link); ino != want || ok != (want != 0) {
			t.Errorf("socketInode(%q) = %d, %v", link, ino, ok)
		}
	}
}

// killAndWait SIGKILLs pids and waits until they have exited or the
// deadline passes; it returns those alive then.
func killAndWait(pids []int, deadline time.Time) []int {
	var k processKiller
	for _, pid := range pids {
		k.kill(pid)
	}
	return k.wait(deadline)
}
