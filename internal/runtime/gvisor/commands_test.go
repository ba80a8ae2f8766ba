package gvisor

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// TestRunningCommandsStop: a removal kills the commands running for its
// sandbox (and their process group), waits for them, refuses new ones
// until it is done, and leaves other sandboxes' commands alone.
func TestRunningCommandsStop(t *testing.T) {
	var r runningCommands
	run := func(id string) (*exec.Cmd, <-chan error) {
		t.Helper()
		// A shell with a child in its group, as runsc has helpers.
		cmd := exec.Command("sh", "-c", "sleep 60 & wait")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		finished, err := r.start(id, cmd)
		if err != nil {
			t.Fatalf("start a command of %s: %v", id, err)
		}
		done := make(chan error, 1)
		go func() {
			err := cmd.Wait()
			finished()
			done <- err
		}()
		return cmd, done
	}
	_, removedDone := run("sb-removed")
	other, otherDone := run("sb-other")
	t.Cleanup(func() { _ = syscall.Kill(-other.Process.Pid, syscall.SIGKILL) })

	start := time.Now()
	allow := r.stop("sb-removed", time.Now().Add(10*time.Second))
	select {
	case err := <-removedDone:
		if err == nil {
			t.Error("the removed sandbox's command exited cleanly; want killed")
		}
	default:
		t.Fatalf("stop returned after %v with its sandbox's command still running", time.Since(start))
	}
	if _, err := r.start("sb-removed", exec.Command("true")); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("a command of a sandbox being removed: %v, want ErrNotFound", err)
	}
	select {
	case err := <-otherDone:
		t.Fatalf("another sandbox's command ended: %v", err)
	default:
	}
	allow()

	cmd := exec.Command("true")
	finished, err := r.start("sb-removed", cmd)
	if err != nil {
		t.Fatalf("a command once the removal is done: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	finished()
	_ = syscall.Kill(-other.Process.Pid, syscall.SIGKILL)
	<-otherDone
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bySandbox) != 0 {
		t.Errorf("records left with nothing to track: %v", r.bySandbox)
	}
}
