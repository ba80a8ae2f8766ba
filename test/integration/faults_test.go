package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestSnapshotDiskFull: a snapshot that does not fit on the disk fails
// with 507, leaves no partial snapshot listed or on disk, and the source
// keeps running.
func TestSnapshotDiskFull(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	// The data dir's images/ lives on a small tmpfs.
	imagesDir := filepath.Join(s.dataDir, "images")
	if err := os.MkdirAll(imagesDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", imagesDir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", imagesDir).Run() })
	s.start()
	id := s.create(nil).SandboxID
	s.exec(id, client.ExecuteRequest{Command: "nohup python3 -c 'import os,time; d=bytearray(os.urandom(1<<20))*96; time.sleep(1e9)' >/dev/null 2>&1 & sleep 3"})

	r := s.do("POST", "/sandboxes/"+id+"/snapshots", map[string]string{"name": "too-big"})
	if r.status != 507 {
		t.Fatalf("snapshot on a full disk: %d %s", r.status, r.body)
	}
	var list []client.Snapshot
	s.expect(s.do("GET", "/snapshots", nil), 200, "list").json(t, &list)
	if len(list) != 0 {
		t.Fatalf("a failed snapshot is listed: %+v", list)
	}
	entries, _ := os.ReadDir(imagesDir)
	if len(entries) != 0 {
		t.Fatalf("partial image left: %v", entries)
	}
	if res := s.exec(id, client.ExecuteRequest{Command: "echo still running"}); res.Stdout != "still running\n" {
		t.Fatalf("source after failed snapshot: %+v", res)
	}
	// A fork that cannot write its image fails whole, with nothing made.
	r = s.do("POST", "/sandboxes/"+id+"/fork", map[string]int{"count": 2})
	if r.status != 507 {
		t.Fatalf("fork on a full disk: %d %s", r.status, r.body)
	}
	var sandboxes []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes", nil), 200, "list").json(t, &sandboxes)
	if len(sandboxes) != 1 {
		t.Fatalf("fork on a full disk left sandboxes: %+v", sandboxes)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "delete")
}

// TestKillDuringFork: the server dies (kill -9) in the middle of a fork;
// after a restart no half-made sandbox is listed, the parent still runs,
// and fork images and partial files are reclaimed.
func TestKillDuringFork(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--fork-parallelism", "1", "--warm-sandboxes", "0")
	s.start()
	parent := s.create(nil).SandboxID
	done := make(chan response, 1)
	go func() { done <- s.doNoFail("POST", "/sandboxes/"+parent+"/fork", map[string]int{"count": 8}) }()
	// Wait until the fork has started restoring children, then kill.
	waitFor(t, 30*time.Second, "fork under way", func() bool {
		return strings.Contains(s.logs.String(), `restored=true`)
	})
	s.stop(syscall.SIGKILL)
	<-done
	s.start()
	// The fork was never answered: none of its children may be left
	// (the client could never learn their IDs).
	var list []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes?state=running,paused,dead", nil), 200, "list").json(t, &list)
	for _, sb := range list {
		if sb.SandboxID != parent {
			t.Errorf("child %s of an unanswered fork is %s after restart", sb.SandboxID, sb.State)
		}
	}
	if res := s.exec(parent, client.ExecuteRequest{Command: "echo parent"}); res.Stdout != "parent\n" {
		t.Fatalf("parent after restart: %+v", res)
	}
	entries, _ := os.ReadDir(filepath.Join(s.dataDir, "images"))
	for _, e := range entries {
		t.Errorf("image left after restart: %s", e.Name())
	}
	// Only listed sandboxes have runsc instances.
	out, _ := exec.Command("pgrep", "-af", "runsc-sandbox.*"+s.dataDir).Output()
	if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; len(strings.TrimSpace(string(out))) > 0 && n != len(list) {
		t.Fatalf("%d sandbox processes for %d listed sandboxes:\n%s", n, len(list), out)
	}
}
