package server

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/aenv-dev/aenv/internal/config"
)

// readHeaderTimeout bounds how long a client may take to send a request's
// headers. Bodies and answers have no overall bound: uploads, command
// streams and terminals legitimately last for hours.
const readHeaderTimeout = 30 * time.Second

// maxHeaderBytes bounds a request's header block (Go's default is 1 MiB):
// E2B's clients send well under 4 KiB, and every byte of a header may end
// up held (a key looked up, a route parsed) before the request is refused.
const maxHeaderBytes = 64 << 10

// httpServer is one listener and the server answering on it.
type httpServer struct {
	what     string
	listener net.Listener
	srv      *http.Server
	maxConns int
}

func (h *httpServer) serve() error { return h.srv.Serve(h.listener) }

// listen opens the API listener and, when configured, the unauthenticated
// metrics listener, each with its connection limit.
func listen(cfg config.Server, api, metrics http.Handler, logger *slog.Logger) ([]*httpServer, error) {
	maxConns := cfg.MaxConnections
	if maxConns == 0 {
		var err error
		if maxConns, err = autoMaxConns(); err != nil {
			return nil, err
		}
	}
	apiSrv, err := newHTTPServer("api", cfg.Listen, api, maxConns, config.Seconds(cfg.IdleTimeoutSecs), logger)
	if err != nil {
		return nil, err
	}
	servers := []*httpServer{apiSrv}
	if cfg.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics)
		// A scraper needs a handful of connections; the rest stay with the API.
		m, err := newHTTPServer("metrics", cfg.MetricsListen, mux, 64, config.Seconds(cfg.IdleTimeoutSecs), logger)
		if err != nil {
			apiSrv.listener.Close()
			return nil, err
		}
		servers = append(servers, m)
	}
	return servers, nil
}

func newHTTPServer(what, addr string, h http.Handler, maxConns int, idle time.Duration, logger *slog.Logger) (*httpServer, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s on %s: %w", what, addr, err)
	}
	limited := newConnLimiter(l, maxConns)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       idle,
		ConnState:         limited.ConnState,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	return &httpServer{what: what, listener: limited, srv: srv, maxConns: maxConns}, nil
}
