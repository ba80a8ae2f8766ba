// Package tracingtest is an OTLP/HTTP trace receiver for tests: it keeps
// every span posted to it.
package tracingtest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, flattened.
type Span struct {
	Service      string // the resource's service.name
	Name         string
	TraceID      string // hex
	SpanID       string
	ParentSpanID string // "" for a root span
	Kind         string
	Attrs        map[string]string
	Error        bool // status error
}

func (s Span) String() string {
	return fmt.Sprintf("%s %q trace=%s span=%s parent=%s attrs=%v", s.Service, s.Name, s.TraceID, s.SpanID,
		s.ParentSpanID, s.Attrs)
}

// Receiver is an OTLP/HTTP endpoint: spans go to URL + "/v1/traces".
type Receiver struct {
	URL string

	mu    sync.Mutex
	spans []Span
	posts int
	// changed is closed (and replaced) at each export received.
	changed chan struct{}
}

// NewReceiver starts a receiver, closed at the end of the test.
func NewReceiver(t testing.TB) *Receiver {
	rcv := &Receiver{changed: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(rcv.serve))
	t.Cleanup(srv.Close)
	rcv.URL = srv.URL
	return rcv
}

func (rcv *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "not an OTLP trace export", http.StatusNotFound)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				got = append(got, Span{Service: service, Name: sp.GetName(),
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Kind:         strings.TrimPrefix(sp.GetKind().String(), "SPAN_KIND_"),
					Attrs:        attrs(sp.GetAttributes()),
					Error:        sp.GetStatus().GetCode().String() == "STATUS_CODE_ERROR"})
			}
		}
	}
	rcv.mu.Lock()
	rcv.spans = append(rcv.spans, got...)
	rcv.posts++
	close(rcv.changed)
	rcv.changed = make(chan struct{})
	rcv.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	b, _ = proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Write(b)
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = fmt.Sprint(v.IntValue)
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = fmt.Sprint(v.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = fmt.Sprint(v.DoubleValue)
		default:
			out[kv.GetKey()] = fmt.Sprint(v)
		}
	}
	return out
}

// Spans are the spans received so far.
func (rcv *Receiver) Spans() []Span {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return append([]Span(nil), rcv.spans...)
}

// Posts counts the exports received.
func (rcv *Receiver) Posts() int {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return rcv.posts
}

// WaitFor waits until done holds of the spans received, failing the test
// after timeout.
func (rcv *Receiver) WaitFor(t testing.TB, timeout time.Duration, what string, done func([]Span) bool) []Span {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		rcv.mu.Lock()
		spans := append([]Span(nil), rcv.spans...)
		changed := rcv.changed
		rcv.mu.Unlock()
		if done(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-timer.C:
			for _, s := range spans {
				t.Log(s)
			}
			t.Fatalf("%s: not within %v (%d spans received)", what, timeout, len(spans))
		}
	}
}
