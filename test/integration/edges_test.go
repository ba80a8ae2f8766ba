package integration

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestE2BEdges covers, through a real server and real sandboxes, the
// edges of E2B's API that its Python SDK leans on: a command's timeout
// seen by /execute, a deadline set to now, and a sandbox created with
// secure: false.
func TestE2BEdges(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()

	t.Run("execute timeout keeps earlier output", func(t *testing.T) {
		sb := s.create(map[string]any{"templateID": "base", "timeout": 300})
		defer s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil)
		began := time.Now()
		res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "echo before; sleep 30", Timeout: 1.5})
		took := time.Since(began)
		if !res.TimedOut || res.ExitCode != -1 || res.Stdout != "before\n" {
			t.Fatalf("result %+v, want timedOut, exit -1, stdout %q", res, "before\n")
		}
		if took > 15*time.Second {
			t.Fatalf("execute answered after %v, want soon after its 1.5 s timeout", took)
		}
	})

	t.Run("timeout 0 ends the sandbox at once", func(t *testing.T) {
		sb := s.create(map[string]any{"templateID": "base", "timeout": 300})
		s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", map[string]int{"timeout": 0}), 204, "timeout 0")
		deadline := time.Now().Add(60 * time.Second)
		for {
			r := s.do("GET", "/sandboxes/"+sb.SandboxID, nil)
			var info struct {
				State string `json:"state"`
			}
			_ = json.Unmarshal(r.body, &info)
			if r.status == http.StatusNotFound || info.State == "dead" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox still %d %s 60 s after timeout 0", r.status, r.body)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("secure false", func(t *testing.T) {
		var created map[string]any
		s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300, "secure": false}),
			201, "create secure false").json(t, &created)
		if _, has := created["envdAccessToken"]; has {
			t.Fatalf("create answer %v carries an envd access token", created)
		}
		id, _ := created["sandboxID"].(string)
		defer s.do("DELETE", "/sandboxes/"+id, nil)
		// envd through the proxy, with no token at all.
		r := s.do("GET", "/files?path=/etc/hostname&username=user", nil,
			"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49983", "X-API-Key", "")
		if r.status != http.StatusOK || len(r.body) == 0 {
			t.Fatalf("envd without a token: %d %s", r.status, r.body)
		}
		res := s.exec(id, client.ExecuteRequest{Command: "echo insecure"})
		if res.Stdout != "insecure\n" {
			t.Fatalf("execute in an insecure sandbox: %+v", res)
		}
	})
}
