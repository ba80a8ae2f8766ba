package envd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaper lets envd be the sandbox's init (PID 1) as well as its server: it
// collects the exit status of every orphan that reparents to envd, and
// leaves alone the statuses of the processes envd started itself, which
// their exec.Cmd.Wait collects.
//
// A plain wait4(-1) loop would steal those statuses (Wait would fail with
// "no child processes"). So the reaper first peeks at an exited child with
// waitid(WNOWAIT), and reaps it only if it is not one of envd's own. Every
// process envd starts must therefore be started through Start and waited
// for through Wait. A reaping step excludes Starts (not each other), so
// that a child that exits before Start has recorded it is never mistaken
// for an orphan.
//
// One process instead of an init supervising a server halves envd's cost
// in every sandbox: each Go process of the guest costs ~4.6 MiB of host
// memory under gVisor (its runtime's pages and its systrap stub).
type Reaper struct {
	// forking is held shared by each Start from before its fork until its
	// child is recorded, and exclusively by each reaping step.
	forking sync.RWMutex

	mu   sync.Mutex
	ours map[int]*exec.Cmd // started through Start, until their Wait

	kick chan struct{}
}

// NewReaper returns a Reaper that reaps nothing until Run.
func NewReaper() *Reaper {
	return &Reaper{ours: map[int]*exec.Cmd{}, kick: make(chan struct{}, 1)}
}

// Start runs start, which starts cmd (cmd.Start, or a helper that calls
// it), and records cmd's process as envd's own.
func (r *Reaper) Start(cmd *exec.Cmd, start func() error) error {
	r.forking.RLock()
	defer r.forking.RUnlock()
	if err := start(); err != nil {
		return err
	}
	r.mu.Lock()
	r.ours[cmd.Process.Pid] = cmd
	r.mu.Unlock()
	return nil
}

// Wait waits for cmd, started through Start, as cmd.Wait does.
func (r *Reaper) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	r.mu.Lock()
	// The PID may be another child's already, started since.
	if r.ours[cmd.Process.Pid] == cmd {
		delete(r.ours, cmd.Process.Pid)
	}
	r.mu.Unlock()
	// A pass may have stopped at this process (see reap): look again.
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return err
}

// Run reaps orphans until ctx ends: at every SIGCHLD, and after every Wait.
func (r *Reaper) Run(ctx context.Context, log *slog.Logger) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		if n := r.reap(); n > 0 {
			log.Debug("reaped orphans", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-r.kick:
		}
	}
}

// childExit is the start of siginfo_t as waitid fills it for a child:
// signo, errno and code, then (8-byte aligned) the child's PID.
type childExit struct {
	signo, errno, code, _ int32
	pid                   int32
}

// reap collects exited orphans one step at a time and returns how many.
// It stops at the first exited child of envd's own that waitid shows it:
// waitid cannot look past it, and that child's Wait kicks another pass
// once it has collected it.
func (r *Reaper) reap() int {
	reaped := 0
	for r.reapOne() {
		reaped++
	}
	return reaped
}

// reapOne reaps one exited orphan, if waitid shows one first.
func (r *Reaper) reapOne() bool {
	r.forking.Lock()
	defer r.forking.Unlock()
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		pid := int((*childExit)(unsafe.Pointer(&info)).pid)
		if err != nil || pid == 0 {
			return false // ECHILD (no children), or none exited
		}
		r.mu.Lock()
		own := r.ours[pid] != nil
		r.mu.Unlock()
		if own {
			return false
		}
		var ws unix.WaitStatus
		_, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil
	}
}
