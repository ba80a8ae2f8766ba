package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// `runsc pause` stops the sandbox's kernel over its control socket, then
// records "paused" in the state file. A runsc killed between the two
// leaves a kernel whose tasks are all stopped while runsc records it
// running: every call into the sandbox waits, and `runsc resume` refuses a
// sandbox it believes runs. Unfreeze finds that case and resumes it.
//
// The kernel's own pause state is not exposed, and resuming a kernel that
// is not paused panics the sentry (its stop count goes negative), so
// Unfreeze looks before it acts: in a paused kernel every task goroutine
// waits in Task.doStop, while in a running one envd's tasks wait in
// their system calls.

// boundStacks bounds `runsc debug --stacks`: one control call, a few
// milliseconds; it is read-only, so it gets no grace.
var boundStacks = bound{timeout: 10 * time.Second}

// Unfreeze resumes sandbox id when runsc records it running but its kernel
// is stopped, and reports whether it did. A sandbox whose sandbox process
// the host stopped (SIGSTOP) is not the kernel's doing: it is an error.
func (d *Driver) Unfreeze(ctx context.Context, id string) (bool, error) {
	if err := d.requireSandbox(id); err != nil {
		return false, fmt.Errorf("unfreeze %s: %w", id, err)
	}
	st, err := d.readRunscState(id)
	if err != nil {
		return false, fmt.Errorf("unfreeze %s: %w", id, err)
	}
	pid := st.sandboxPid()
	if st.Status != "running" || !d.processOf(pid, id) {
		return false, nil
	}
	if hostStopped(pid) {
		return false, fmt.Errorf("unfreeze %s: the sandbox process %d is stopped on the host", id, pid)
	}
	// Logged nowhere (a goroutine dump is long), but a command of the
	// sandbox: its removal ends it, for it takes runsc's lock of it.
	out, err := d.runscLogging(ctx, boundStacks, "", id, "debug", "--stacks", id)
	if err != nil {
		return false, fmt.Errorf("unfreeze %s: %w", id, err)
	}
	if !kernelStopped(out) {
		return false, nil
	}
	d.log.WarnContext(ctx, "sandbox kernel stopped while runsc records it running (a pause cut short): resuming", "sandbox_id", id)
	// runsc resumes only a sandbox it records paused; the kernel is.
	if err := d.setRunscStatus(id, "paused"); err != nil {
		return false, fmt.Errorf("unfreeze %s: %w", id, err)
	}
	if err := d.Resume(ctx, id); err != nil {
		return false, fmt.Errorf("unfreeze %s: %w", id, err)
	}
	return true, nil
}

var _ runtime.Unfreezer = (*Driver)(nil)

// kernelStopped says whether a sentry's goroutine dump shows its kernel
// stopped: it has task goroutines and every one waits in Task.doStop.
func kernelStopped(stacks []byte) bool {
	tasks := 0
	for _, g := range bytes.Split(stacks, []byte("\ngoroutine ")) {
		if !bytes.Contains(g, []byte("kernel.(*Task).run(")) {
			continue
		}
		tasks++
		if !bytes.Contains(g, []byte("kernel.(*Task).doStop(")) {
			return false
		}
	}
	return tasks > 0
}

// hostStopped says whether pid is stopped on the host (SIGSTOP, or a
// tracer's stop).
func hostStopped(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return false
	}
	state := strings.Fields(string(stat[end+1:]))
	return len(state) > 0 && (state[0] == "T" || state[0] == "t")
}
