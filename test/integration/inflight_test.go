package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A call in flight when its sandbox is killed or paused ends at once with
// an answer that says which, never a timeout or a protocol error.
func TestCallsEndWhenSandboxStops(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	for _, tc := range []struct {
		name string
		stop func(id string)
		why  string
	}{
		{"kill", func(id string) { s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "delete") }, "was killed"},
		{"pause", func(id string) { s.expect(s.do("POST", "/sandboxes/"+id+"/pause", nil), 204, "pause") }, "was paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := s.create(nil).SandboxID
			answered := make(chan response, 1)
			go func() {
				answered <- s.doNoFail("POST", "/sandboxes/"+id+"/execute",
					client.ExecuteRequest{Command: "sleep 60", Timeout: 120})
			}()
			waitFor(t, 30*time.Second, "sleep running", func() bool {
				res := s.exec(id, client.ExecuteRequest{Command: "pgrep -x sleep || true"})
				return strings.TrimSpace(res.Stdout) != ""
			})
			stopped := time.Now()
			tc.stop(id)
			var r response
			select {
			case r = <-answered:
			case <-time.After(15 * time.Second):
				t.Fatal("execute still unanswered 15 s after the sandbox stopped")
			}
			took := time.Since(stopped)
			var body struct {
				Code     int    `json:"code"`
				Message  string `json:"message"`
				TimedOut bool   `json:"timedOut"`
			}
			json.Unmarshal(r.body, &body)
			if r.status != 410 || body.TimedOut || !strings.Contains(body.Message, tc.why) {
				t.Fatalf("answer %d %s, want 410 saying %q", r.status, r.body, tc.why)
			}
			t.Logf("execute answered %s after the %s: %s", took.Round(time.Millisecond), tc.name, body.Message)
			if tc.name == "pause" {
				s.expect(s.do("POST", "/sandboxes/"+id+"/resume", nil), 201, "resume")
				s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "delete")
			}
		})
	}
}

// A pause to disk interrupted by a kill -9 of the server loses nothing:
// after the restart the sandbox resumes with its processes and memory.
func TestPauseToDiskKilledMidway(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--warm-sandboxes", "0")
	s.start()
	id := s.create(map[string]any{"templateID": "base", "memoryMB": 1024}).SandboxID
	// A process holding 300 MB of random bytes (incompressible, so that the
	// checkpoint takes a while): it survives only if memory does.
	s.exec(id, client.ExecuteRequest{Command: `nohup python3 -c "
import os, time
x = bytearray(os.urandom(300 << 20))
open('/tmp/holder.pid', 'w').write('ok')
time.sleep(100000)
" >/dev/null 2>&1 &`})
	waitFor(t, 120*time.Second, "memory holder up", func() bool {
		return s.exec(id, client.ExecuteRequest{Command: "cat /tmp/holder.pid 2>/dev/null || true"}).Stdout == "ok"
	})
	pid := strings.TrimSpace(s.exec(id, client.ExecuteRequest{Command: "pgrep -f urandom"}).Stdout)
	answered := make(chan response, 1)
	go func() { answered <- s.doNoFail("POST", "/sandboxes/"+id+"/pause", map[string]any{"toDisk": true}) }()
	// Kill as soon as the image is being written (or, should the
	// checkpoint beat the poll, right after the answer).
	partial := filepath.Join(s.dataDir, "images", "pause-"+id+".partial")
	midway := false
	deadline := time.Now().Add(2 * time.Minute)
poll:
	for time.Now().Before(deadline) {
		select {
		case <-answered:
			break poll
		default:
		}
		if _, err := os.Stat(partial); err == nil {
			midway = true
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("killed while the checkpoint was being written: %v", midway)
	s.stop(syscall.SIGKILL)
	s.start()

	var info client.Sandbox
	s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get").json(t, &info)
	if info.State != "paused" {
		t.Fatalf("after restart the sandbox is %s", info.State)
	}
	s.expect(s.do("POST", "/sandboxes/"+id+"/resume", nil), 201, "resume")
	// It stays alive (the reported failure died ~3 s after resume).
	for range 3 {
		if got := strings.TrimSpace(s.exec(id, client.ExecuteRequest{Command: "pgrep -f urandom"}).Stdout); got != pid {
			t.Fatalf("memory holder pid %q after resume, want %q", got, pid)
		}
		time.Sleep(time.Second)
	}
}
