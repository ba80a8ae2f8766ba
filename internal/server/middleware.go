package server

import (
	"log/slog"
	"net/http"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/requestid"
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

// requestLogger adds the request ID to the lines logged with a request's
// context.
func requestLogger(logger *slog.Logger) *slog.Logger {
	return slog.New(requestid.LogHandler(logger.Handler()))
}
