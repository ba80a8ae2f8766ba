package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
)

// newFileDriver returns a driver over a fresh state dir that only reads
// and writes files (no runsc, no cgroups).
func newFileDriver(t *testing.T) *Driver {
	t.Helper()
	d := &Driver{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	for _, dir := range []string{d.runscRoot(), d.sandboxesDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// startStandIn starts a process that looks like a runsc process of sandbox
// id to the driver: argv0 is name and its command line names runsc's root
// and the ID. It is killed at cleanup.
func startStandIn(t *testing.T, d *Driver, name, id, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script, "sh", "--root="+d.runscRoot(), id)
	cmd.Args[0] = name
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	return cmd
}

func testStateFile(id, status string, pid int) string {
	return fmt.Sprintf(`{"id":%q,"status":%q,"goferPid":0,"sandbox":{"id":%q,"pid":%d,"controlSocketPath":"x"},"spec":{"ociVersion":"1.0"}}`,
		id, status, id, pid)
}

// TestUnreadableStateOfLiveSandbox: a state file a killed runsc left empty
// or cut short does not make a live sandbox stopped (which reconcile and
// the monitor would kill): its process answers, with the status of the
// driver's copy; only a sandbox without a process is stopped.
func TestUnreadableStateOfLiveSandbox(t *testing.T) {
	d := newFileDriver(t)
	const id = "aaaaaaaaaaaaaaaaaaaa"
	sentry := startStandIn(t, d, "runsc-sandbox", id, "sleep 3600; true")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := sentry.Process.Pid
	tests := []struct {
		name    string
		id      string
		state   string
		backup  string // "" for none
		want    runtime.State
		wantPid int
	}{
		{"empty, copy says running", id, "", testStateFile(id, "running", pid), runtime.StateRunning, pid},
		{"cut short, copy says paused", id, testStateFile(id, "running", pid)[:30], testStateFile(id, "paused", pid), runtime.StatePaused, pid},
		{"empty, no copy, sandbox process found", id, "", "", runtime.StateRunning, pid},
		{"empty, copy's PID is another's, sandbox process found", id, "", testStateFile(id, "running", os.Getpid()), runtime.StateRunning, pid},
		{"empty, no sandbox process", "bbbbbbbbbbbbbbbbbbbb", "", testStateFile("bbbbbbbbbbbbbbbbbbbb", "running", dead.Process.Pid), runtime.StateStopped, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.MkdirAll(d.sandboxDir(tt.id), 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(d.sandboxDir(tt.id)); os.Remove(d.runscStatePath(tt.id)) })
			if err := os.WriteFile(d.runscStatePath(tt.id), []byte(tt.state), 0o600); err != nil {
				t.Fatal(err)
			}
			if tt.backup != "" {
				if err := os.WriteFile(d.stateBackupPath(tt.id), []byte(tt.backup), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got := d.instance(tt.id)
			if got.State != tt.want || got.Pid != tt.wantPid {
				t.Errorf("instance = %+v; want state %q pid %d", got, tt.want, tt.wantPid)
			}
		})
	}
}

// TestRepairState: at start, an unreadable state file of a sandbox whose
// process lives is rebuilt from the driver's copy (runsc can manage the
// sandbox again); one whose process is gone is left for Kill.
func TestRepairState(t *testing.T) {
	d := newFileDriver(t)
	const live, gone = "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	sentry := startStandIn(t, d, "runsc-sandbox", live, "sleep 3600; true")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for id, pid := range map[string]int{live: sentry.Process.Pid, gone: dead.Process.Pid} {
		if err := os.MkdirAll(d.sandboxDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		// A healthy state file, copied as after a command; then emptied.
		if err := os.WriteFile(d.runscStatePath(id), []byte(testStateFile(id, "running", pid)), 0o640); err != nil {
			t.Fatal(err)
		}
		d.saveStateBackup(t.Context(), id)
		if err := os.Truncate(d.runscStatePath(id), 0); err != nil {
			t.Fatal(err)
		}
	}
	d.repairStates(t.Context())
	if st, err := d.readRunscState(live); err != nil || st.Status != "running" || st.sandboxPid() != sentry.Process.Pid {
		t.Errorf("live sandbox's state after repair = %+v, %v; want running with pid %d", st, err, sentry.Process.Pid)
	}
	if b, err := os.ReadFile(d.runscStatePath(gone)); err != nil || len(b) != 0 {
		t.Errorf("gone sandbox's state after repair = %q, %v; want it left empty", b, err)
	}
}

// TestSetRunscStatus: only the status changes; every other field runsc
// wrote is kept.
func TestSetRunscStatus(t *testing.T) {
	d := newFileDriver(t)
	const id = "aaaaaaaaaaaaaaaaaaaa"
	orig := testStateFile(id, "running", 42)
	if err := os.WriteFile(d.runscStatePath(id), []byte(orig), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := d.setRunscStatus(id, "paused"); err != nil {
		t.Fatal(err)
	}
	var before, after map[string]any
	b, _ := os.ReadFile(d.runscStatePath(id))
	if err := json.Unmarshal(b, &after); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(orig), &before)
	before["status"] = "paused"
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("state after setRunscStatus = %v; want %v", after, before)
	}
}

// TestEndStrayCommands: runsc commands a killed server left running are
// let finish (killed mid-write they would empty a state file or leave a
// kernel paused behind runsc's back); only those past the bound are
// killed, and the sandboxes' own processes (and a restore's checkpoint
// gofer) are kept.
func TestEndStrayCommands(t *testing.T) {
	d := newFileDriver(t)
	const id = "aaaaaaaaaaaaaaaaaaaa"
	done := filepath.Join(t.TempDir(), "done")
	// A command that finishes on its own: a pause writing its state.
	finishing := startStandIn(t, d, "runsc", id, "sleep 0.5; echo done > "+done)
	stuck := startStandIn(t, d, "runsc", id, "sleep 3600; true")
	sentry := startStandIn(t, d, "runsc-sandbox", id, "sleep 3600; true")
	// A restore's checkpoint gofer, waiting for the next server's feed.
	gofer := startStandIn(t, d, ckptgofer.ProcessName, id, "sleep 3600; true")
	waited := make(chan struct{})
	go func() { _ = finishing.Wait(); close(waited) }()

	start := time.Now()
	d.endStrayCommands(t.Context(), 3*time.Second)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("endStrayCommands took %v", took)
	}
	if b, err := os.ReadFile(done); err != nil || string(b) != "done\n" {
		t.Errorf("the finishing command was cut: %q, %v", b, err)
	}
	if processAlive(stuck.Process.Pid) {
		t.Error("the stuck command still runs")
	}
	if !processAlive(sentry.Process.Pid) {
		t.Error("the sandbox process was killed")
	}
	if !processAlive(gofer.Process.Pid) {
		t.Error("the checkpoint gofer was killed")
	}
	<-waited
}

// TestExited: the channel closes as soon as the sandbox process exits
// (no poll interval), and when the caller's context ends, which is no
// failure to warn of (a server's stop ends one watch per sandbox).
func TestExited(t *testing.T) {
	d := newFileDriver(t)
	var warnings bytes.Buffer
	d.log = slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	const id = "aaaaaaaaaaaaaaaaaaaa"
	if err := os.MkdirAll(d.sandboxDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	sentry := startStandIn(t, d, "runsc-sandbox", id, "sleep 3600; true")
	if err := os.WriteFile(d.runscStatePath(id), []byte(testStateFile(id, "running", sentry.Process.Pid)), 0o640); err != nil {
		t.Fatal(err)
	}
	exited, err := d.Exited(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancelled, err := d.Exited(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("closed while the process runs")
	default:
	}
	cancel()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("not closed within 5 s of the context's end")
	}
	if warnings.Len() > 0 {
		t.Errorf("a watch ended by its context warned: %s", warnings.String())
	}
	start := time.Now()
	if err := syscall.Kill(sentry.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Logf("exit seen after %v", time.Since(start))
	case <-time.After(time.Second):
		t.Fatal("exit not seen within 1 s")
	}
	if _, err := d.Exited(t.Context(), "bbbbbbbbbbbbbbbbbbbb"); err == nil {
		t.Error("Exited of an unknown sandbox succeeded")
	}
}
