package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/client/envdtest"
	"github.com/aenv-dev/aenv/internal/roottest"
)

// fakeServer implements the control-plane endpoints the CLI calls, in
// memory, and hands envd traffic to a real envd running commands on this
// machine. It tests the CLI's side of the contract: requests, output, exit
// codes.
type fakeServer struct {
	t      *testing.T
	url    string
	apiKey string
	now    time.Time

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	order     []string
	templates []map[string]any
	snapshots []map[string]any
	files     map[string][]byte
	nextID    int
	// buildLines is what POST /templates streams, one JSON value a line.
	buildLines []string
	lastBuild  client.BuildRequest
	// forkFailures makes the last N children of a fork fail.
	forkFailures int
}

type fakeSandbox struct {
	ID, Template string
	State        string
	EndAt        time.Time
	CPU, MemMB   int
	Timeout      int
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{t: t, apiKey: "test-key", now: time.Now().UTC(), sandboxes: map[string]*fakeSandbox{},
		files:     map[string][]byte{},
		templates: []map[string]any{{"templateID": "tpl-base", "aliases": []string{"base"}, "cpuCount": 2, "memoryMB": 1024}}}
	// A real envd runs the commands, in a home of its own: a login shell
	// reads no profile of the host's user.
	envdHandler := envdtest.New(t).Server.Handler()
	mux := http.NewServeMux()
	f.routes(mux)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(envdclient.HeaderSandboxID); id != "" {
			if r.Header.Get("X-API-Key") != "" {
				t.Errorf("envd request %s carried the API key into the sandbox", r.URL.Path)
			}
			if f.sandbox(id) == nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			envdHandler.ServeHTTP(w, r)
			return
		}
		if r.Header.Get("X-API-Key") != f.apiKey {
			writeFakeError(w, http.StatusUnauthorized, "missing or invalid API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func writeFakeError(w http.ResponseWriter, status int, msg string) {
	writeFakeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeFakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) sandbox(id string) *fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id]
}

func (f *fakeServer) addSandbox(template string) *fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	sb := &fakeSandbox{ID: fmt.Sprintf("sb%04d", f.nextID), Template: template, State: "running",
		EndAt: f.now.Add(5 * time.Minute), CPU: 2, MemMB: 512}
	f.sandboxes[sb.ID] = sb
	f.order = append(f.order, sb.ID)
	return sb
}

func (sb *fakeSandbox) listed(now time.Time) map[string]any {
	return map[string]any{"sandboxID": sb.ID, "templateID": sb.Template, "startedAt": now.Add(-90 * time.Second),
		"endAt": sb.EndAt, "cpuCount": sb.CPU, "memoryMB": sb.MemMB, "state": sb.State, "metadata": map[string]string{},
		"envdAccessToken": ""}
}

// withSandbox runs h with the sandbox named in the path, or answers 404.
func (f *fakeServer) withSandbox(h func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb := f.sandbox(r.PathValue("id"))
		if sb == nil {
			writeFakeError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
			return
		}
		h(w, r, sb)
	}
}

func (f *fakeServer) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes", f.create)
	mux.HandleFunc("GET /v2/sandboxes", f.list)
	mux.HandleFunc("GET /sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		writeFakeJSON(w, http.StatusOK, sb.listed(f.now))
	}))
	mux.HandleFunc("DELETE /sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		f.mu.Lock()
		delete(f.sandboxes, sb.ID)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		var body struct{ Timeout int }
		json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		sb.Timeout = body.Timeout
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /sandboxes/{id}/pause", f.withSandbox(f.setState("paused", "running")))
	mux.HandleFunc("POST /sandboxes/{id}/resume", f.withSandbox(f.setState("running", "paused")))
	mux.HandleFunc("POST /sandboxes/{id}/fork", f.withSandbox(f.fork))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", f.withSandbox(f.snapshot))
	mux.HandleFunc("GET /snapshots", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		writeFakeJSON(w, http.StatusOK, append([]map[string]any{}, f.snapshots...))
	})
	mux.HandleFunc("GET /templates", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		writeFakeJSON(w, http.StatusOK, f.templates)
	})
	mux.HandleFunc("DELETE /templates/{id}", f.deleteTemplate)
	mux.HandleFunc("POST /templates", f.build)
	mux.HandleFunc("PUT /sandboxes/{id}/files", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		data, _ := io.ReadAll(r.Body)
		if r.ContentLength != int64(len(data)) {
			writeFakeError(w, http.StatusBadRequest, "length mismatch")
			return
		}
		f.mu.Lock()
		f.files[sb.ID+":"+r.URL.Query().Get("path")] = data
		f.mu.Unlock()
		writeFakeJSON(w, http.StatusOK, map[string]any{"path": r.URL.Query().Get("path"), "size": len(data)})
	}))
	mux.HandleFunc("GET /sandboxes/{id}/files", f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		f.mu.Lock()
		data, ok := f.files[sb.ID+":"+r.URL.Query().Get("path")]
		f.mu.Unlock()
		if !ok {
			writeFakeError(w, http.StatusNotFound, "file not found")
			return
		}
		w.Write(data)
	}))
}

func (f *fakeServer) create(w http.ResponseWriter, r *http.Request) {
	var req client.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeFakeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !f.hasTemplate(req.TemplateID) {
		writeFakeError(w, http.StatusNotFound, "template "+req.TemplateID+" not found")
		return
	}
	sb := f.addSandbox(req.TemplateID)
	writeFakeJSON(w, http.StatusCreated, map[string]any{"sandboxID": sb.ID, "templateID": sb.Template, "envdAccessToken": ""})
}

func (f *fakeServer) hasTemplate(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tp := range f.templates {
		if tp["templateID"] == id || tp["name"] == id {
			return true
		}
		if aliases, ok := tp["aliases"].([]string); ok && strings.Contains(strings.Join(aliases, "\x00"), id) {
			return true
		}
	}
	for _, s := range f.snapshots {
		if s["snapshotID"] == id || strings.Contains(strings.Join(s["names"].([]string), "\x00"), id) {
			return true
		}
	}
	return false
}

// list serves pages of one entry, to exercise X-Next-Token.
func (f *fakeServer) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var live []*fakeSandbox
	for _, id := range f.order {
		if sb, ok := f.sandboxes[id]; ok {
			live = append(live, sb)
		}
	}
	start := 0
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		fmt.Sscan(tok, &start)
	}
	out := []map[string]any{}
	if start < len(live) {
		out = append(out, live[start].listed(f.now))
		if start+1 < len(live) {
			w.Header().Set("X-Next-Token", fmt.Sprint(start+1))
		}
	}
	writeFakeJSON(w, http.StatusOK, out)
}

func (f *fakeServer) setState(to, from string) func(http.ResponseWriter, *http.Request, *fakeSandbox) {
	return func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if sb.State != from {
			writeFakeError(w, http.StatusConflict, "sandbox "+sb.ID+" is "+sb.State)
			return
		}
		sb.State = to
		w.WriteHeader(http.StatusNoContent)
	}
}

func (f *fakeServer) fork(w http.ResponseWriter, r *http.Request, parent *fakeSandbox) {
	var req struct{ Count int }
	json.NewDecoder(r.Body).Decode(&req)
	out := []map[string]any{}
	for i := range req.Count {
		if i >= req.Count-f.forkFailures {
			out = append(out, map[string]any{"error": map[string]any{"code": 507, "message": "no capacity"}})
			continue
		}
		child := f.addSandbox(parent.Template)
		out = append(out, map[string]any{"sandbox": map[string]any{"sandboxID": child.ID, "templateID": child.Template}})
	}
	writeFakeJSON(w, http.StatusCreated, out)
}

func (f *fakeServer) snapshot(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	var req struct{ Name string }
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	snap := map[string]any{"snapshotID": fmt.Sprintf("snap-%d", len(f.snapshots)+1), "names": []string{req.Name},
		"sandboxID": sb.ID, "createdAt": f.now.Add(-time.Hour).Format(time.RFC3339)}
	f.snapshots = append(f.snapshots, snap)
	f.mu.Unlock()
	writeFakeJSON(w, http.StatusCreated, map[string]any{"snapshotID": snap["snapshotID"], "names": snap["names"]})
}

func (f *fakeServer) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	for i, s := range f.snapshots {
		if s["snapshotID"] == id || s["names"].([]string)[0] == id {
			f.snapshots = append(f.snapshots[:i], f.snapshots[i+1:]...)
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	for i, tp := range f.templates {
		if tp["templateID"] == id || tp["name"] == id {
			f.templates = append(f.templates[:i], f.templates[i+1:]...)
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	writeFakeError(w, http.StatusNotFound, "template "+id+" not found")
}

// build streams f.buildLines as NDJSON, flushing each line.
func (f *fakeServer) build(w http.ResponseWriter, r *http.Request) {
	var req client.BuildRequest
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.lastBuild = req
	lines := f.buildLines
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

// cliResult is one in-process run of the CLI.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cliEnv runs the command tree in-process with its own environment.
type cliEnv struct {
	t    *testing.T
	vars map[string]string
	now  time.Time
}

func newCLIEnv(t *testing.T, srv *fakeServer) *cliEnv {
	home := t.TempDir()
	e := &cliEnv{t: t, vars: map[string]string{"HOME": home, "AENV_CONFIG": filepath.Join(home, "aenv.json")}}
	if srv != nil {
		e.vars[envURL], e.vars[envAPIKey], e.now = srv.url, srv.apiKey, srv.now
	}
	return e
}

func (e *cliEnv) run(stdin string, argv ...string) cliResult {
	e.t.Helper()
	return e.runWith(strings.NewReader(stdin), argv...)
}

func (e *cliEnv) runWith(stdin io.Reader, argv ...string) cliResult {
	e.t.Helper()
	return e.runCtx(e.t.Context(), stdin, argv...)
}

func (e *cliEnv) runCtx(ctx context.Context, stdin io.Reader, argv ...string) cliResult {
	e.t.Helper()
	var stdout, stderr bytes.Buffer
	a := newApp(stdin, &stdout, &stderr, func(k string) string { return e.vars[k] })
	if !e.now.IsZero() {
		a.now = func() time.Time { return e.now }
	}
	code := run(ctx, argv, a)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// mustRun runs argv and fails the test unless it exits 0.
func (e *cliEnv) mustRun(argv ...string) string {
	e.t.Helper()
	res := e.run("", argv...)
	if res.code != 0 {
		e.t.Fatalf("aenv %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(argv, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// requireRoot: see roottest.Require.
func requireRoot(t *testing.T) {
	t.Helper()
	roottest.Require(t)
}
