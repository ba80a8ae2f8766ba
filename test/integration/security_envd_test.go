package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serveIdentity prints the default user, the sandbox env var and, last, the
// PID of the `envd serve` that ran it (the shell's parent).
const serveIdentity = `echo "$(id -un) $TENANT_SECRET $PPID"`

// identity runs serveIdentity through the API (which holds the token).
func identity(t *testing.T, s *server, id string) (user, secret string, servePID int, ok bool) {
	t.Helper()
	r := s.do("POST", "/sandboxes/"+id+"/execute", client.ExecuteRequest{Command: serveIdentity})
	if r.status != 200 {
		return "", "", 0, false // envd restarting
	}
	var res client.ExecuteResult
	r.json(t, &res)
	f := strings.Fields(res.Stdout)
	if res.ExitCode != 0 || len(f) == 0 {
		t.Fatalf("identity: %+v", res)
	}
	pid, _ := strconv.Atoi(f[len(f)-1])
	if len(f) == 3 {
		return f[0], f[1], pid, true
	}
	return f[0], "", pid, true // the env var is missing
}

// killServeAsTenant does what code in the sandbox can as root (which E2B's
// commands.run({user: 'root'}) gives anyone with the sandbox): SIGKILL
// `envd serve` and at once try to take its port. It runs detached, as
// envd's death breaks the call that started it; the outcome of the bind
// lands in /tmp/bind-result.
func killServeAsTenant(t *testing.T, s *server, id string, servePID int) {
	t.Helper()
	attack := fmt.Sprintf(`kill -9 %d; python3 -c 'import socket; socket.socket().bind(("0.0.0.0", 49983)); print("bound")' > /tmp/bind-result 2>&1`, servePID)
	cmd := fmt.Sprintf(`setsid sh -c %q < /dev/null > /dev/null 2>&1 &`, attack)
	// Whether the answer beats the kill does not matter.
	_ = s.doNoFail("POST", "/sandboxes/"+id+"/execute", client.ExecuteRequest{Command: cmd, User: "root"})
}

// waitNewServe waits until a new `envd serve` answers the API and returns
// what it reports.
func waitNewServe(t *testing.T, s *server, id string, oldPID int) (user, secret string) {
	t.Helper()
	waitFor(t, 60*time.Second, "a new envd serve in "+id, func() bool {
		var pid int
		var ok bool
		user, secret, pid, ok = identity(t, s, id)
		return ok && pid != oldPID
	})
	return user, secret
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

// TestKilledEnvdKeepsAuth: code in a sandbox can kill `envd serve` (as
// root; a crash would do the same). The envd that comes back must refuse calls without the
// sandbox's token, refuse a re-/init by anyone else, keep the sandbox's env
// vars and default user, and the port must never have been free for the
// tenant to serve on. A fork, re-keyed by the server, keeps its own token
// through the same attack.
func TestKilledEnvdKeepsAuth(t *testing.T) {
	s := newServer(t)
	s.start()
	sb := s.create(map[string]any{"templateID": "base", "envVars": map[string]string{"TENANT_SECRET": "s3cret"}})
	id := sb.SandboxID
	if sb.EnvdAccessToken == "" {
		t.Fatal("sandbox has no envd access token")
	}
	user, secret, pid, ok := identity(t, s, id)
	if !ok || user != "user" || secret != "s3cret" {
		t.Fatalf("before the attack: user %q env %q ok %v", user, secret, ok)
	}

	killServeAsTenant(t, s, id, pid)
	user, secret = waitNewServe(t, s, id, pid)
	if user != "user" || secret != "s3cret" {
		t.Fatalf("restarted envd runs as %q with TENANT_SECRET=%q, want user and s3cret", user, secret)
	}
	res := s.exec(id, client.ExecuteRequest{Command: "cat /tmp/bind-result"})
	if !strings.Contains(res.Stdout, "Address already in use") {
		t.Fatalf("tenant's bind of envd's port while envd was down: %q", res.Stdout)
	}

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

	// A fork is re-keyed by the server with the image's token; killing its
	// envd must bring back the fork's token, not the image's and not none.
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+id+"/snapshots", nil), 201, "snapshot").json(t, &snap)
	fork := s.create(map[string]any{"templateID": snap.SnapshotID})
	if fork.EnvdAccessToken == "" || fork.EnvdAccessToken == sb.EnvdAccessToken {
		t.Fatalf("fork token %q, source %q", fork.EnvdAccessToken, sb.EnvdAccessToken)
	}
	_, _, forkPID, ok := identity(t, s, fork.SandboxID)
	if !ok {
		t.Fatal("fork does not run commands")
	}
	killServeAsTenant(t, s, fork.SandboxID, forkPID)
	if user, _ := waitNewServe(t, s, fork.SandboxID, forkPID); user != "user" {
		t.Fatalf("fork's restarted envd runs as %q", user)
	}
	for token, want := range map[string]int{"": 401, sb.EnvdAccessToken: 401, fork.EnvdAccessToken: 200} {
		if r := proxied(s, fork.SandboxID, "POST", "/process.Process/List", "{}", token); r.status != want {
			t.Fatalf("fork after restart, token %q: %d %s, want %d", token, r.status, truncate(r.body), want)
		}
	}
}
