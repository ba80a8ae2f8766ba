package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"strings"
	"testing"
	"time"
)

// serveIdentity prints the default user, the sandbox env var and the PID
// of what ran the command (envd, the sandbox's init: 1).
const serveIdentity = `echo "$(id -un) $TENANT_SECRET $PPID"`

// killAllAsTenant does what code in the sandbox can as root (which E2B's
// commands.run({user: 'root'}) gives anyone with the sandbox): SIGKILL
// every process it may, detached, as the kill ends the call that starts it.
func killAllAsTenant(t *testing.T, s *server, id string) {
	t.Helper()
	cmd := `setsid sh -c 'kill -9 -1' < /dev/null > /dev/null 2>&1 &`
	_ = s.doNoFail("POST", "/sandboxes/"+id+"/execute", client.ExecuteRequest{Command: cmd, User: "root"})
}

// proxied sends an envd request the way the E2B SDK does, through the
// server's proxy, with the given access token ("" for none).
func proxied(s *server, id, method, path, body, token string) response {
	s.t.Helper()
	var b any
	if body != "" {
		b = body
	}
	return s.do(method, path, b, "E2b-Sandbox-Id", id, "X-API-Key", "", "X-Access-Token", token)
}

// TestTenantKillsEnvd: code in a sandbox, as root, kills every process it
// can. envd, the sandbox's init, survives it with the sandbox's token, env
// vars and default user: calls without the token and a re-/init by anyone
// else are refused. A fork, re-keyed by the server, keeps its own token.
// Killing envd itself (PID 1) ends the sandbox, which the server records:
// nothing is left in it to serve envd's port without the token.
func TestTenantKillsEnvd(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	sb := s.create(map[string]any{"templateID": "base", "envVars": map[string]string{"TENANT_SECRET": "s3cret"}})
	id := sb.SandboxID
	if sb.EnvdAccessToken == "" {
		t.Fatal("sandbox has no envd access token")
	}
	s.exec(id, client.ExecuteRequest{Command: "nohup sleep 1000 > /dev/null 2>&1 &"})
	killAllAsTenant(t, s, id)
	// The sleep goes; envd stays, with what /init gave it.
	want := "user s3cret 1\n"
	waitFor(t, 60*time.Second, "the tenant's kill of every process in "+id, func() bool {
		r := s.doNoFail("POST", "/sandboxes/"+id+"/execute", client.ExecuteRequest{Command: "pgrep -x sleep; " + serveIdentity})
		var res client.ExecuteResult
		if r.status != 200 {
			t.Fatalf("execute after kill -9 -1: status %d %s", r.status, truncate(r.body))
		}
		r.json(t, &res)
		return res.Stdout == want
	})

	tests := []struct {
		name, method, path, body, token string
		want                            int
	}{
		{"call without token", "POST", "/process.Process/List", "{}", "", 401},
		{"call with a wrong token", "POST", "/process.Process/List", "{}", "guess", 401},
		{"re-init by the tenant", "POST", "/init", `{"accessToken":"mine","envVars":{"TENANT_SECRET":"x"}}`, "", 401},
		{"env vars without token", "GET", "/envs", "", "", 401},
		{"files without token", "GET", "/files?path=/etc/hostname", "", "", 401},
		{"call with the token", "POST", "/process.Process/List", "{}", sb.EnvdAccessToken, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := proxied(s, id, tt.method, tt.path, tt.body, tt.token); r.status != tt.want {
				t.Fatalf("status %d %s, want %d", r.status, truncate(r.body), tt.want)
			}
		})
	}
	r := s.expect(proxied(s, id, "GET", "/envs", "", sb.EnvdAccessToken), 200, "envs with the token")
	var envs map[string]string
	r.json(t, &envs)
	if envs["TENANT_SECRET"] != "s3cret" {
		t.Fatalf("envs %v", envs)
	}

	// A fork is re-keyed by the server with a token of its own; the same
	// attack leaves it that token, not the image's and not none.
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+id+"/snapshots", nil), 201, "snapshot").json(t, &snap)
	fork := s.create(map[string]any{"templateID": snap.SnapshotID})
	if fork.EnvdAccessToken == "" || fork.EnvdAccessToken == sb.EnvdAccessToken {
		t.Fatalf("fork token %q, source %q", fork.EnvdAccessToken, sb.EnvdAccessToken)
	}
	killAllAsTenant(t, s, fork.SandboxID)
	waitFor(t, 60*time.Second, "the fork to answer after kill -9 -1", func() bool {
		res := s.exec(fork.SandboxID, client.ExecuteRequest{Command: serveIdentity})
		return res.Stdout == want
	})
	for token, want := range map[string]int{"": 401, sb.EnvdAccessToken: 401, fork.EnvdAccessToken: 200} {
		if r := proxied(s, fork.SandboxID, "POST", "/process.Process/List", "{}", token); r.status != want {
			t.Fatalf("fork, token %q: %d %s, want %d", token, r.status, truncate(r.body), want)
		}
	}

	// Killing envd ends the sandbox, reported dead with why.
	_ = s.doNoFail("POST", "/sandboxes/"+id+"/execute", client.ExecuteRequest{Command: "kill -9 1", User: "root"})
	var info struct {
		State       string `json:"state"`
		EndedReason string `json:"endedReason"`
	}
	waitFor(t, 60*time.Second, "the sandbox reported dead with its envd", func() bool {
		s.do("GET", "/sandboxes/"+id, nil).json(t, &info)
		return info.State == "dead"
	})
	if !strings.Contains(info.EndedReason, "init process exited") {
		t.Errorf("dead sandbox's reason %q", info.EndedReason)
	}
	waitFor(t, 30*time.Second, "the dead sandbox's processes gone", func() bool { return runscProcesses(id) == 0 })
}
