package server

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/requestid"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// withRequestID gives each request to the node's API an ID: the one a
// gateway (or a client) sent in X-Request-Id, or a new one. The node's log
// lines for the request carry it (see requestLogger) and the answer echoes
// it. Traffic to a sandbox's exposed port is its application's: it passes
// untouched.
func withRequestID(h http.Handler, domain string) http.Handler {
	withID := requestid.Middleware(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := api.ExposedPort(r.Host, domain); ok {
			h.ServeHTTP(w, r)
			return
		}
		withID.ServeHTTP(w, r)
	})
}

// requestLogger adds the request ID, and the trace ID of a traced
// request, to the lines logged with a request's context.
func requestLogger(logger *slog.Logger) *slog.Logger {
	return slog.New(requestid.LogHandler(logger.Handler(), tracing.LogAttr))
}

// startTracing sets up the process's traces (nil: off).
func startTracing(ctx context.Context, cfg tracing.Config, logger *slog.Logger) (*tracing.Tracer, error) {
	tracer, err := tracing.Start(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	if tracer != nil {
		endpoint := cfg.Endpoint
		if endpoint == "" {
			endpoint = "from OTEL_EXPORTER_OTLP_* variables"
		}
		logger.InfoContext(ctx, "sending traces", "service", cfg.Service, "endpoint", endpoint,
			"sample_ratio", cfg.SampleRatio)
	}
	return tracer, nil
}

// stopTracing sends the spans not yet sent, within a bound: a collector
// that is down must not hold the exit.
func stopTracing(tracer *tracing.Tracer, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tracer.Shutdown(ctx); err != nil {
		logger.Warn("traces not sent at exit", "err", err)
	}
}
