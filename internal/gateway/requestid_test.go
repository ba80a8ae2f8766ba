package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/requestid"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// lockedBuffer collects log lines written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines are the JSON log records written so far.
func (b *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if l == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

// A request's ID goes with it from the gateway to the node, whichever way
// the gateway forwards it (a create it reads the answer of, a call it
// proxies, envd traffic), comes back once in the answer, and names the
// gateway's log lines for the request. A sandbox's exposed port is left
// alone.
func TestRequestIDForwarded(t *testing.T) {
	const domain, exposedID = "aenv.test", "sbexposed01234567890"
	var mu sync.Mutex
	var received []string // X-Request-Id of each call the node got
	node := newFakeNode(t, "a", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get(requestid.Header))
		mu.Unlock()
		if strings.HasPrefix(r.Host, "8080-") {
			// The sandbox's application, with its own idea of an ID.
			w.Header().Set(requestid.Header, "app-1")
			w.WriteHeader(http.StatusOK)
			return
		}
		// The node echoes the ID, as its middleware does.
		w.Header().Set(requestid.Header, r.Header.Get(requestid.Header))
		if r.Method == http.MethodPost && r.URL.Path == "/sandboxes" {
			writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": "sb-a"})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	down := newFakeNode(t, "down", nil) // refuses connections
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(node, 10, 0, false), nodeRecord(down, 10, 0, false)}
	for i := range db.nodes {
		db.nodes[i].Protocol = cluster.Protocol
	}
	db.templates = []*store.Template{{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded}}
	logs := &lockedBuffer{}
	logger := slog.New(requestid.LogHandler(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	g, err := New(context.Background(), Config{Domain: domain, NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20,
		ClusterSecret: "secret", APIKey: testKey}, db, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)

	for _, tc := range []struct {
		name         string
		method, path string
		host, sent   string
		header       http.Header
		wantStatus   int
		nodeSees     bool   // the node gets a call
		wantAnswer   string // "": the ID the node saw
	}{
		{name: "create, new ID", method: http.MethodPost, path: "/sandboxes", wantStatus: 201, nodeSees: true},
		{name: "create, caller's ID", method: http.MethodPost, path: "/sandboxes", sent: "client-1",
			wantStatus: 201, nodeSees: true},
		{name: "proxied, caller's ID", method: http.MethodDelete, path: "/sandboxes/sb-a", sent: "client-2",
			wantStatus: 204, nodeSees: true},
		{name: "proxied, new ID", method: http.MethodPost, path: "/sandboxes/sb-a/pause", wantStatus: 204, nodeSees: true},
		{name: "envd traffic", method: http.MethodGet, path: "/files?path=/x", sent: "client-3",
			header: http.Header{"E2b-Sandbox-Id": {"sb-a"}}, wantStatus: 204, nodeSees: true},
		{name: "invalid ID replaced", method: http.MethodDelete, path: "/sandboxes/sb-a", sent: "not valid",
			wantStatus: 204, nodeSees: true},
		{name: "node down", method: http.MethodDelete, path: "/sandboxes/sb-down", sent: "client-4",
			wantStatus: http.StatusServiceUnavailable},
		{name: "exposed port untouched", method: http.MethodGet, path: "/", host: "8080-" + exposedID + "." + domain,
			sent: "", wantStatus: 200, nodeSees: true, wantAnswer: "app-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			received = nil
			mu.Unlock()
			// A kill forgets its sandbox's route: each call finds it again.
			g.routes.put("sb-a", "a")
			g.routes.put("sb-down", "down")
			g.routes.put(exposedID, "a")
			var body *strings.Reader
			if tc.method == http.MethodPost && tc.path == "/sandboxes" {
				body = strings.NewReader(`{"templateID":"base"}`)
			} else {
				body = strings.NewReader("")
			}
			r := httptest.NewRequest(tc.method, tc.path, body)
			if tc.host != "" {
				r.Host = tc.host
			}
			r.Header.Set("X-API-Key", testKey)
			for k, vs := range tc.header {
				r.Header[k] = vs
			}
			if tc.sent != "" {
				r.Header.Set(requestid.Header, tc.sent)
			}
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.wantStatus)
			}
			answered := w.Header().Values(requestid.Header)
			if len(answered) != 1 {
				t.Fatalf("answer has %d X-Request-Id values %q, want one", len(answered), answered)
			}
			mu.Lock()
			got := append([]string(nil), received...)
			mu.Unlock()
			if tc.nodeSees && len(got) != 1 {
				t.Fatalf("node got %d calls, want 1", len(got))
			}
			if tc.wantAnswer != "" {
				if answered[0] != tc.wantAnswer {
					t.Errorf("answer's ID %q, want %q", answered[0], tc.wantAnswer)
				}
				if got[0] != "" {
					t.Errorf("exposed port got an ID %q from the gateway", got[0])
				}
				return
			}
			if !requestid.Valid(answered[0]) {
				t.Fatalf("answer's ID %q is not valid", answered[0])
			}
			if tc.sent != "" && requestid.Valid(tc.sent) && answered[0] != tc.sent {
				t.Errorf("answer's ID %q, want the caller's %q", answered[0], tc.sent)
			}
			if tc.nodeSees && got[0] != answered[0] {
				t.Errorf("node saw ID %q, the answer says %q", got[0], answered[0])
			}
			if !tc.nodeSees {
				// The gateway's own line about the failure names the ID.
				var found bool
				for _, rec := range logs.lines(t) {
					if rec["msg"] == "node did not answer" && rec[requestid.LogKey] == answered[0] {
						found = true
					}
				}
				if !found {
					t.Errorf("no log line \"node did not answer\" with %s=%s in:\n%s", requestid.LogKey, answered[0], logs.buf.String())
				}
			}
		})
	}
}

// A retry answered from the idempotency record carries its own request ID,
// not the one of the call that made the record.
func TestRequestIDIdempotentReplay(t *testing.T) {
	node := newFakeNode(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(requestid.Header, r.Header.Get(requestid.Header))
		writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": "sb-a"})
	})
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(node, 10, 0, false)}
	db.nodes[0].Protocol = cluster.Protocol
	db.templates = []*store.Template{{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded}}
	g := newTestGateway(t, db)
	for _, id := range []string{"first-call", "retry"} {
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		r.Header.Set("X-API-Key", testKey)
		r.Header.Set("Idempotency-Key", "create-1")
		r.Header.Set(requestid.Header, id)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("%s: status %d (%s)", id, w.Code, w.Body)
		}
		if got := w.Header().Values(requestid.Header); len(got) != 1 || got[0] != id {
			t.Errorf("%s: answer's X-Request-Id %q, want [%s]", id, got, id)
		}
	}
	if n := node.count("POST /sandboxes"); n != 1 {
		t.Errorf("node asked %d times, want once (the retry replayed)", n)
	}
}
