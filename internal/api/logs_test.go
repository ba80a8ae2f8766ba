package api

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// TestSandboxLogAnswers checks what the log calls select from a sandbox's
// log (catalogNode's: an info line, then an error line a second later).
func TestSandboxLogAnswers(t *testing.T) {
	n := &catalogNode{sandboxes: []*store.Sandbox{{ID: "sbx1", TemplateID: "base", State: store.StateRunning}}}
	srv := conformanceServer(t, n)
	get := func(path string, into any) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("X-API-Key", "key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		if err := json.Unmarshal(body, into); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
	}
	second := time.Date(2026, 12, 4, 8, 0, 1, 0, time.UTC).UnixMilli()
	messages := func(entries []wire.SandboxLogEntry) []string {
		out := []string{}
		for _, e := range entries {
			out = append(out, string(e.Level)+" "+e.Message)
		}
		return out
	}
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/v2/sandboxes/sbx1/logs", []string{"info envd serving", "error process start failed"}},
		{"/v2/sandboxes/sbx1/logs?limit=1", []string{"info envd serving"}},
		{"/v2/sandboxes/sbx1/logs?limit=1&direction=backward", []string{"error process start failed"}},
		{"/v2/sandboxes/sbx1/logs?level=warn", []string{"error process start failed"}},
		{"/v2/sandboxes/sbx1/logs?search=envd", []string{"info envd serving"}},
		{"/v2/sandboxes/sbx1/logs?cursor=" + strconv.FormatInt(second, 10), []string{"error process start failed"}},
		{"/v2/sandboxes/sbx1/logs?cursor=" + strconv.FormatInt(second, 10) + "&direction=backward", []string{"info envd serving"}},
		{"/v2/sandboxes/sbx1/logs?limit=0", []string{}},
	} {
		var got wire.SandboxLogsV2
		get(tc.path, &got)
		if g := messages(got.Logs); !slices.Equal(g, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.path, g, tc.want)
		}
	}

	var v1 wire.SandboxLogs
	get("/sandboxes/sbx1/logs?start="+strconv.FormatInt(second, 10), &v1)
	if len(v1.Logs) != 1 || len(v1.LogEntries) != 1 ||
		v1.Logs[0].Line != `time=2026-12-04T08:00:01.5Z level=ERROR msg="process start failed" cmd=/no/such` ||
		v1.LogEntries[0].Fields["cmd"] != "/no/such" || !v1.LogEntries[0].Timestamp.Equal(v1.Logs[0].Timestamp) {
		t.Errorf("v1 from the second line: %+v", v1)
	}
}
