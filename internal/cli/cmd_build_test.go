package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

// The server answers a build's log a page at a time (at most 100
// entries), so a build that ends with more of its log unread is followed
// to the log's end, as E2B's SDK does.
func TestFollowBuildReadsEveryPage(t *testing.T) {
	const total = 250
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offset, _ := strconv.Atoi(r.URL.Query().Get("logsOffset"))
		entries := []map[string]any{}
		for i := offset; i < total && len(entries) < 100; i++ {
			entries = append(entries, map[string]any{"timestamp": "2026-01-01T00:00:00Z", "level": "info",
				"message": fmt.Sprintf("line %d", i)})
		}
		json.NewEncoder(w).Encode(map[string]any{"templateID": "t", "buildID": "b", "status": "ready",
			"logEntries": entries, "logs": []string{}})
	}))
	defer srv.Close()
	c := client.New(client.Config{URL: srv.URL, APIKey: "k"})
	var out bytes.Buffer
	st, err := followBuild(context.Background(), c, client.TemplateBuildRef{TemplateID: "t", BuildID: "b"},
		newBuildLog(&out, false))
	if err != nil || st.Status != "ready" {
		t.Fatalf("followBuild: %+v, %v", st, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != total || !strings.Contains(lines[total-1], fmt.Sprintf("line %d", total-1)) {
		t.Fatalf("read %d lines of %d; last %q", len(lines), total, lines[len(lines)-1])
	}
}
