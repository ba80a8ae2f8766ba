package gvisor

import (
	"os"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// goroutine is one goroutine of a sentry's stack dump, as
// `runsc debug --stacks` prints it, with the given frames.
func goroutine(n int, state string, frames ...string) string {
	var b strings.Builder
	b.WriteString("goroutine ")
	b.WriteString(strings.Repeat("1", n))
	b.WriteString(" [" + state + "]:\n")
	for _, f := range frames {
		b.WriteString(f + "(0xc000123456)\n\t/src/file.go:10 +0x1f\n")
	}
	b.WriteString("created by gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).Start in goroutine 1\n\n")
	return b.String()
}

var (
	stoppedTask = goroutine(3, "sync.Cond.Wait", "sync.(*Cond).Wait",
		"gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).doStop", "gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).run")
	blockedTask = goroutine(4, "select", "gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).block",
		"gvisor.dev/gvisor/pkg/sentry/syscalls/linux.EpollWait", "gvisor.dev/gvisor/pkg/sentry/kernel.(*Task).run")
	controlServer = goroutine(2, "IO wait", "gvisor.dev/gvisor/pkg/urpc.(*Server).handleRegistered")
)

// TestKernelStopped: a sentry's kernel is stopped only when it has task
// goroutines and every one waits in Task.doStop; one task in a system
// call (envd waiting for a connection) means it runs. Resuming a kernel
// that runs would crash the sentry, so anything else is "not stopped".
func TestKernelStopped(t *testing.T) {
	tests := []struct {
		name string
		dump string
		want bool
	}{
		{"every task stopped", "Stack dump:\n" + controlServer + stoppedTask + stoppedTask, true},
		{"one task in a system call", controlServer + stoppedTask + blockedTask, false},
		{"all tasks in system calls", controlServer + blockedTask, false},
		{"no task goroutines", controlServer, false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kernelStopped([]byte(tt.dump)); got != tt.want {
				t.Errorf("kernelStopped = %v; want %v", got, tt.want)
			}
		})
	}
}

// TestUnfreezeAndRepair, with real sandboxes: a kernel paused behind
// runsc's back (runsc pause, then the state put back to "running", as a
// kill between pause's two steps leaves it) is found and resumed, while a
// running sandbox is never touched (resuming it would crash its sentry);
// a state file emptied under a live sandbox is rebuilt, and runsc manages
// the sandbox again.
func TestUnfreezeAndRepair(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	f := runtimetest.NewFixture(t, d, env)
	sb := f.Start(t)
	id := sb.Spec.ID

	if resumed, err := d.Unfreeze(t.Context(), id); err != nil || resumed {
		t.Fatalf("Unfreeze(running) = %v, %v; want false, nil", resumed, err)
	}
	sb.WaitReady(t)

	if _, err := d.runsc(t.Context(), boundControl, id, "pause", id); err != nil {
		t.Fatal(err)
	}
	if err := d.setRunscStatus(id, "running"); err != nil {
		t.Fatal(err)
	}
	if sb.Answers(t) {
		t.Fatal("a paused sandbox answers")
	}
	if resumed, err := d.Unfreeze(t.Context(), id); err != nil || !resumed {
		t.Fatalf("Unfreeze(frozen) = %v, %v; want true, nil", resumed, err)
	}
	sb.WaitReady(t)
	if st, err := d.State(t.Context(), id); err != nil || st != runtime.StateRunning {
		t.Fatalf("State after Unfreeze = %q, %v; want running", st, err)
	}

	if err := os.Truncate(d.runscStatePath(id), 0); err != nil {
		t.Fatal(err)
	}
	if st, err := d.State(t.Context(), id); err != nil || st != runtime.StateRunning {
		t.Fatalf("State with an emptied state file = %q, %v; want running", st, err)
	}
	d.repairStates(t.Context())
	if err := d.Pause(t.Context(), id); err != nil {
		t.Fatalf("Pause after repair: %v", err)
	}
	if err := d.Resume(t.Context(), id); err != nil {
		t.Fatalf("Resume after repair: %v", err)
	}
	sb.WaitReady(t)
}
