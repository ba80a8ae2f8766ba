package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
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
