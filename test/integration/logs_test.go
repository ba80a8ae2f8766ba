package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/wire"
)

// A sandbox's own log (E2B's v1 and v2 log calls, and aenv logs) on one
// server: what envd logged, selected as asked, never a command's
// arguments or environment; kept across a pause in memory; gone with the
// sandbox.
func TestSandboxLogs(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	sb := s.create(nil)
	checkSandboxLogs(t, s.api, sb.SandboxID)

	// The CLI: JSON lines, a level, and its usage and not-found codes.
	lines := strings.Split(strings.TrimSpace(s.cliOK("logs", sb.SandboxID, "-o", "json")), "\n")
	var last wire.SandboxLogEntry
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Message == "" {
		t.Fatalf("aenv logs -o json: last line %q: %v", lines[len(lines)-1], err)
	}
	if out := s.cliOK("logs", sb.SandboxID, "--tail", "1"); !strings.Contains(out, last.Message) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("aenv logs --tail 1: %q, want one line with %q", out, last.Message)
	}
	if out := s.cliOK("logs", sb.SandboxID, "--level", "error"); strings.Contains(out, "process started") {
		t.Errorf("aenv logs --level error printed info entries: %s", out)
	}
	if out, code := s.cli("logs", sb.SandboxID, "--tail", "0"); code != 2 {
		t.Errorf("aenv logs --tail 0: exit %d, want 2: %s", code, out)
	}
	if out, code := s.cli("logs", "nosuchsandbox0000000"); code != 3 {
		t.Errorf("aenv logs of an unknown sandbox: exit %d, want 3: %s", code, out)
	}

	// A pause in memory keeps the log; a kill ends it.
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil), 204, "pause")
	if n := len(sandboxLog(t, s.api, sb.SandboxID, nil)); n == 0 {
		t.Error("the log of a sandbox paused in memory is empty")
	}
	s.expect(s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")
	s.expect(s.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs", nil), 404, "log of a killed sandbox")
	s.expect(s.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs?direction=up", nil), 400, "log with a bad direction")
}

// sandboxLog reads a sandbox's v2 log through api.
func sandboxLog(t testing.TB, api *client.Client, id string, q url.Values) []wire.SandboxLogEntry {
	t.Helper()
	var out wire.SandboxLogsV2
	if _, err := api.DoJSON(context.Background(), http.MethodGet, "/v2/sandboxes/"+id+"/logs", q, nil, &out); err != nil {
		t.Fatalf("log of %s: %v", id, err)
	}
	return out.Logs
}

// checkSandboxLogs runs a command in sandbox id through api and checks
// that the sandbox's log tells of it, through both log calls, without its
// arguments or environment.
func checkSandboxLogs(t testing.TB, api *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const argument, secret = "argument-not-logged-7f3a", "secret-not-logged-91c2"
	started := time.Now()
	if _, err := api.Execute(ctx, id, client.ExecuteRequest{Command: "echo " + argument,
		Envs: map[string]string{"LOG_PROBE": secret}}); err != nil {
		t.Fatalf("execute in %s: %v", id, err)
	}
	var entries []wire.SandboxLogEntry
	has := func(msg string) bool {
		for _, e := range entries {
			if e.Message == msg && e.Fields["pid"] != "" && !e.Timestamp.Before(started.Add(-time.Second)) {
				return true
			}
		}
		return false
	}
	waitFor(t, 30*time.Second, "the command's start and end in the log", func() bool {
		entries = sandboxLog(t, api, id, nil)
		return has("process started") && has("process ended")
	})
	raw, _ := json.Marshal(entries)
	if strings.Contains(string(raw), argument) || strings.Contains(string(raw), secret) {
		t.Errorf("the log holds a command's argument or environment: %s", raw)
	}
	for i := 1; i < len(entries); i++ {
		if entries[i].Timestamp.Before(entries[i-1].Timestamp) {
			t.Errorf("entries out of order: %v before %v", entries[i-1].Timestamp, entries[i].Timestamp)
		}
	}
	newest := sandboxLog(t, api, id, url.Values{"direction": {"backward"}, "limit": {"1"}})
	if len(newest) != 1 || !newest[0].Timestamp.Equal(entries[len(entries)-1].Timestamp) {
		t.Errorf("the newest entry: %+v, want the last of %d", newest, len(entries))
	}
	for _, e := range sandboxLog(t, api, id, url.Values{"level": {"warn"}}) {
		if e.Level != wire.LogLevelWarn && e.Level != wire.LogLevelError {
			t.Errorf("level=warn gave %s %q", e.Level, e.Message)
		}
	}
	if got := sandboxLog(t, api, id, url.Values{"search": {"process ended"}}); len(got) == 0 {
		t.Error("search found no process end")
	}
	var v1 wire.SandboxLogs
	if _, err := api.DoJSON(ctx, http.MethodGet, "/sandboxes/"+id+"/logs", nil, nil, &v1); err != nil {
		t.Fatalf("v1 log of %s: %v", id, err)
	}
	if len(v1.Logs) != len(v1.LogEntries) || len(v1.Logs) < 2 || !strings.Contains(v1.Logs[len(v1.Logs)-1].Line, "msg=") {
		t.Errorf("v1 log: %d lines, %d entries: %+v", len(v1.Logs), len(v1.LogEntries), v1.Logs)
	}
}
