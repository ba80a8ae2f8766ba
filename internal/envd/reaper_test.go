package envd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// exited reports whether child pid has exited, without reaping it; gone
// reports that it was reaped (or is no child).
func exited(t *testing.T, pid int) (exited, gone bool) {
	t.Helper()
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, unix.ECHILD) {
		return true, true
	}
	if err != nil {
		t.Fatalf("waitid %d: %v", pid, err)
	}
	return (*childExit)(unsafe.Pointer(&info)).pid == int32(pid), false
}

func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if done, _ := exited(t, pid); done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not exit", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startExit starts sh exiting with code through r.
func startExit(t *testing.T, r *Reaper, code int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "exit $0", strconv.Itoa(code))
	if err := r.Start(cmd, cmd.Start); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func checkExit(cmd *exec.Cmd, err error, code int) error {
	var exit *exec.ExitError
	switch {
	case code == 0 && err != nil, code != 0 && !errors.As(err, &exit):
		return fmt.Errorf("wait: %v, want exit code %d", err, code)
	case cmd.ProcessState.ExitCode() != code:
		return fmt.Errorf("%v, want exit code %d", cmd.ProcessState, code)
	}
	return nil
}

// TestReaperLeavesOwnChildren: a reaping pass takes the exit status of a
// child not started through the reaper (an orphan, to envd as init) and
// leaves those of the children started through it to their Wait, even when
// they exited before their Wait was called.
func TestReaperLeavesOwnChildren(t *testing.T) {
	r := NewReaper()
	var own []*exec.Cmd
	for code := range 3 {
		own = append(own, startExit(t, r, code))
	}
	orphan, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "exit 0"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range own {
		waitExited(t, cmd.Process.Pid)
	}
	waitExited(t, orphan.Pid)

	r.reap() // may stop at one of ours, which it must leave
	for code, cmd := range own {
		if err := checkExit(cmd, r.Wait(cmd), code); err != nil {
			t.Errorf("child %d: %v", code, err)
		}
		// Each Wait asks for another pass, which may now see past it.
		select {
		case <-r.kick:
		default:
			t.Errorf("child %d: Wait did not kick the reaper", code)
		}
	}
	if n := r.reap(); n != 1 {
		if _, gone := exited(t, orphan.Pid); !gone {
			t.Fatalf("after every Wait, a pass reaped %d; the orphan is left", n)
		}
	}
	if _, gone := exited(t, orphan.Pid); !gone {
		t.Fatal("the orphan was not reaped")
	}
}

// TestReaperRunning: with the reaper running (SIGCHLD and kicks), children
// started through it at once report their own statuses, however they race
// with it, and an orphan is reaped.
func TestReaperRunning(t *testing.T) {
	r := NewReaper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		r.Run(ctx, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	orphan, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "exit 0"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := i % 7
			cmd := exec.Command("/bin/sh", "-c", "exit $0", strconv.Itoa(code))
			if err := r.Start(cmd, cmd.Start); err != nil {
				errs <- err
				return
			}
			if i%2 == 0 {
				// Let it exit, and the reaper see it, before its Wait.
				for {
					var info unix.Siginfo
					err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
					if err != nil || (*childExit)(unsafe.Pointer(&info)).pid != 0 {
						break // exited (or already taken: Wait says so)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			if err := checkExit(cmd, r.Wait(cmd), code); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a child started through the reaper: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, gone := exited(t, orphan.Pid); gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan %d was not reaped", orphan.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
