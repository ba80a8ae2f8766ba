package gvisor

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
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
	var released sync.WaitGroup
	run := func(id string) (*exec.Cmd, <-chan error) {
		t.Helper()
		// A shell with a child in its group, as runsc has helpers.
		cmd := exec.Command("sh", "-c", "sleep 60 & wait")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		finished, err := r.start(id, cmd)
		if err != nil {
			t.Fatalf("start a command of %s: %v", id, err)
		}
		// Sent before finished, as runBounded returns after it: stop
		// returns once finished has run.
		done := make(chan error, 1)
		released.Add(1)
		go func() {
			defer released.Done()
			err := cmd.Wait()
			done <- err
			if removed := finished(); !removed && id == "sb-removed" {
				t.Errorf("finished says %s was not being removed", id)
			}
		}()
		return cmd, done
	}
	removed, removedDone := run("sb-removed")
	other, otherDone := run("sb-other")
	t.Cleanup(func() { _ = syscall.Kill(-other.Process.Pid, syscall.SIGKILL) })
	for _, cmd := range []*exec.Cmd{removed, other} {
		deadline := time.Now().Add(10 * time.Second)
		for groupLive(cmd.Process.Pid) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the shell %d started no child", cmd.Process.Pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

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
	// The command's whole process group went, its child too.
	waitForGroupGone(t, removed.Process.Pid)
	if _, err := r.start("sb-removed", exec.Command("true")); !errors.Is(err, errRemoved) || !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("a command of a sandbox being removed: %v, want errRemoved (ErrNotFound)", err)
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
	if finished() {
		t.Error("finished says the sandbox is being removed after its removal ended")
	}
	_ = syscall.Kill(-other.Process.Pid, syscall.SIGKILL)
	<-otherDone
	released.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bySandbox) != 0 {
		t.Errorf("records left with nothing to track: %v", r.bySandbox)
	}
}

// waitForGroupGone waits until every process of group pgid has exited
// (a zombie waiting for its parent to reap it counts as gone).
func waitForGroupGone(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for groupLive(pgid) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has live processes", pgid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupLive counts the processes of group pgid that run.
func groupLive(pgid int) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: state, ppid, pgrp.
		end := bytes.LastIndexByte(stat, ')')
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) && fields[0] != "Z" && fields[0] != "X" {
			n++
		}
	}
	return n
}
