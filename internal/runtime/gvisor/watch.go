package gvisor

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/runtime"
)

var _ runtime.Watcher = (*Driver)(nil)

// Exited returns a channel closed when the sandbox process of sandbox id
// (the sentry) exits, or when ctx ends. It holds a pidfd of the process,
// waited on by the Go runtime's poller: no polling, and a reused PID
// cannot be mistaken for the sandbox.
func (d *Driver) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	if err := d.requireSandbox(id); err != nil {
		return nil, fmt.Errorf("watch %s: %w", id, err)
	}
	// An unreadable state file leaves sentryPid to find the process.
	st, _ := d.readRunscState(id)
	pid := d.sentryPid(id, st.sandboxPid())
	if pid == 0 {
		return nil, fmt.Errorf("watch %s: %w: no sandbox process", id, runtime.ErrNotFound)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch %s: pidfd_open %d: %w", id, pid, err)
	}
	// The PID may have been the sandbox's and been reused before the
	// pidfd was opened: look again now that the pidfd pins the process.
	if !d.processOf(pid, id) {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w: its process %d exited", id, runtime.ErrNotFound, pid)
	}
	// A non-blocking pidfd is registered with the runtime's poller; it
	// becomes readable when the process exits.
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch %s: %w", id, err)
	}
	exited := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(exited)
		defer stop()
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				n, err := unix.Poll(fds, 0)
				if err == unix.EINTR {
					// A signal (the Go runtime's preemption among them)
					// is no exit.
					continue
				}
				return err != nil || n > 0
			}
		})
		// A watch ended by ctx closed the pidfd under the read, which then
		// fails (with poll's own "use of closed file", not os.ErrClosed):
		// that is no failure to report.
		if err != nil && ctx.Err() == nil {
			d.log.Warn("watch sandbox process", "sandbox_id", id, "err", err)
		}
		f.Close()
	}()
	return exited, nil
}
