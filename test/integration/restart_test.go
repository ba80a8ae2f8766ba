package integration

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestRestartAdoptsSandboxes kills the server with SIGKILL, restarts it on
// the same data dir and checks that running sandboxes are adopted: exec
// works, files and processes survive, deadlines still fire.
func TestRestartAdoptsSandboxes(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	long := s.create(map[string]any{"templateID": "base", "timeout": 600})
	short := s.create(map[string]any{"templateID": "base", "timeout": 8})
	s.expect(s.do("POST", "/sandboxes/"+long.SandboxID+"/files/write",
		map[string]string{"path": "/tmp/state", "content": "before crash\n"}), 200, "write")
	// A background process that must survive the server's death.
	s.exec(long.SandboxID, client.ExecuteRequest{Command: "nohup sleep 1000 >/dev/null 2>&1 &"})

	s.stop(syscall.SIGKILL)
	// The sandboxes outlive the server.
	if runscProcesses(long.SandboxID) == 0 {
		t.Fatal("sandbox died with the server")
	}
	s.start()

	var info client.Sandbox
	s.expect(s.do("GET", "/sandboxes/"+long.SandboxID, nil), 200, "get adopted").json(t, &info)
	if info.State != "running" {
		t.Fatalf("adopted sandbox state %q", info.State)
	}
	res := s.exec(long.SandboxID, client.ExecuteRequest{Command: "cat /tmp/state; pgrep -x sleep >/dev/null && echo sleeper"})
	if res.Stdout != "before crash\nsleeper\n" {
		t.Fatalf("adopted sandbox lost state: %+v", res)
	}
	// The short one's deadline still fires after the restart.
	waitFor(t, 30*time.Second, "deadline of an adopted sandbox", func() bool {
		return s.do("GET", "/sandboxes/"+short.SandboxID, nil).status == 404 && runscProcesses(short.SandboxID) == 0
	})
}

// TestGracefulStopLeavesSandboxes: SIGTERM without --kill-on-exit leaves
// sandboxes running; the next start adopts them.
func TestGracefulStopLeavesSandboxes(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--kill-on-exit=false")
	s.start()
	sb := s.create(nil)
	s.stop(syscall.SIGTERM)
	if runscProcesses(sb.SandboxID) == 0 {
		t.Fatal("graceful stop killed the sandbox")
	}
	s.extra = nil // the next stop (cleanup) kills everything
	s.start()
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "echo adopted"}); res.Stdout != "adopted\n" {
		t.Fatalf("exec after graceful restart: %+v", res)
	}
}

// TestDeadSandboxReported: a sandbox whose processes die on their own is
// reported dead and its resources are released.
func TestDeadSandboxReported(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	sb := s.create(nil)
	other := s.create(nil)
	// Kill the gVisor sandbox process from the host, as the OOM killer would.
	out, err := exec.Command("pgrep", "-f", "runsc-sandbox.*"+sb.SandboxID).Output()
	if err != nil {
		t.Fatalf("find sandbox process: %v", err)
	}
	for _, pid := range strings.Fields(string(out)) {
		exec.Command("kill", "-9", pid).Run()
	}
	var info struct {
		State       string `json:"state"`
		EndedReason string `json:"endedReason"`
	}
	waitFor(t, 30*time.Second, "sandbox reported dead", func() bool {
		r := s.do("GET", "/sandboxes/"+sb.SandboxID, nil)
		r.json(t, &info)
		return info.State == "dead"
	})
	if info.EndedReason == "" {
		t.Error("dead sandbox has no reason")
	}
	waitFor(t, 10*time.Second, "dead sandbox's processes gone", func() bool { return runscProcesses(sb.SandboxID) == 0 })
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/execute", map[string]string{"command": "true"}), 409, "exec on dead")
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "delete dead")
	// The neighbour is unharmed.
	if res := s.exec(other.SandboxID, client.ExecuteRequest{Command: "echo ok"}); res.Stdout != "ok\n" {
		t.Fatalf("neighbour: %+v", res)
	}
}
