package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/console"
	"github.com/aenv-dev/aenv/internal/tlscert"
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

// listen opens the API listener (and its HTTPS twin with tlsSrc) and, when
// configured, the unauthenticated metrics listener, each with its
// connection limit.
func listen(cfg config.Server, api, metrics http.Handler, tlsSrc *tlscert.Source, logger *slog.Logger) ([]*httpServer, error) {
	maxConns := cfg.MaxConnections
	if maxConns == 0 {
		var err error
		if maxConns, err = autoMaxConns(); err != nil {
			return nil, err
		}
	}
	servers, err := apiListeners("api", cfg.Listen, cfg.TLS.Listen, tlsSrc, api, maxConns,
		config.Seconds(cfg.IdleTimeoutSecs), logger)
	if err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics)
		// A scraper needs a handful of connections; the rest stay with the API.
		m, err := newHTTPServer("metrics", cfg.MetricsListen, mux, 64, config.Seconds(cfg.IdleTimeoutSecs), logger)
		if err != nil {
			closeListeners(servers)
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

// sandboxHosts is the ACME host policy's view of sandboxes: a host
// <port>-<id>.<domain> gets a certificate only while sandbox id exists,
// so that random names in handshakes cannot spend the ACME server's rate
// limits (one order each) nor fill the certificate cache. The lookup is
// set once the sandboxes can be asked about: the certificates come first
// at start, and until then no sandbox host is allowed.
//
// IDs found unknown are remembered for a while, so that a flood of
// handshakes naming made-up sandboxes costs one lookup (a database read
// on a gateway) per name, not one per handshake. A remembered miss cannot
// hide a real sandbox: IDs are random and made by the server, so nobody
// asks for one before its create answers.
type sandboxHosts struct {
	domain  string
	lookup  atomic.Pointer[func(ctx context.Context, id string) (bool, error)]
	unknown *expirable.LRU[string, struct{}]
}

// Bounds of the remembered misses: enough for a scan's worth of names,
// small in memory (a few hundred KiB at most).
const (
	unknownHostsMax = 4096
	unknownHostsTTL = time.Minute
)

func newSandboxHosts(domain string) *sandboxHosts {
	return &sandboxHosts{domain: domain,
		unknown: expirable.NewLRU[string, struct{}](unknownHostsMax, nil, unknownHostsTTL)}
}

func (h *sandboxHosts) set(exists func(ctx context.Context, id string) (bool, error)) {
	h.lookup.Store(&exists)
}

func (h *sandboxHosts) allow(ctx context.Context, host string) bool {
	id, _, ok := api.ExposedPort(host, h.domain)
	if !ok {
		return false
	}
	exists := h.lookup.Load()
	if exists == nil {
		return false
	}
	if _, miss := h.unknown.Get(id); miss {
		return false
	}
	found, err := (*exists)(ctx, id)
	if err == nil && !found {
		// Only a sure miss is remembered: a lookup that failed (the
		// database down, the handshake cut short) says nothing of it.
		h.unknown.Add(id, struct{}{})
	}
	return found
}

// newTLSSource prepares the HTTPS listener's certificates (nil when
// there is no HTTPS listener). It runs first thing at start: a bad
// certificate is refused before anything else is set up.
func newTLSSource(t config.TLS, domain string, hosts *sandboxHosts, logger *slog.Logger) (*tlscert.Source, error) {
	if !t.Enabled() {
		return nil, nil
	}
	src, err := tlscert.New(tlscert.Config{
		Domain: domain, CertFile: t.CertFile, KeyFile: t.KeyFile, CADir: t.CADir,
		ACMEDirectory: t.ACMEDirectory, ACMEEmail: t.ACMEEmail, ACMECAFile: t.ACMECAFile, ACMECacheDir: t.ACMECacheDir,
		IsSandboxHost: hosts.allow,
	}, logger.With("component", "tls"))
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	logTLS(src, domain, logger)
	return src, nil
}

// apiListeners opens the plain HTTP listener at addr and, with src, the
// HTTPS one at tlsAddr beside it: one handler, one set of timeouts, and
// one budget of maxConns connections drawn on by both.
func apiListeners(what, addr, tlsAddr string, src *tlscert.Source, h http.Handler, maxConns int, idle time.Duration,
	logger *slog.Logger) ([]*httpServer, error) {
	if src == nil {
		hs, err := newHTTPServer(what, addr, h, maxConns, idle, logger)
		if err != nil {
			return nil, err
		}
		return []*httpServer{hs}, nil
	}
	plain, err := newHTTPServer(what, addr, src.HTTPHandler(h), maxConns, idle, logger)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", tlsAddr)
	if err != nil {
		plain.listener.Close()
		return nil, fmt.Errorf("listen %s (TLS) on %s: %w", what, tlsAddr, err)
	}
	limiter := plain.listener.(*connLimiter)
	tc := src.TLSConfig()
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tc,
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       idle,
		ConnState:         limiter.ConnState,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	secure := &httpServer{what: what + " (TLS, " + src.Mode + ")", listener: tls.NewListener(limiter.share(l), tc),
		srv: srv, maxConns: maxConns}
	return []*httpServer{plain, secure}, nil
}

// logTLS says where the HTTPS listener's certificates come from, and
// warns of names clients will ask for that a fixed certificate misses.
func logTLS(src *tlscert.Source, domain string, logger *slog.Logger) {
	attrs := []any{"mode", src.Mode}
	if src.CAFile != "" {
		attrs = append(attrs, "ca", src.CAFile)
	}
	if src.Leaf != nil {
		attrs = append(attrs, "names", src.Leaf.DNSNames, "not_after", src.Leaf.NotAfter)
		if time.Now().After(src.Leaf.NotAfter) {
			logger.Warn("the TLS certificate has expired", "not_after", src.Leaf.NotAfter)
		}
	}
	logger.Info("TLS certificates", attrs...)
	if src.Mode != tlscert.ModeACME && domain != "" && !strings.Contains(domain, ".") {
		// Go accepts *.localhost; Node's and OpenSSL's checks (E2B's SDKs,
		// curl, Python) refuse a wildcard over a single label.
		logger.Warn("--domain has one label: Node, curl and Python refuse a wildcard certificate for *."+domain+
			", so https://<port>-<id>."+domain+" fails for them; use a domain of two labels, e.g. aenv."+domain, "domain", domain)
	}
	if missing := src.Uncovered(domain); len(missing) > 0 {
		logger.Warn("the TLS certificate does not cover names E2B's SDKs use with this --domain", "missing", missing)
	}
}

func closeListeners(servers []*httpServer) {
	for _, hs := range servers {
		hs.listener.Close()
	}
}

// logConsole says where the web console is (on the first API listener),
// or that this binary was built without it.
func logConsole(ctx context.Context, logger *slog.Logger, b *console.Bundle, servers []*httpServer) {
	if len(servers) == 0 {
		return
	}
	if !b.Built() {
		logger.WarnContext(ctx, "this aenv was built without its web console (make build bundles it)")
		return
	}
	addr := servers[0].listener.Addr().String()
	if host, port, err := net.SplitHostPort(addr); err == nil && (host == "::" || host == "0.0.0.0" || host == "") {
		addr = net.JoinHostPort("localhost", port)
	}
	logger.InfoContext(ctx, "web console", "url", "http://"+addr+console.Prefix+"/")
}
