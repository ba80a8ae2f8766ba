package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/tracing"
	"github.com/aenv-dev/aenv/internal/tracing/tracingtest"
)

// A create, a fork and a resume through a gateway are each one trace
// across the gateway, the node and runsc, sent to an OTLP collector: the
// node's request is a child of the gateway's call to it, the sandbox
// manager's step a child of the node's request, and the runsc command
// that made the sandbox is in the trace, naming it.
func TestTracingAcrossCluster(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.NewReceiver(t)
	c := newCluster(t)
	// No pools: the create boots a sandbox with runsc in the request.
	node := c.addNode("node-t", "--otlp-endpoint", rcv.URL, "--warm-sandboxes", "0", "--prepared-sandboxes", "0")
	g := c.addGateway("--otlp-endpoint", rcv.URL)
	g.waitReady(t, "node-t")
	ctx := context.Background()

	id := g.create(t)
	forks, err := g.api.Fork(ctx, id, 1)
	if err != nil || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork through the gateway: %v %+v", err, forks)
	}
	child := forks[0].Sandbox.SandboxID
	if err := g.api.Pause(ctx, id, client.PauseRequest{}); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := g.api.Resume(ctx, id, 0); err != nil {
		t.Fatalf("resume: %v", err)
	}

	for _, tc := range []struct {
		route   string // the node's route
		step    string // the sandbox manager's span
		runsc   string // a runsc command of the trace
		sandbox string // ...on this sandbox
	}{
		{"POST /sandboxes", "create sandbox", "runsc run", id},
		{"POST /sandboxes/{id}/fork", "fork", "runsc restore", child},
		{"POST /sandboxes/{id}/resume", "resume sandbox", "runsc resume", id},
	} {
		t.Run(tc.step, func(t *testing.T) {
			// Spans are sent in batches (every 5 s by default).
			spans := rcv.WaitFor(t, time.Minute, tc.route+" traced from the gateway to runsc", func(spans []tracingtest.Span) bool {
				tr := traceOf(spans, tc.route, "aenv-node")
				return tr != nil && tr.find("aenv-gateway", "", "SERVER") != nil &&
					tr.find("aenv-node", tc.runsc, "") != nil
			})
			tr := traceOf(spans, tc.route, "aenv-node")
			for _, s := range tr.spans {
				t.Log(s)
			}
			nodeReq := tr.find("aenv-node", tc.route, "SERVER")
			call := tr.byID[nodeReq.ParentSpanID]
			if call == nil || call.Service != "aenv-gateway" || call.Kind != "CLIENT" {
				t.Fatalf("the node's request is not a child of the gateway's call to it: parent %v", call)
			}
			gwReq := tr.byID[call.ParentSpanID]
			if gwReq == nil || gwReq.Service != "aenv-gateway" || gwReq.Kind != "SERVER" || gwReq.ParentSpanID != "" {
				t.Fatalf("the gateway's call to the node is not a child of its request (the trace's root): parent %v", gwReq)
			}
			if call.Attrs[string(tracing.NodeID)] != "node-t" {
				t.Errorf("the gateway's call does not name the node: %v", call.Attrs)
			}
			step := tr.find("aenv-node", tc.step, "")
			if step == nil || step.ParentSpanID != nodeReq.SpanID {
				t.Fatalf("no %q span under the node's request: %v", tc.step, step)
			}
			var runsc *tracingtest.Span
			for _, s := range tr.spans {
				if s.Name == tc.runsc && s.Attrs[string(tracing.SandboxID)] == tc.sandbox {
					runsc = s
				}
			}
			if runsc == nil {
				t.Fatalf("no %q span naming sandbox %s in the trace", tc.runsc, tc.sandbox)
			}
			// runsc's span descends from the manager's step.
			for p := runsc; p.SpanID != step.SpanID; p = tr.byID[p.ParentSpanID] {
				if p.ParentSpanID == "" || tr.byID[p.ParentSpanID] == nil {
					t.Fatalf("%q does not descend from %q", tc.runsc, tc.step)
				}
			}
			for _, s := range tr.spans {
				if s.Error {
					t.Errorf("span %s failed", s)
				}
			}
			// The node's log lines of the request name the trace.
			if want := "trace_id=" + nodeReq.TraceID; !strings.Contains(node.logs.String(), want) {
				t.Errorf("the node's log has no line with %s", want)
			}
		})
	}
}

// spanTrace is the spans of one trace.
type spanTrace struct {
	spans []*tracingtest.Span
	byID  map[string]*tracingtest.Span
}

// traceOf is the trace of service's request on route (the last one).
func traceOf(spans []tracingtest.Span, route, service string) *spanTrace {
	traceID := ""
	for _, s := range spans {
		if s.Service == service && s.Kind == "SERVER" && s.Attrs["http.route"] == route {
			traceID = s.TraceID
		}
	}
	if traceID == "" {
		return nil
	}
	tr := &spanTrace{byID: map[string]*tracingtest.Span{}}
	for i := range spans {
		if spans[i].TraceID == traceID {
			tr.spans = append(tr.spans, &spans[i])
			tr.byID[spans[i].SpanID] = &spans[i]
		}
	}
	return tr
}

// find returns the span of service named name ("": any) of kind ("": any).
func (tr *spanTrace) find(service, name, kind string) *tracingtest.Span {
	for _, s := range tr.spans {
		if s.Service == service && (name == "" || s.Name == name) && (kind == "" || s.Kind == kind) {
			return s
		}
	}
	return nil
}

// A single server traces as aenv-server, and continues the trace of a
// caller that sends one (traceparent).
func TestTracingSingleServerContinuesCallersTrace(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.NewReceiver(t)
	s := newServer(t, "--otlp-endpoint", rcv.URL, "--warm-sandboxes", "0", "--prepared-sandboxes", "0")
	s.start()
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, s.url+"/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb client.Sandbox
	err = json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	spans := rcv.WaitFor(t, time.Minute, "the create traced", func(spans []tracingtest.Span) bool {
		tr := traceOf(spans, "POST /sandboxes", "aenv-server")
		return tr != nil && tr.find("aenv-server", "runsc run", "") != nil
	})
	tr := traceOf(spans, "POST /sandboxes", "aenv-server")
	req0 := tr.find("aenv-server", "POST /sandboxes", "SERVER")
	if req0.TraceID != callerTrace || req0.ParentSpanID != callerSpan {
		t.Errorf("the server's request is in trace %s under %s, want the caller's %s under %s",
			req0.TraceID, req0.ParentSpanID, callerTrace, callerSpan)
	}
	if run := tr.find("aenv-server", "runsc run", ""); run.Attrs[string(tracing.SandboxID)] != sb.SandboxID {
		t.Errorf("runsc run names %v, want sandbox %s", run.Attrs, sb.SandboxID)
	}
}

// Work no request asks for is traced in traces of its own: the warm pool
// making a sandbox (down to its runsc commands), a deadline pausing one
// (down to runsc pause) and a deadline killing another.
func TestTracingBackgroundWork(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.NewReceiver(t)
	s := newServer(t, "--otlp-endpoint", rcv.URL, "--warm-sandboxes", "1", "--prepared-sandboxes", "0")
	s.start()
	paused := s.create(map[string]any{"templateID": "base", "timeout": 1, "autoPause": true})
	killed := s.create(map[string]any{"templateID": "base", "timeout": 1})
	rcv.WaitFor(t, 2*time.Minute, "the background work traced", func(spans []tracingtest.Span) bool {
		return backgroundTrace(spans, "warm pool: make a sandbox", "", "runsc ") &&
			backgroundTrace(spans, "deadline: pause", paused.SandboxID, "runsc pause") &&
			backgroundTrace(spans, "deadline: kill", killed.SandboxID, "")
	})
	var info client.Sandbox
	s.expect(s.do("GET", "/sandboxes/"+paused.SandboxID, nil), 200, "get").json(t, &info)
	if info.State != "paused" {
		t.Errorf("the sandbox with autoPause is %q after its deadline, want paused", info.State)
	}
}

// backgroundTrace says whether spans hold a trace whose root is a span of
// the server named root (about sandbox id; "": any) with, below it, a span
// whose name begins with step ("": none needed).
func backgroundTrace(spans []tracingtest.Span, root, id, step string) bool {
	for _, r := range spans {
		if r.Service != "aenv-server" || r.Name != root || r.ParentSpanID != "" ||
			(id != "" && r.Attrs[string(tracing.SandboxID)] != id) {
			continue
		}
		if step == "" {
			return true
		}
		for _, s := range spans {
			if s.TraceID == r.TraceID && s.SpanID != r.SpanID && strings.HasPrefix(s.Name, step) {
				return true
			}
		}
	}
	return false
}
