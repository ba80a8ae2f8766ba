package gvisor

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// TestStateFromFiles: State and List answer from runsc's state file and
// the sandbox's process, without runsc: the recorded status holds only
// while a live process of that sandbox has the recorded PID.
func TestStateFromFiles(t *testing.T) {
	stateDir := t.TempDir()
	d := &Driver{cfg: Config{StateDir: stateDir}, log: slog.New(slog.DiscardHandler)}
	for _, dir := range []string{d.runscRoot(), d.sandboxesDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	const id = "aaaaaaaaaaaaaaaaaaaa"
	// A stand-in for the sandbox process: its command line names runsc's
	// root and the ID, as runsc-sandbox's does.
	proc := exec.Command("sh", "-c", "sleep 3600; true", "sh", "--root="+d.runscRoot(), id)
	proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	// The group: sleep too.
	t.Cleanup(func() { _ = syscall.Kill(-proc.Process.Pid, syscall.SIGKILL); _ = proc.Wait() })
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}

	stateFile := func(status string, pid int) string {
		return fmt.Sprintf(`{"id":%q,"status":%q,"goferPid":0,"sandbox":{"id":%q,"pid":%d}}`, id, status, id, pid)
	}
	tests := []struct {
		name    string
		state   string // "" for no state file
		want    runtime.State
		wantPid int // a sandbox made but not started has its process
	}{
		{"no runsc state", "", runtime.StateStopped, 0},
		{"running", stateFile("running", proc.Process.Pid), runtime.StateRunning, proc.Process.Pid},
		{"paused", stateFile("paused", proc.Process.Pid), runtime.StatePaused, proc.Process.Pid},
		{"created", stateFile("created", proc.Process.Pid), runtime.StateStopped, proc.Process.Pid},
		{"running but its process exited", stateFile("running", dead.Process.Pid), runtime.StateStopped, 0},
		{"running but the PID is another process's", stateFile("running", os.Getpid()), runtime.StateStopped, 0},
		{"truncated state file", stateFile("running", proc.Process.Pid)[:40], runtime.StateStopped, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.MkdirAll(d.sandboxDir(id), 0o700); err != nil {
				t.Fatal(err)
			}
			_ = os.Remove(d.runscStatePath(id))
			if tt.state != "" {
				if err := os.WriteFile(d.runscStatePath(id), []byte(tt.state), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := d.State(t.Context(), id); err != nil || got != tt.want {
				t.Errorf("State = %q, %v; want %q", got, err, tt.want)
			}
			list, err := d.List(t.Context())
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			want := []runtime.Instance{{ID: id, State: tt.want, Pid: tt.wantPid}}
			if !slices.Equal(list, want) {
				t.Errorf("List = %+v; want %+v", list, want)
			}
		})
	}

	// runsc state without a bundle directory (a crash between the two) is
	// listed too; an unknown ID is not found.
	if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.runscStatePath(id), []byte(stateFile("running", proc.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if list, err := d.List(t.Context()); err != nil || len(list) != 1 || list[0].ID != id {
		t.Errorf("List with runsc state only = %+v, %v; want %s", list, err, id)
	}
	if _, err := d.State(t.Context(), "bbbbbbbbbbbbbbbbbbbb"); err == nil {
		t.Error("State(unknown) succeeded")
	}
}
