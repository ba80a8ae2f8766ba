package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestPauseWithoutMemoryOfRelinkedTmp: a sandbox whose root replaced /tmp
// with a link to nowhere (or a loop) cannot boot again over its files:
// gVisor mounts a tmpfs at /tmp at every start. Its pause without memory
// is refused (409, naming /tmp) and it keeps running, rather than being
// paused into a state no resume can leave (a 500 at every connect).
func TestPauseWithoutMemoryOfRelinkedTmp(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	for _, tc := range []struct{ name, link string }{
		{"nowhere", "ln -s /nowhere /tmp"},
		{"loop", "ln -s /tmp /tmp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := s.create(map[string]any{"templateID": "base"})
			defer s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil)
			res := s.exec(sb.SandboxID, client.ExecuteRequest{User: "root",
				Command: "rm -rf /tmp && " + tc.link + " && echo relinked"})
			if strings.TrimSpace(res.Stdout) != "relinked" {
				t.Fatalf("relink /tmp: %+v", res)
			}
			r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"memory": false})
			var e struct{ Message string }
			json.Unmarshal(r.body, &e)
			if r.status != 409 || !strings.Contains(e.Message, "/tmp") {
				t.Fatalf("pause without memory: status %d, body %s; want 409 naming /tmp", r.status, truncate(r.body))
			}
			if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "echo alive"}); strings.TrimSpace(res.Stdout) != "alive" {
				t.Fatalf("the sandbox after the refused pause: %+v", res)
			}
			// A pause that keeps the memory needs no boot: it works.
			if r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil); r.status != 204 {
				t.Fatalf("pause in memory: %d %s", r.status, truncate(r.body))
			}
			if r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 60}); r.status != 201 {
				t.Fatalf("connect after the pause: %d %s", r.status, truncate(r.body))
			}
		})
	}
}
