package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/api/openapi"
	"github.com/aenv-dev/aenv/internal/build"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/client/envdtest"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/sandboxlog"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// catalogNode holds a few records and answers the lifecycle calls from
// them, so that every route of the OpenAPI document gives a real answer.
type catalogNode struct {
	recordingNode
	sandboxes []*store.Sandbox
	templates []*store.Template
	// envd serves the running sandboxes' calls (execute, files).
	envd *envdclient.Client
}

func (n *catalogNode) Reach(ctx context.Context, id string, _ int) (*node.Target, error) {
	sb, err := n.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != store.StateRunning || n.envd == nil {
		return nil, fmt.Errorf("%w: sandbox %s is %s", node.ErrConflict, id, sb.State)
	}
	return &node.Target{Envd: n.envd, Ctx: ctx, Release: func() {}}, nil
}

func (n *catalogNode) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if _, err := n.Get(ctx, id); err != nil {
		return runtime.Stats{}, err
	}
	return runtime.Stats{CPUUsageNanos: 2e9, MemoryBytes: 64 << 20}, nil
}

func (n *catalogNode) SandboxLog(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	if _, err := n.Get(ctx, id); err != nil {
		return nil, err
	}
	return sandboxlog.Read([]byte("time=2026-12-04T08:00:00Z level=INFO msg=\"envd serving\" addr=:49983\n"+
		"time=2026-12-04T08:00:01.5Z level=ERROR msg=\"process start failed\" cmd=/no/such\n"), false, time.Now(), q), nil
}

func (n *catalogNode) Get(_ context.Context, id string) (*store.Sandbox, error) {
	for _, sb := range n.sandboxes {
		if sb.ID == id {
			return sb, nil
		}
	}
	return nil, fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
}

func (n *catalogNode) List(context.Context, store.SandboxFilter) ([]*store.Sandbox, error) {
	return n.sandboxes, nil
}

func (n *catalogNode) GetTemplate(_ context.Context, idOrName string) (*store.Template, error) {
	for _, t := range n.templates {
		if t.ID == idOrName || t.Name == idOrName {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
}

func (n *catalogNode) TemplateNamed(_ context.Context, name string) (*store.Template, error) {
	for _, t := range n.templates {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, name)
}

func (n *catalogNode) ListTemplates(context.Context) ([]*store.Template, error) {
	return n.templates, nil
}

func (n *catalogNode) ListSnapshots(context.Context, store.SnapshotFilter) ([]*store.Template, error) {
	var out []*store.Template
	for _, t := range n.templates {
		if t.Kind == store.KindSnapshot {
			out = append(out, t)
		}
	}
	return out, nil
}

func (n *catalogNode) Kill(ctx context.Context, id string) error {
	_, err := n.Get(ctx, id)
	return err
}

func (n *catalogNode) Pause(ctx context.Context, id string, _ node.PauseOptions) error {
	sb, err := n.Get(ctx, id)
	if err == nil && sb.State == store.StatePaused {
		return fmt.Errorf("%w: sandbox %s is already paused", node.ErrConflict, id)
	}
	return err
}

func (n *catalogNode) UpdateNetwork(ctx context.Context, id string, _ *store.NetworkPolicy) error {
	_, err := n.Get(ctx, id)
	return err
}

func (n *catalogNode) Fork(_ context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	return []node.ForkResult{
		{Sandbox: &store.Sandbox{ID: "child1", TemplateID: "snap1", State: store.StateRunning, AccessToken: "t1"}},
		{Err: fmt.Errorf("%w: no memory left", node.ErrUnavailable)},
	}, nil
}

func (n *catalogNode) Snapshot(_ context.Context, req node.SnapshotRequest) (*store.Template, error) {
	return &store.Template{ID: "snap2", Name: req.Name, Kind: req.Kind, SourceSandbox: req.SandboxID,
		CreatedAt: time.Now()}, nil
}

func (n *catalogNode) DeleteTemplate(context.Context, string) error {
	return fmt.Errorf("%w: template base is in use by sandbox sbx1", node.ErrConflict)
}

// TestAnswersMatchOpenAPI drives every route of api/openapi/aenv.yaml,
// successes and errors, and checks each answer against the document: the
// document is what clients are generated from, so it must not drift from
// what the server says.
func TestAnswersMatchOpenAPI(t *testing.T) {
	now := time.Now().UTC()
	n := &catalogNode{
		sandboxes: []*store.Sandbox{
			{ID: "sbx1", TemplateID: "base", Alias: "base", State: store.StateRunning, VCPU: 2, MemoryMB: 512,
				AccessToken: "tok", StartedAt: now, EndAt: now.Add(time.Minute), Metadata: map[string]string{"k": "v"}},
			{ID: "sbx2", TemplateID: "base", State: store.StatePaused, AutoPause: true, AutoResume: true,
				TrafficToken: "traffic", Network: &store.NetworkPolicy{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}},
				StartedAt: now, EndAt: now.Add(time.Minute)},
			// As a gateway lists a sandbox whose node misses heartbeats.
			{ID: "sbx3", TemplateID: "base", State: "unreachable", NodeID: "node-b", StartedAt: now,
				EndAt: now.Add(time.Minute)},
		},
		templates: []*store.Template{
			{ID: "base", Name: "base", Kind: store.KindRootfs, VCPU: 1, MemoryMB: 512, CreatedAt: now},
			{ID: "snap1", Name: "snap1", Kind: store.KindSnapshot, SourceSandbox: "sbx1", CreatedAt: now,
				Upload: store.UploadUploaded},
			{ID: "snap3", Name: "snap3", Kind: store.KindSandboxTemplate, CreatedAt: now, Upload: store.UploadFailed,
				UploadError: "bucket gone"},
			{ID: "tpl-4", Name: "tagged", Kind: store.KindRootfs, VCPU: 1, MemoryMB: 512, CreatedAt: now},
		},
	}
	env := envdtest.New(t)
	envdSrv := httptest.NewServer(env.Server.Handler())
	t.Cleanup(envdSrv.Close)
	n.envd = envdclient.New(envdSrv.URL, envdSrv.Client(), "")
	srv := conformanceServer(t, n)
	client := &http.Client{Transport: wiretest.Transport(t, nil)}
	do := func(method, path, contentType, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", "key")
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, data
	}
	// Two builds: one started (it fails at once: the build service has no
	// time for it), one left waiting.
	requestBuild := func() string {
		t.Helper()
		code, body := do("POST", "/v3/templates", "application/json", `{"name":"app"}`)
		var ref wire.TemplateBuildRef
		if err := json.Unmarshal(body, &ref); code != http.StatusAccepted || err != nil {
			t.Fatalf("request build: %d %s", code, body)
		}
		return ref.BuildID
	}
	started, waiting := requestBuild(), requestBuild()
	dir := t.TempDir() // the envd's files are the test's own
	hash := strings.Repeat("ab", 32)

	tests := []struct {
		method, path, body string
		want               int
		contentType        string // application/json for a body when empty
	}{
		{"POST", "/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"a":"b"}}`, 201, ""},
		{"POST", "/sandboxes", `{"templateID":"base","secure":false}`, 201, ""},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, 201, ""},
		{"POST", "/v2/sandboxes", `{"templateID":`, 400, ""},
		{"POST", "/v2/sandboxes", `{"templateID":"base","timeout":-1}`, 400, ""},
		{"GET", "/sandboxes", ``, 200, ""},
		{"GET", "/v2/sandboxes?state=running,paused&limit=1", ``, 200, ""},
		{"GET", "/v2/sandboxes?limit=0", ``, 400, ""},
		{"GET", "/sandboxes/sbx1", ``, 200, ""},
		{"GET", "/sandboxes/sbx2", ``, 200, ""},
		{"GET", "/sandboxes/sbx3", ``, 200, ""},
		{"GET", "/sandboxes/nope", ``, 404, ""},
		{"DELETE", "/sandboxes/sbx1", ``, 204, ""},
		{"DELETE", "/sandboxes/nope", ``, 404, ""},
		{"POST", "/sandboxes/sbx1/timeout", `{"timeout":30}`, 204, ""},
		{"POST", "/sandboxes/sbx1/timeout", `{}`, 400, ""},
		{"PUT", "/sandboxes/sbx1/network", `{"allowOut":["8.8.8.8"],"allow_internet_access":false}`, 204, ""},
		{"POST", "/sandboxes/sbx1/pause", `{}`, 204, ""},
		{"POST", "/sandboxes/sbx2/pause", `{"memory":false}`, 409, ""},
		{"POST", "/sandboxes/sbx2/resume", `{"timeout":60}`, 201, ""},
		{"POST", "/v2/sandboxes/sbx2/connect", `{}`, 201, ""},
		{"POST", "/sandboxes/sbx1/fork", `{"count":2}`, 201, ""},
		{"POST", "/snapshots/snap1/fork", ``, 201, ""},
		// A gateway's copy sources: only in a fork of a snapshot, only for
		// paths it copies.
		{"POST", "/sandboxes/sbx1/fork", `{"count":1,"volumes":{"/w":"copy"},"copySources":{"/w":"v1"}}`, 400, ""},
		{"POST", "/snapshots/snap1/fork", `{"count":1,"copySources":{"/w":"v1"}}`, 400, ""},
		{"POST", "/sandboxes/sbx1/snapshots", `{"name":"mine"}`, 201, ""},
		{"GET", "/snapshots?limit=10", ``, 200, ""},
		{"GET", "/templates", ``, 200, ""},
		{"GET", "/templates/base", ``, 200, ""},
		{"GET", "/templates/nope", ``, 404, ""},
		{"POST", "/templates", `{"sandboxID":"sbx1","name":"tpl"}`, 201, ""},
		{"POST", "/templates", `{}`, 400, ""},
		{"DELETE", "/templates/base", ``, 409, ""},
		{"GET", "/health", ``, 200, ""},
		{"POST", "/sandboxes/sbx1/execute", `{"command":"echo out; echo err >&2; exit 3","envs":{"A":"b"},"timeout":30}`, 200, ""},
		{"POST", "/sandboxes/sbx1/execute", `{}`, 400, ""},
		{"POST", "/sandboxes/sbx2/execute", `{"command":"true"}`, 409, ""},
		{"POST", "/sandboxes/sbx1/files/write", `{"path":"{dir}/a.txt","content":"hello"}`, 200, ""},
		{"POST", "/sandboxes/sbx1/files/write", `{"path":"{dir}/b.bin","content":"/wA=","encoding":"base64"}`, 200, ""},
		{"POST", "/sandboxes/sbx1/files/write", `{"path":"relative"}`, 400, ""},
		{"GET", "/sandboxes/sbx1/files/read?path={dir}/a.txt", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/files/read?path={dir}/b.bin&encoding=base64", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/files/read?path={dir}/b.bin", ``, 400, ""},
		{"GET", "/sandboxes/sbx1/files/read?path={dir}/missing", ``, 404, ""},
		{"PUT", "/sandboxes/sbx1/files?path={dir}/c.bin", "raw\x00bytes", 200, "application/octet-stream"},
		{"PUT", "/sandboxes/nope/files?path={dir}/c.bin", "raw", 404, "application/octet-stream"},
		{"GET", "/sandboxes/sbx1/files?path={dir}/c.bin", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/files?path=relative", ``, 400, ""},
		{"GET", "/sandboxes/sbx1/metrics", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/metrics?start=20&end=10", ``, 400, ""},
		{"GET", "/sandboxes/nope/metrics", ``, 404, ""},
		{"GET", "/sandboxes/sbx1/logs", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/logs?start=1764835201000&limit=1", ``, 200, ""},
		{"GET", "/sandboxes/sbx1/logs?start=-1", ``, 400, ""},
		{"GET", "/sandboxes/sbx1/logs?limit=1001", ``, 400, ""},
		{"GET", "/sandboxes/nope/logs", ``, 404, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?direction=backward&level=error&search=process&limit=10", ``, 200, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?cursor=1764835200000", ``, 200, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?direction=sideways", ``, 400, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?level=verbose", ``, 400, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?search=" + strings.Repeat("a", 257), ``, 400, ""},
		{"GET", "/v2/sandboxes/sbx1/logs?cursor=soon", ``, 400, ""},
		{"GET", "/v2/sandboxes/nope/logs", ``, 404, ""},
		{"POST", "/v3/templates", `{"name":"app:v1","tags":["v2"],"cpuCount":1,"memoryMB":512}`, 202, ""},
		{"POST", "/v3/templates", `{}`, 400, ""},
		{"GET", "/templates/app/files/" + hash, ``, 201, ""},
		{"GET", "/templates/app/files/xyz", ``, 400, ""},
		{"POST", "/v2/templates/app/builds/" + started, `{"fromTemplate":"base","steps":[{"type":"RUN","args":["true"]}]}`, 202, ""},
		{"POST", "/v2/templates/app/builds/nope", `{"fromTemplate":"base"}`, 404, ""},
		{"GET", "/templates/app/builds/" + waiting + "/status", ``, 200, ""},
		{"GET", "/templates/app/builds/" + waiting + "/status?limit=101", ``, 400, ""},
		{"GET", "/templates/app/builds/nope/status", ``, 404, ""},
		{"GET", "/templates/app/builds", ``, 200, ""},
		{"GET", "/templates/nope/builds", ``, 404, ""},
		{"POST", "/templates/tags", `{"target":"tagged","tags":["v1","v2"]}`, 201, ""},
		{"POST", "/templates/tags", `{"target":"nope","tags":["v1"]}`, 404, ""},
		{"GET", "/templates/tagged/tags", ``, 200, ""},
		{"GET", "/templates/nope/tags", ``, 404, ""},
		{"DELETE", "/templates/tags", `{"name":"tagged","tags":["v2"]}`, 204, ""},
		{"DELETE", "/templates/tags", `{"name":"","tags":["v2"]}`, 400, ""},
		{"GET", "/templates/aliases/base", ``, 200, ""},
		{"GET", "/templates/aliases/tagged:v1", ``, 200, ""},
		{"GET", "/templates/aliases/nope", ``, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			contentType := tt.contentType
			if contentType == "" && tt.body != "" {
				contentType = "application/json"
			}
			path := strings.ReplaceAll(tt.path, "{dir}", dir)
			body := strings.ReplaceAll(tt.body, "{dir}", dir)
			if code, answer := do(tt.method, path, contentType, body); code != tt.want {
				t.Errorf("status %d (%s), want %d", code, answer, tt.want)
			}
		})
	}

	// The started build fails (it has no time); its status then carries
	// the reason, which is checked too.
	statusPath := "/templates/app/builds/" + started + "/status"
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := do("GET", statusPath, "", "")
		var info wire.TemplateBuildInfo
		if err := json.Unmarshal(body, &info); code != http.StatusOK || err != nil {
			t.Fatalf("build status: %d %s", code, body)
		}
		if info.Status == wire.TemplateBuildInfoStatusError {
			if info.Reason == nil {
				t.Fatalf("failed build without a reason: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build still %s after 30 s", info.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// conformanceServer is a server over n with the build service and the
// limits the routes need.
func conformanceServer(t *testing.T, n node.Node) *httptest.Server {
	t.Helper()
	dir := t.TempDir()
	uploads, err := build.NewUploads(filepath.Join(dir, "files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// No build time: a started build fails at once, with a reason.
	builds, err := build.New(build.Config{}, n, uploads, filepath.Join(dir, "state"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(builds.Close)
	s := New(Config{APIKey: "key", MaxJSONBytes: 1 << 20, MaxFileBytes: 1 << 20, Builds: builds,
		DefaultExecTimeout: time.Minute, MaxExecTimeout: time.Hour},
		n, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), http.NotFoundHandler())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

// A build canceled before it ran has a reason without log entries; its
// status must still give them as a list, as the document says.
func TestBuildReasonWithoutLogsMatchesOpenAPI(t *testing.T) {
	doc := wiretest.Document(t)
	schema := doc.Components.Schemas["BuildStatusReason"].Value
	data, err := json.Marshal(wireReason(&build.Reason{Message: "build canceled"}))
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if err := schema.VisitJSON(v); err != nil {
		t.Errorf("reason %s: %v", data, err)
	}
}

// The checker itself must catch a shape the document does not give: an
// answer missing a required field, and a field of the wrong type.
func TestConformanceCheckerCatchesDrift(t *testing.T) {
	bad := []string{
		`{"templateID":"base","clientID":"aenv","envdVersion":"0.6.13","domain":null,"trafficAccessToken":null}`,
		`{"sandboxID":7,"templateID":"base","clientID":"aenv","envdVersion":"0.6.13","domain":null,"trafficAccessToken":null}`,
	}
	for _, body := range bad {
		srv := http.NewServeMux()
		srv.HandleFunc("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, body)
		})
		rec := &recordingT{TB: t}
		rt := wiretest.Transport(rec, roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)
			return w.Result(), nil
		}))
		req, _ := http.NewRequest("POST", "http://aenv.test/v2/sandboxes", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if _, err := rt.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if len(rec.errors) == 0 {
			t.Errorf("answer %s passed the check", body)
		}
	}
}

// Requests the server passes to a sandbox are not the control plane's,
// even on its paths: envd answers its own GET /health with 204.
func TestConformanceCheckerSkipsSandboxTraffic(t *testing.T) {
	envd := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		w := httptest.NewRecorder()
		w.WriteHeader(http.StatusNoContent)
		return w.Result(), nil
	})
	for _, header := range []http.Header{
		{"E2b-Sandbox-Id": {"i3zp1mbxpfctq2tw6y3c"}},
		{"Host": {"49983-i3zp1mbxpfctq2tw6y3c.aenv.test"}},
	} {
		rec := &recordingT{TB: t}
		req, _ := http.NewRequest("GET", "http://127.0.0.1:8000/health", nil)
		for k, v := range header {
			req.Header[k] = v
		}
		if h := header.Get("Host"); h != "" {
			req.Host = h
		}
		if _, err := wiretest.Transport(rec, envd).RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		if len(rec.errors) > 0 {
			t.Errorf("%v: %v", header, rec.errors)
		}
	}
	// Without either, the same answer is the control plane's, and wrong.
	rec := &recordingT{TB: t}
	req, _ := http.NewRequest("GET", "http://127.0.0.1:8000/health", nil)
	if _, err := wiretest.Transport(rec, envd).RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if len(rec.errors) == 0 {
		t.Error("a 204 from GET /health passed the check")
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// recordingT keeps the errors reported to it instead of failing.
type recordingT struct {
	testing.TB
	errors []string
}

func (r *recordingT) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// The server serves its OpenAPI document, without a key, and it is the
// one the types were generated from.
func TestServesOpenAPIDocument(t *testing.T) {
	srv := tagServer(t, &catalogNode{})
	resp, err := http.Get(srv.URL + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, openapi.Document) {
		t.Fatalf("GET /openapi.yaml: %d, %d bytes", resp.StatusCode, len(body))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("Content-Type %q", ct)
	}
}
