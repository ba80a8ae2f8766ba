package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// promptly bounds the answers that must not wait for a hung sandbox. They
// take milliseconds; the bound allows a busy machine.
const promptly = 3 * time.Second

// TestHungSandbox: a sandbox whose processes are stopped (SIGSTOP, as when
// gVisor hangs), with runsc's lock of it held and a pause stuck on it,
// does not delay answers about the others; a caller that gives up on the
// stuck pause gets control back within the pause's grace; Kill ends the
// sandbox and a pause stuck in its call to the sandbox within
// removeTimeout and leaves nothing of it; Cleanup ends within its bound.
func TestHungSandbox(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	f := runtimetest.NewFixture(t, d, env)
	other := f.Start(t)
	hung := f.Start(t)
	hangSandbox(t, d, hung.Spec.ID)
	releaseLock := holdLock(t, d, hung.Spec.ID, false)

	// A pause whose caller gives up ends within the grace of pause.
	ctx, cancel := context.WithCancel(context.Background())
	stuck := stuckPause(t, d, ctx, hung.Spec.ID)
	for _, check := range othersAnswer(d, other.Spec.ID, hung.Spec.ID) {
		within(t, promptly, check.name, check.op)
	}
	// A sandbox the kernel kills meanwhile (out of memory) shows stopped at
	// once, in State and in List.
	dies := f.Start(t)
	killSandboxProcess(t, d, dies.Spec.ID)
	within(t, promptly, "State and List of a killed sandbox", func() error {
		if st, err := d.State(t.Context(), dies.Spec.ID); err != nil || st != runtime.StateStopped {
			return fmt.Errorf("State(killed) = %q, %v; want stopped", st, err)
		}
		list, err := d.List(t.Context())
		if i := slices.IndexFunc(list, func(i runtime.Instance) bool { return i.ID == dies.Spec.ID }); err != nil || i < 0 || list[i].State != runtime.StateStopped {
			return fmt.Errorf("List = %+v, %v; want %s stopped", list, err, dies.Spec.ID)
		}
		return nil
	})
	cancel()
	select {
	case err := <-stuck:
		t.Logf("canceled pause of the hung sandbox: %v", err)
		if err == nil {
			t.Error("pause of a stopped sandbox succeeded")
		}
	case <-time.After(boundControl.grace + promptly):
		t.Fatalf("pause still running %v after its caller gave up", boundControl.grace+promptly)
	}
	waitFor(t, promptly, "the canceled pause to end", func() bool { return running(d, hung.Spec.ID) == 0 })

	// Kill ends the sandbox and a pause stuck on it (now in its call to
	// the stopped sandbox, the lock free), and leaves nothing.
	releaseLock()
	stuck = stuckPause(t, d, context.Background(), hung.Spec.ID)
	// The pause holds runsc's lock while it waits for the sandbox's answer.
	waitFor(t, 10*time.Second, "the pause to take runsc's lock", func() bool { return lockHeld(d.runscLockPath(hung.Spec.ID)) })
	within(t, removeTimeout, "Kill(hung)", func() error { return d.Kill(context.Background(), hung.Spec.ID) })
	select {
	case err := <-stuck:
		if err == nil {
			t.Error("pause of a killed sandbox succeeded")
		}
	case <-time.After(promptly):
		t.Error("a pause stuck on the sandbox still runs after Kill")
	}
	if left := sandboxDebris(d, hung.Spec.ID); len(left) > 0 {
		t.Errorf("Kill(hung) left:\n%s", strings.Join(left, "\n"))
	}
	if !other.Answers(t) {
		t.Error("the other sandbox stopped answering")
	}
	if st, err := d.State(t.Context(), other.Spec.ID); err != nil || st != runtime.StateRunning {
		t.Errorf("State(other) = %q, %v; want running", st, err)
	}

	// Cleanup with nothing kept ends within its bound with a hung sandbox
	// and a stuck command, and leaves nothing of the driver.
	hung2 := f.Start(t)
	hangSandbox(t, d, hung2.Spec.ID)
	holdLock(t, d, hung2.Spec.ID, false)
	stuck = stuckPause(t, d, context.Background(), hung2.Spec.ID)
	within(t, removeTimeout, "Cleanup(nil)", func() error { return d.Cleanup(context.Background(), nil) })
	select {
	case <-stuck:
	case <-time.After(promptly):
		t.Error("a pause stuck on a sandbox still runs after Cleanup")
	}
	if left := f.Leftovers(t); len(left) > 0 {
		t.Errorf("left after Cleanup(nil):\n%s", strings.Join(left, "\n"))
	}
	if left := runscRootDebris(d); len(left) > 0 {
		t.Errorf("runsc root after Cleanup(nil): %v", left)
	}
	for _, dir := range d.cgroups.dirs(d.cfg.CgroupParent) {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("cgroup parent %s left after Cleanup(nil)", dir)
		}
	}
}

// killSandboxProcess SIGKILLs the sandbox process of id, as the kernel's
// out-of-memory killer does, and waits until it has exited.
func killSandboxProcess(t *testing.T, d *Driver, id string) {
	t.Helper()
	st, err := d.readRunscState(id)
	if err != nil || st.sandboxPid() <= 0 {
		t.Fatalf("runsc state of %s: %+v, %v", id, st, err)
	}
	pid := st.sandboxPid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %d: %v", pid, err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("exit of killed sandbox process %d", pid), func() bool { return !processAlive(pid) })
}

// TestKillWithForeignLockHolder: when runsc's lock of a hung sandbox is
// held by a process the driver cannot tell belongs to it (a child that
// inherited the lock), runsc delete cannot finish; Kill still ends within
// removeTimeout and removes runsc's files itself.
func TestKillWithForeignLockHolder(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	f := runtimetest.NewFixture(t, d, env)
	hung := f.Start(t)
	id := hung.Spec.ID
	hangSandbox(t, d, id)
	holdLock(t, d, id, true)
	within(t, removeTimeout, "Kill(hung)", func() error { return d.Kill(context.Background(), id) })
	if left := sandboxDebris(d, id); len(left) > 0 {
		t.Errorf("Kill(hung) left:\n%s", strings.Join(left, "\n"))
	}
}

// hangSandbox makes sandbox id hang as it did in production: it SIGSTOPs
// every host process of the sandbox (its sandbox and gofer processes), so
// that runsc commands wait for it forever. They are resumed at the end of
// the test in case they are still there.
func hangSandbox(t *testing.T, d *Driver, id string) {
	t.Helper()
	pids := processesNaming(id)
	if len(pids) == 0 {
		t.Fatalf("no host process names sandbox %s", id)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	t.Logf("stopped processes %v of sandbox %s", pids, id)
	if st, err := d.State(t.Context(), id); err != nil || st != runtime.StateRunning {
		t.Errorf("State(hung) = %q, %v; want running (its process lives)", st, err)
	}
}

// holdLock has a process hold runsc's lock of sandbox id, as a runsc
// command stuck halfway does, until release or the test's end. With
// inherited, the lock is held by a child that names nothing of the
// sandbox (flock without --close), which the driver cannot tell from any
// other process.
func holdLock(t *testing.T, d *Driver, id string, inherited bool) (release func()) {
	t.Helper()
	lock := filepath.Join(d.runscRoot(), id+"_sandbox:"+id+".lock")
	args := []string{"--exclusive", "--close", lock, "sleep", "3600"}
	if inherited {
		args = slices.Delete(args, 1, 2)
	}
	holder := exec.Command("flock", args...)
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatalf("start a holder of runsc's lock: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = holder.Wait(); close(exited) }()
	release = func() { _ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); <-exited }
	t.Cleanup(release)
	waitFor(t, 10*time.Second, "holder of "+lock, func() bool { return lockHeld(lock) })
	return release
}

// stuckPause starts a Pause of the hung sandbox id, waits until it is one
// of the sandbox's running commands (it then waits for the lock or the
// stopped sandbox forever) and returns the channel Pause's result arrives
// on.
func stuckPause(t *testing.T, d *Driver, ctx context.Context, id string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.Pause(ctx, id) }()
	waitFor(t, 10*time.Second, "pause of "+id, func() bool { return running(d, id) > 0 })
	return done
}

// running counts the driver's commands and calls of sandbox id in
// progress.
func running(d *Driver, id string) int {
	d.commands.mu.Lock()
	defer d.commands.mu.Unlock()
	sc := d.commands.bySandbox[id]
	if sc == nil {
		return 0
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.running)
}

type namedCheck struct {
	name string
	op   func() error
}

// othersAnswer are the calls about sandbox other (and the driver's
// listing) that must not wait for the hung sandbox.
func othersAnswer(d *Driver, other, hung string) []namedCheck {
	ctx := context.Background()
	return []namedCheck{
		{"State(other)", func() error {
			if st, err := d.State(ctx, other); err != nil || st != runtime.StateRunning {
				return fmt.Errorf("State(other) = %q, %v; want running", st, err)
			}
			return nil
		}},
		{"State(hung)", func() error {
			_, err := d.State(ctx, hung)
			return err
		}},
		{"List", func() error {
			list, err := d.List(ctx)
			if err != nil {
				return err
			}
			for _, id := range []string{other, hung} {
				i := slices.IndexFunc(list, func(i runtime.Instance) bool { return i.ID == id })
				if i < 0 || list[i].State != runtime.StateRunning || list[i].Pid <= 0 {
					return fmt.Errorf("List = %+v; want %s running with a pid", list, id)
				}
			}
			return nil
		}},
		{"Stats(other)", func() error { _, err := d.Stats(ctx, other); return err }},
		{"Pause(other)", func() error { return d.Pause(ctx, other) }},
		{"Resume(other)", func() error { return d.Resume(ctx, other) }},
	}
}

// within runs op and fails the test if it errs or takes longer than bound.
func within(t *testing.T, bound time.Duration, name string, op func() error) {
	t.Helper()
	start := time.Now()
	err := op()
	took := time.Since(start)
	t.Logf("%s took %v", name, took.Round(time.Millisecond))
	if err != nil {
		t.Errorf("%s: %v", name, err)
	}
	if took > bound {
		t.Errorf("%s took %v; bound %v", name, took, bound)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processesNaming lists the live processes whose command line holds s.
func processesNaming(s string) []int {
	return processesMatching(func(cmdline []byte) bool { return bytes.Contains(cmdline, []byte(s)) })
}

// lockHeld says whether someone holds the flock on path.
func lockHeld(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// sandboxDebris lists what remains on the host of sandbox id.
func sandboxDebris(d *Driver, id string) []string {
	var left []string
	for _, pid := range processesNaming(id) {
		if processAlive(pid) {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			left = append(left, fmt.Sprintf("process %d: %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
	}
	for _, dir := range append(d.cgroups.dirs(d.cgroupPath(id)), d.sandboxDir(id)) {
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "dir "+dir)
		}
	}
	for _, name := range runscRootDebris(d) {
		if strings.Contains(name, id) {
			left = append(left, "runsc file "+name)
		}
	}
	return left
}

// runscRootDebris lists the files under runsc's root other than its
// null-netns mount point.
func runscRootDebris(d *Driver) []string {
	entries, _ := os.ReadDir(d.runscRoot())
	var names []string
	for _, e := range entries {
		if e.Name() != "null-netns" {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestRunscLockFiles: create/kill cycles, with the sandboxes listed all
// along as the manager's monitor does, leave no runsc file behind; Cleanup
// removes stale lock files and control sockets of the sandboxes it does
// not keep, and keeps those of the sandboxes it keeps.
func TestRunscLockFiles(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	f := runtimetest.NewFixture(t, d, env)

	ctx, stop := context.WithCancel(t.Context())
	listed := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if _, err := d.List(ctx); err != nil && ctx.Err() == nil {
				listed <- err
				return
			}
		}
		listed <- nil
	}()
	for range 5 {
		s := f.Start(t)
		if err := d.Kill(t.Context(), s.Spec.ID); err != nil {
			t.Fatalf("Kill: %v", err)
		}
	}
	stop()
	if err := <-listed; err != nil {
		t.Errorf("List during create/kill cycles: %v", err)
	}
	if left := runscRootDebris(d); len(left) > 0 {
		t.Errorf("runsc files left by create/kill cycles: %v", left)
	}

	const kept, gone = "keptkeptkeptkeptkept", "gonegonegonegonegone"
	stale := map[string]bool{ // file -> kept
		kept + "_sandbox:" + kept + ".lock": true,
		gone + "_sandbox:" + gone + ".lock": false,
		"runsc-" + gone + ".sock":           false,
	}
	for name := range stale {
		if err := os.WriteFile(filepath.Join(d.runscRoot(), name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Cleanup(t.Context(), map[string]bool{kept: true}); err != nil {
		t.Fatalf("Cleanup(keep %s): %v", kept, err)
	}
	for name, keep := range stale {
		if _, err := os.Stat(filepath.Join(d.runscRoot(), name)); (err == nil) != keep {
			t.Errorf("after Cleanup(keep %s): %s exists = %v; want %v", kept, name, err == nil, keep)
		}
	}
	if err := d.Cleanup(t.Context(), nil); err != nil {
		t.Fatalf("Cleanup(nil): %v", err)
	}
	if left := runscRootDebris(d); len(left) > 0 {
		t.Errorf("runsc files left after Cleanup(nil): %v", left)
	}
}
