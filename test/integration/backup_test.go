package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// aenvAdmin runs `aenv admin args...` of binDir and returns its exit code
// and standard error.
func aenvAdmin(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "aenv"), append([]string{"admin"}, args...)...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("aenv admin %v: %v\n%s", args, err, stderr.String())
	return -1, ""
}

// TestBackupRestore backs a single node up while it runs, restores the
// backup into a new data dir and starts a second server on it: the
// templates, the snapshot and the sandbox paused to disk come back, the
// latter with its files and processes.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newServer(t)
	s.start()

	sb := s.create(map[string]any{"templateID": "base", "timeout": 600})
	id := sb.SandboxID
	s.expect(s.do("POST", "/sandboxes/"+id+"/files/write",
		map[string]string{"path": "/home/user/state", "content": "before the backup\n"}), 200, "write")
	// A process that lives in the sandbox's memory only.
	s.exec(id, client.ExecuteRequest{Command: "nohup sleep 1000 >/dev/null 2>&1 &"})
	snap, err := s.api.CreateSnapshot(ctx, id, "backup-snap")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.api.Pause(ctx, id, client.PauseRequest{ToDisk: true}); err != nil {
		t.Fatal(err)
	}
	// A running sandbox has no image: the backup names it.
	running := s.create(nil)

	file := filepath.Join(t.TempDir(), "node.tar.zst")
	code, stderr := aenvAdmin(t, "backup", file, "--data-dir", s.dataDir)
	if code != 0 {
		t.Fatalf("backup: exit %d\n%s", code, stderr)
	}
	t.Logf("backup: %s", strings.TrimSpace(stderr))
	if !strings.Contains(stderr, "sandbox "+running.SandboxID+" is running: not in the backup") {
		t.Errorf("backup did not warn of the running sandbox:\n%s", stderr)
	}
	// The server went on serving while it was backed up.
	s.exec(running.SandboxID, client.ExecuteRequest{Command: "true"})

	// A data dir in use is never restored into.
	code, stderr = aenvAdmin(t, "restore", file, "--data-dir", s.dataDir)
	if code != 1 || !strings.Contains(stderr, "is not empty") {
		t.Errorf("restore into a non-empty data dir: exit %d, want 1\n%s", code, stderr)
	}

	if fi, err := os.Stat(file); err == nil {
		t.Logf("backup file: %.1f MiB", float64(fi.Size())/(1<<20))
	}
	// The old node is gone: nothing of its data dir can stand in for the
	// restored one's files.
	s.stop(syscall.SIGTERM)
	if err := os.Rename(s.dataDir, s.dataDir+"-gone"); err != nil {
		t.Fatal(err)
	}

	r := newServer(t)
	code, stderr = aenvAdmin(t, "restore", file, "--data-dir", r.dataDir)
	if code != 0 {
		t.Fatalf("restore: exit %d\n%s", code, stderr)
	}
	t.Logf("restore: %s", strings.TrimSpace(stderr))
	r.start()

	templates, err := r.api.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(templates, func(tpl client.Template) bool { return tpl.Name == "base" || slices.Contains(tpl.Aliases, "base") }) {
		t.Errorf("restored node has no base template: %+v", templates)
	}
	snaps, err := r.api.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(snaps, func(x client.Snapshot) bool { return x.SnapshotID == snap.SnapshotID }) {
		t.Errorf("restored node lacks snapshot %s: %+v", snap.SnapshotID, snaps)
	}
	got, err := r.api.GetSandbox(ctx, id)
	if err != nil {
		t.Fatalf("paused sandbox after the restore: %v", err)
	}
	if got.State != "paused" {
		t.Fatalf("restored sandbox state %q, want paused", got.State)
	}
	// The one running at the backup comes back dead, as after a crash.
	if gone, err := r.api.GetSandbox(ctx, running.SandboxID); err == nil && gone.State != "dead" {
		t.Errorf("the sandbox running at the backup came back %s", gone.State)
	}
	if err := r.api.Resume(ctx, id, 120); err != nil {
		t.Fatalf("resume the restored sandbox: %v", err)
	}
	res := r.exec(id, client.ExecuteRequest{Command: "cat /home/user/state; pgrep -x sleep >/dev/null && echo sleeper"})
	if res.Stdout != "before the backup\nsleeper\n" {
		t.Errorf("restored sandbox lost state: %+v", res)
	}
	// The snapshot starts a sandbox with the files it was taken with.
	child := r.create(map[string]any{"templateID": "backup-snap"})
	res = r.exec(child.SandboxID, client.ExecuteRequest{Command: "cat /home/user/state"})
	if res.Stdout != "before the backup\n" {
		t.Errorf("sandbox from the restored snapshot: %+v", res)
	}
	if entries, err := os.ReadDir(filepath.Dir(file)); err != nil || len(entries) != 1 {
		t.Errorf("backup dir: %v %v, want the backup alone", entries, err)
	}
}
