// Package tracing sends OpenTelemetry traces of the requests that make
// sandboxes (create, fork, resume) to an OTLP/HTTP collector: the
// gateway's handling and its call to the node, the node's API handler,
// the sandbox manager's steps and the runtime's runsc commands, one trace
// across processes by W3C trace context (the traceparent header).
//
// Tracing is off unless an endpoint is configured; off, a *Tracer is nil,
// its methods do nothing, and Child, which only ever continues a trace a
// request already has, costs one context lookup.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation names the spans' origin to the collector.
const instrumentation = "github.com/aenv-dev/aenv"

// Attribute keys of aenv's own.
const (
	// SandboxID names the sandbox a span is about.
	SandboxID = attribute.Key("aenv.sandbox.id")
	// NodeID names the node a gateway sends a request to.
	NodeID = attribute.Key("aenv.node.id")
)

// Config of a process's tracing.
type Config struct {
	// Endpoint is the base URL of an OTLP/HTTP collector (e.g.
	// http://otel-collector:4318); spans go to /v1/traces under it. Empty:
	// the standard OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when set, else tracing is off.
	Endpoint string
	// SampleRatio of the traces begun here that are kept (0 to 1); a
	// request arriving with a trace keeps its caller's decision.
	SampleRatio float64
	// Service is the process's service.name (aenv-server, aenv-node,
	// aenv-gateway); Version its service.version.
	Service string
	Version string
}

// Enabled tells whether cfg turns tracing on.
func (c Config) Enabled() bool {
	return c.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Validate checks the endpoint and the ratio.
func (c Config) Validate() error {
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return fmt.Errorf("--trace-sample-ratio must be between 0 and 1, got %v", c.SampleRatio)
	}
	if c.Endpoint == "" {
		return nil
	}
	_, err := tracesURL(c.Endpoint)
	return err
}

// tracesURL is where spans are posted: the endpoint's /v1/traces.
func tracesURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--otlp-endpoint must be an http:// or https:// URL, got %q", endpoint)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	return u.String(), nil
}

// Tracer starts the spans of one process. A nil *Tracer is tracing off.
type Tracer struct {
	provider   *sdktrace.TracerProvider
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// Start sets up tracing as cfg says: nil (off) without an endpoint. The
// exporter sends batches in the background; Shutdown sends what is left.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Tracer, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := tracesURL(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	}
	exporter, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.Service)}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	if host, err := os.Hostname(); err == nil {
		attrs = append(attrs, attribute.String("host.name", host))
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	// The exporter reports failures (a collector down) through OTel's
	// process-wide handler: into this process's log, not bare stderr.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing", "err", err)
	}))
	return &Tracer{provider: provider, tracer: provider.Tracer(instrumentation),
		propagator: propagation.TraceContext{}}, nil
}

// Shutdown sends the spans not yet exported and stops the exporter.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush spans: %w", err)
	}
	return nil
}

// Inject writes the trace ctx is part of into h (traceparent), for the
// process h is sent to.
func (t *Tracer) Inject(ctx context.Context, h http.Header) {
	if t == nil {
		return
	}
	t.propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// StartRequest starts the server span of an API request, continuing the
// trace of its traceparent header when it has one; r is returned with the
// span in its context. EndRequest ends it. Off, r is returned as it is
// and the span is nil.
func (t *Tracer) StartRequest(r *http.Request) (*http.Request, trace.Span) {
	if t == nil || isProbe(r) {
		return r, nil
	}
	ctx := t.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	// Named by the route once it is known (EndRequest): the path holds IDs.
	ctx, span := t.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method)))
	return r.WithContext(ctx), span
}

// isProbe tells a health check or a metrics scrape, which are not traced:
// they would fill the collector with traces of nothing.
func isProbe(r *http.Request) bool {
	return r.Method == http.MethodGet && (r.URL.Path == "/health" || r.URL.Path == "/metrics")
}

// EndRequest names span (from StartRequest; nil does nothing) after the
// route pattern the request matched, records the answer's status and
// ends it.
func EndRequest(span trace.Span, route string, status int) {
	if span == nil {
		return
	}
	if route != "" {
		span.SetName(route)
		span.SetAttributes(attribute.String("http.route", route))
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	span.End()
}

// Handler serves next in a server span (see StartRequest) named after
// the route pattern next matched: next must be, or end in, the
// *http.ServeMux that routes the request. Off, it is next itself.
func (t *Tracer) Handler(next http.Handler) http.Handler {
	if t == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, span := t.StartRequest(r)
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		EndRequest(span, r.Pattern, rec.status)
	})
}

// statusWriter notes the status of an answer. Unwrap keeps what the
// writer below offers (flushing, full duplex, hijacking) reachable
// through http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(status int) {
	if !w.wroteHeader && status >= 200 {
		w.status, w.wroteHeader = status, true
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Background starts the root span of a new trace for work that no request
// asked for (a pool making a sandbox, a deadline pausing or killing one),
// so that its steps, the Child spans below it down to runsc's commands,
// are traced as a request's are. It is sampled as a request without a
// traceparent is. Off (a nil Tracer) it starts nothing and returns a span
// that records nothing.
func (t *Tracer) Background(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if t == nil {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return t.tracer.Start(ctx, name, trace.WithNewRoot(), trace.WithAttributes(attrs...))
}

// Child starts a span named name under the one ctx carries, from the same
// tracer provider. When ctx carries no span being recorded (tracing off,
// a request not sampled, or work outside any request) it starts nothing
// and returns ctx and its span as they are: only the requests being
// traced get steps.
func Child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(instrumentation).Start(ctx, name, trace.WithAttributes(attrs...))
}

// ChildClient is Child for a call to another process (a span of kind
// client).
func ChildClient(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(instrumentation).Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// End records err (if any) on span and ends it.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// EndCall ends the span of an HTTP call with its answer's status, or its
// error.
func EndCall(span trace.Span, resp *http.Response, err error) {
	if resp != nil && span.IsRecording() {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
		}
	}
	End(span, err)
}

// LogKey is the attribute naming a request's trace in log lines.
const LogKey = "trace_id"

// LogAttr is the trace ID of a traced request's context, as trace_id: the
// way from a log line to the trace, as request_id is the way from an answer
// to the log lines. It goes to requestid.LogHandler.
func LogAttr(ctx context.Context) (slog.Attr, bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return slog.Attr{}, false
	}
	return slog.String(LogKey, sc.TraceID().String()), true
}
