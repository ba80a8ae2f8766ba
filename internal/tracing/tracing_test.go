package tracing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/requestid"
	"github.com/aenv-dev/aenv/internal/tracing"
	"github.com/aenv-dev/aenv/internal/tracing/tracingtest"
)

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		ratio    float64
		ok       bool
	}{
		{"", 1, true},
		{"http://collector:4318", 1, true},
		{"https://collector.example/otlp/", 0.25, true},
		{"http://collector:4318", 0, true},
		{"collector:4318", 1, false},
		{"ftp://collector", 1, false},
		{"http://", 1, false},
		{"http://collector:4318", 1.5, false},
		{"http://collector:4318", -0.1, false},
	} {
		err := tracing.Config{Endpoint: tc.endpoint, SampleRatio: tc.ratio}.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%q, %v) = %v, want ok=%v", tc.endpoint, tc.ratio, err, tc.ok)
		}
	}
}

// handler is a comparable http.Handler.
type handler struct{ served int }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.served++ }

// Off (no endpoint), Start makes no tracer, the handler path is the
// handler itself, requests and contexts pass as they are, nothing is
// allocated and nothing is exported.
func TestOff(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	rcv := tracingtest.NewReceiver(t)
	tr, err := tracing.Start(context.Background(), tracing.Config{SampleRatio: 1, Service: "aenv-node"}, slog.Default())
	if err != nil || tr != nil {
		t.Fatalf("Start without an endpoint = %v, %v; want nil, nil", tr, err)
	}
	next := &handler{}
	if h := tr.Handler(next); h != http.Handler(next) {
		t.Fatalf("Handler with tracing off wraps the handler (%T)", h)
	}
	r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
	r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if r2, span := tr.StartRequest(r); r2 != r || span != nil {
		t.Fatalf("StartRequest with tracing off = %p, %v; want the request as it is, no span", r2, span)
	}
	ctx := context.Background()
	h := http.Header{}
	allocs := testing.AllocsPerRun(100, func() {
		r2, span := tr.StartRequest(r)
		tracing.EndRequest(span, "POST /sandboxes", 201)
		c, s := tracing.Child(r2.Context(), "runsc run")
		tracing.End(s, nil)
		tr.Inject(c, h)
	})
	if allocs != 0 {
		t.Errorf("tracing off allocates %v times per request", allocs)
	}
	if c, _ := tracing.Child(ctx, "step"); c != ctx {
		t.Error("Child with tracing off made a new context")
	}
	if len(h) != 0 {
		t.Errorf("Inject with tracing off wrote %v", h)
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rcv.Posts(); n != 0 {
		t.Errorf("%d exports with tracing off", n)
	}
}

// A gateway's request traced into a node's: one trace, the node's server
// span a child of the gateway's call, its steps children of it; a trace
// the gateway does not keep is not kept by the node either.
func TestPropagation(t *testing.T) {
	for _, tc := range []struct {
		name         string
		gatewayRatio float64
		want         int // spans received
	}{
		{"sampled", 1, 4},
		{"not sampled", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := tracingtest.NewReceiver(t)
			ctx := context.Background()
			gw, err := tracing.Start(ctx, tracing.Config{Endpoint: rcv.URL, SampleRatio: tc.gatewayRatio, Service: "aenv-gateway"}, slog.Default())
			if err != nil {
				t.Fatal(err)
			}
			node, err := tracing.Start(ctx, tracing.Config{Endpoint: rcv.URL, SampleRatio: 1, Service: "aenv-node"}, slog.Default())
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			logger := slog.New(requestid.LogHandler(slog.NewTextHandler(&logs, nil), tracing.LogAttr))

			nodeMux := http.NewServeMux()
			nodeMux.HandleFunc("POST /sandboxes", func(w http.ResponseWriter, r *http.Request) {
				_, span := tracing.Child(r.Context(), "runsc run", tracing.SandboxID.String("sb1"))
				span.End()
				logger.InfoContext(r.Context(), "sandbox started")
				w.WriteHeader(http.StatusCreated)
			})
			nodeSrv := httptest.NewServer(node.Handler(nodeMux))
			defer nodeSrv.Close()

			gwMux := http.NewServeMux()
			gwMux.HandleFunc("POST /sandboxes", func(w http.ResponseWriter, r *http.Request) {
				ctx, span := tracing.ChildClient(r.Context(), "send to node")
				out, _ := http.NewRequestWithContext(ctx, r.Method, nodeSrv.URL+r.URL.Path, nil)
				gw.Inject(ctx, out.Header)
				resp, err := http.DefaultClient.Do(out)
				tracing.EndCall(span, resp, err)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				w.WriteHeader(resp.StatusCode)
			})
			gwSrv := httptest.NewServer(gw.Handler(gwMux))
			defer gwSrv.Close()

			resp, err := http.Post(gwSrv.URL+"/sandboxes", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d", resp.StatusCode)
			}
			// Shutdown sends what is left.
			if err := gw.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if err := node.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := rcv.Spans()
			if len(spans) != tc.want {
				for _, s := range spans {
					t.Log(s)
				}
				t.Fatalf("%d spans received, want %d", len(spans), tc.want)
			}
			if tc.want == 0 {
				if strings.Contains(logs.String(), "trace_id") {
					t.Errorf("a trace not kept is logged: %s", logs.String())
				}
				return
			}
			byName := map[string]tracingtest.Span{}
			for _, s := range spans {
				byName[s.Service+" "+s.Name] = s
			}
			gwServer, send := byName["aenv-gateway POST /sandboxes"], byName["aenv-gateway send to node"]
			nodeServer, runsc := byName["aenv-node POST /sandboxes"], byName["aenv-node runsc run"]
			for _, c := range []struct {
				what       string
				span       tracingtest.Span
				parent     string
				kind, code string
			}{
				{"gateway's request", gwServer, "", "SERVER", "201"},
				{"gateway's call", send, gwServer.SpanID, "CLIENT", "201"},
				{"node's request", nodeServer, send.SpanID, "SERVER", "201"},
				{"runsc", runsc, nodeServer.SpanID, "INTERNAL", ""},
			} {
				if c.span.SpanID == "" {
					t.Errorf("no span of the %s", c.what)
					continue
				}
				if c.span.TraceID != gwServer.TraceID {
					t.Errorf("the %s is in trace %s, the gateway's request in %s", c.what, c.span.TraceID, gwServer.TraceID)
				}
				if c.span.ParentSpanID != c.parent {
					t.Errorf("the %s's parent is %q, want %q", c.what, c.span.ParentSpanID, c.parent)
				}
				if c.span.Kind != c.kind {
					t.Errorf("the %s is of kind %s, want %s", c.what, c.span.Kind, c.kind)
				}
				if got := c.span.Attrs["http.response.status_code"]; c.code != "" && got != c.code {
					t.Errorf("the %s has status %q, want %s", c.what, got, c.code)
				}
			}
			if runsc.Attrs[string(tracing.SandboxID)] != "sb1" {
				t.Errorf("runsc span attributes %v lack the sandbox ID", runsc.Attrs)
			}
			if want := "trace_id=" + gwServer.TraceID; !strings.Contains(logs.String(), want) {
				t.Errorf("the node's log line lacks %s: %s", want, logs.String())
			}
		})
	}
}

// A collector that is down costs the request nothing and Shutdown a
// bounded wait.
func TestCollectorDown(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	tr, err := tracing.Start(context.Background(), tracing.Config{Endpoint: url, SampleRatio: 1, Service: "aenv-node"},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	next := &handler{}
	tr.Handler(next).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/sandboxes", nil))
	if next.served != 1 {
		t.Fatal("request not served")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	tr.Shutdown(ctx) // fails (nothing listens); must return within the bound
	if ctx.Err() != nil {
		t.Errorf("Shutdown overran its context")
	}
}

// Background work (a pool making a sandbox, a deadline) is a trace of its
// own: a root span even when its context carries a request's span, the
// steps below it its children; off, it starts nothing.
func TestBackground(t *testing.T) {
	var off *tracing.Tracer
	ctx := context.Background()
	c, span := off.Background(ctx, "warm pool: make a sandbox")
	if c != ctx || span.IsRecording() {
		t.Errorf("Background with tracing off = %v, recording %v; want ctx as it is, nothing recorded", c, span.IsRecording())
	}
	tracing.End(span, nil)

	rcv := tracingtest.NewReceiver(t)
	tr, err := tracing.Start(ctx, tracing.Config{Endpoint: rcv.URL, SampleRatio: 1, Service: "aenv-node"}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	reqR, req := tr.StartRequest(httptest.NewRequest(http.MethodPost, "/sandboxes", nil))
	bgCtx, bg := tr.Background(reqR.Context(), "deadline: kill", tracing.SandboxID.String("sb1"))
	_, step := tracing.Child(bgCtx, "runsc delete")
	tracing.End(step, nil)
	tracing.End(bg, errors.New("kill failed"))
	tracing.EndRequest(req, "POST /sandboxes", 201)
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	byName := map[string]tracingtest.Span{}
	for _, s := range rcv.Spans() {
		byName[s.Name] = s
	}
	root, child, request := byName["deadline: kill"], byName["runsc delete"], byName["POST /sandboxes"]
	if root.SpanID == "" || child.SpanID == "" || request.SpanID == "" {
		t.Fatalf("spans received: %v", rcv.Spans())
	}
	if root.ParentSpanID != "" || root.TraceID == request.TraceID {
		t.Errorf("the background span %v is not the root of a trace of its own (the request's: %s)", root, request.TraceID)
	}
	if child.ParentSpanID != root.SpanID || child.TraceID != root.TraceID {
		t.Errorf("the step %v is not a child of the background span %v", child, root)
	}
	if !root.Error || root.Attrs[string(tracing.SandboxID)] != "sb1" {
		t.Errorf("the background span %v lacks its error or its sandbox", root)
	}
}
