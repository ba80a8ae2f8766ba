package integration

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/client"
)

// TestAuditLog: a single server records every change asked of it (who,
// what, which object, the answer) and no read; admins read the log with
// filters and pages, teams' keys cannot; --audit-file gets the same
// events as JSON lines. It adds up each team's use by day too.
func TestAuditLog(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "audit.jsonl")
	s := newServer(t, "--audit-file", file)
	s.start()
	e := newEndpoint(t, s.url)
	sandboxID, keyID := checkAudit(t, e, e)
	checkUsage(t, e, e)

	// Pages, newest first.
	var page1, page2 []audit.Event
	e.want(200, apiKey, "GET", "/audit?team=audited&limit=2", nil).json(t, &page1)
	if len(page1) != 2 {
		t.Fatalf("limit 2: %d events", len(page1))
	}
	e.want(200, apiKey, "GET", "/audit?team=audited&limit=2&before="+strconv.FormatInt(page1[1].Seq, 10), nil).json(t, &page2)
	if len(page2) != 2 || page2[0].Seq >= page1[1].Seq {
		t.Fatalf("the second page %+v after %+v", page2, page1)
	}
	// Time bounds.
	var none []audit.Event
	e.want(200, apiKey, "GET", "/audit?until=2020-01-01T00:00:00Z", nil).json(t, &none)
	if len(none) != 0 {
		t.Fatalf("events before 2020: %+v", none)
	}
	for _, bad := range []string{"limit=0x", "limit=5000", "since=yesterday", "before=-1"} {
		e.want(400, apiKey, "GET", "/audit?"+bad, nil)
	}
	// Holes in the log would show on the metrics.
	if m := string(e.want(200, apiKey, "GET", "/metrics", nil).body); !strings.Contains(m, "aenv_audit_events_dropped_total 0") {
		t.Errorf("metrics lack aenv_audit_events_dropped_total 0")
	}

	// The CLI reads it too.
	var fromCLI []audit.Event
	if err := json.Unmarshal([]byte(s.cliOK("audit", "--team", "audited", "--since", "1h", "-o", "json")), &fromCLI); err != nil ||
		len(fromCLI) != 4 || fromCLI[0].Object != sandboxID {
		t.Fatalf("aenv audit -o json: %+v %v", fromCLI, err)
	}
	if out := s.cliOK("audit", "--object", sandboxID); !strings.Contains(out, "POST /sandboxes/{id}/pause") || !strings.Contains(out, "trainer") {
		t.Fatalf("aenv audit --object:\n%s", out)
	}
	if out, code := s.cli("audit", "--since", "yesterday"); code != 2 {
		t.Fatalf("aenv audit --since yesterday: exit %d, want 2 (usage)\n%s", code, out)
	}

	// The file has the same events, one JSON object a line.
	waitFor(t, 10*time.Second, "the audit file to name the sandbox and the key", func() bool {
		data, _ := os.ReadFile(file)
		return strings.Contains(string(data), sandboxID) && strings.Contains(string(data), keyID)
	})
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		var ev audit.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" || ev.At.IsZero() {
			t.Fatalf("audit file line %d %q: %+v %v", lines+1, sc.Text(), ev, err)
		}
	}
	if lines < 6 {
		t.Fatalf("the audit file has %d lines, want the 6 changes at least", lines)
	}
}

// TestAuditLogThroughGateways: each gateway records what it serves, once
// (the nodes it forwards to record nothing), into the cluster's database:
// another gateway reads it. The nodes add their sandboxes' use there too.
func TestAuditLogThroughGateways(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a")
	e1, e2 := newEndpoint(t, g1.url), newEndpoint(t, g2.url)
	checkAudit(t, e1, e2)
	checkUsage(t, e1, e2)
}

// checkAudit makes changes through by as a team's key and the operator's,
// and reads them back through read: each once, newest first, with who
// made it, the object and the answer. It returns the sandbox and key made.
func checkAudit(t *testing.T, by, read endpoint) (sandboxID, keyID string) {
	t.Helper()
	by.want(201, apiKey, "POST", "/teams", map[string]any{"teamID": "audited"})
	var k struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	by.want(201, apiKey, "POST", "/api-keys", map[string]any{"teamID": "audited", "name": "trainer"}).json(t, &k)
	var sb client.Sandbox
	by.want(201, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"}).json(t, &sb)
	by.want(204, k.Key, "POST", "/sandboxes/"+sb.SandboxID+"/pause", nil)
	by.want(404, k.Key, "DELETE", "/sandboxes/no-such-sandbox", nil)
	by.want(204, k.Key, "DELETE", "/sandboxes/"+sb.SandboxID, nil)
	by.want(200, k.Key, "GET", "/sandboxes", nil) // a read: not recorded
	read.want(403, k.Key, "GET", "/audit", nil)   // the log is the admins'

	type step struct {
		action, object string
		status         int
	}
	want := []step{ // newest first
		{"DELETE /sandboxes/{id}", sb.SandboxID, 204},
		{"DELETE /sandboxes/{id}", "no-such-sandbox", 404},
		{"POST /sandboxes/{id}/pause", sb.SandboxID, 204},
		{"POST /sandboxes", sb.SandboxID, 201},
	}
	var events []audit.Event
	waitFor(t, 15*time.Second, "the team's four changes in the audit log", func() bool {
		read.want(200, apiKey, "GET", "/audit?team=audited", nil).json(t, &events)
		return len(events) >= len(want)
	})
	if len(events) != len(want) {
		t.Fatalf("the team's audit log has %d events, want %d (each change once, no reads): %+v", len(events), len(want), events)
	}
	for i, w := range want {
		ev := events[i]
		if ev.Action != w.action || ev.Object != w.object || ev.Status != w.status || ev.KeyID != k.ID ||
			ev.KeyName != "trainer" || ev.Admin || ev.Remote == "" || ev.RequestID == "" || ev.At.IsZero() {
			t.Errorf("event %d: %+v, want %+v by key %s (trainer)", i, ev, w, k.ID)
		}
	}
	// The operator's changes are there too, by object.
	var ops []audit.Event
	read.want(200, apiKey, "GET", "/audit?object="+k.ID, nil).json(t, &ops)
	if len(ops) != 1 || ops[0].Action != "POST /api-keys" || !ops[0].Admin || ops[0].Status != 201 {
		t.Fatalf("the key's creation: %+v", ops)
	}
	read.want(200, apiKey, "GET", "/audit?action=POST+/teams&object=audited", nil).json(t, &ops)
	if len(ops) != 1 || ops[0].Status != 201 {
		t.Fatalf("the team's creation: %+v", ops)
	}
	return sb.SandboxID, k.ID
}
