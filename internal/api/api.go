// Package api serves the HTTP control plane (E2B's endpoints and the
// seed's), and proxies envd traffic to sandboxes on the same port.
package api

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/api/openapi"
	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/secret"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/tracing"
	"github.com/aenv-dev/aenv/internal/usage"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

// EnvdVersion is the envd protocol level aenv's envd implements, reported
// to SDKs; the E2B SDK gates features on it (0.6.4 enables all of them).
const EnvdVersion = "0.6.4"

// Config of the API.
type Config struct {
	APIKey       string
	MaxJSONBytes int64 // limit of JSON request bodies
	MaxFileBytes int64 // limit of raw file uploads
	// DefaultExecTimeout applies to /execute without a timeout.
	DefaultExecTimeout time.Duration
	MaxExecTimeout     time.Duration
	// ExecOutputBudget bounds the command output all /execute calls hold
	// at once, in bytes (0: DefaultExecOutputBudget); calls past it wait.
	ExecOutputBudget int64
	// MaxSandboxTimeout bounds the lifetime a request may ask for; larger
	// values are refused before any arithmetic can overflow.
	MaxSandboxTimeout time.Duration
	// Domain of exposed ports: <port>-<sandboxID>.<Domain> reaches port
	// inside the sandbox (E2B's getHost).
	Domain string
	// Usage is the sampled history GET /sandboxes/{id}/metrics serves;
	// nil serves one sample taken at the request.
	Usage *usage.History
	// Builds runs E2B template builds; nil leaves their routes out.
	Builds *build.Service
	// Building reports the template builds under way: this node's, or a
	// gateway's nodes' as their heartbeats publish them; GET /templates
	// lists a template whose first build runs. nil: none.
	Building func() []store.BuildProgress
	// NodeID is this node's ID in a cluster ("" on a single server):
	// sandbox records carry it, and build upload links name it so that a
	// gateway routes the upload here.
	NodeID string
	// NodeInfo, when set, reports the node's capacity and use (GET /node).
	NodeInfo func() NodeInfo
	// Authorize, when set, decides which requests carry a valid API key,
	// and who they are made by, instead of comparing with APIKey and
	// looking in Teams (a gateway checks the cluster's keys).
	Authorize func(r *http.Request) (auth.Principal, bool)
	// Teams keeps teams and API keys (internal/auth); nil: APIKey is the
	// only key and there are no team routes.
	Teams auth.Store
	// Idempotency keeps the answers of creates and forks that carried an
	// Idempotency-Key; nil keeps them in this process's memory.
	Idempotency IdempotencyStore
	// Tracer gives each control-plane request a span, continuing the
	// caller's trace (a gateway's); nil: tracing off.
	Tracer *tracing.Tracer
	// Audit records the changes asked through the routes and serves GET
	// /audit; nil: no audit log.
	Audit *audit.Log
	// Ledger keeps the teams' use by day, which GET /usage serves; nil:
	// no such route.
	Ledger usage.Ledger
	// Volumes keeps the node's volumes (E2B's /volumes and content API);
	// nil: no such routes.
	Volumes *volume.Service
	// VolumeRecords lists volumes' records, for the team routes (a
	// gateway's, which serves no volume itself); nil: none.
	VolumeRecords VolumeLister
	// Secrets keeps the users' secrets (E2B's /secrets); nil: no such
	// routes.
	Secrets *secret.Service
}

// VolumeLister lists team's volumes, every team's for "".
type VolumeLister interface {
	ListVolumes(ctx context.Context, team string) ([]*store.Volume, error)
}

// Server is the HTTP handler of a node.
type Server struct {
	cfg       Config
	sandboxes node.Node
	catalog   node.Catalog // sandboxes, or a gateway's view of a cluster
	logger    *slog.Logger
	mux       *http.ServeMux
	proxy     *envdProxy
	requests  *prometheus.HistogramVec
	idem      IdempotencyStore
	// authFails slows down guessing the key, per client address.
	authFails *AuthLimiter
	// execOutput is what /execute calls may hold of their output.
	execOutput *outputBudget
	// keyUses says when a key's last-used time is due to be written.
	keyUses *auth.UseRecorder
}

// New builds the handler. reg receives the API's metrics.
func New(cfg Config, sandboxes node.Node, logger *slog.Logger,
	reg prometheus.Registerer, metrics http.Handler) *Server {
	s := newServer(cfg, sandboxes, logger, reg)
	s.proxy = newEnvdProxy(sandboxes, s.isKey, logger)

	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, wire.Health{Status: wire.HealthStatusOk})
	})
	// The API's own description, for generating clients; public, as the
	// E2B SDK's own copy of it is.
	s.mux.HandleFunc("GET /openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(openapi.Document)
	})
	// Metrics label every live sandbox by ID: the key guards them here
	// (Prometheus sends it as a bearer token); operators who want an
	// unauthenticated scrape bind --metrics-listen to a private address.
	s.mux.Handle("GET /metrics", s.requireKey(s.adminOnly(metrics)))

	for _, prefix := range []string{"", "/v2"} {
		s.route("POST "+prefix+"/sandboxes", s.idempotent(s.createSandbox))
	}
	s.routeCatalog()
	s.route("DELETE /sandboxes/{id}", s.killSandbox)
	s.route("POST /sandboxes/{id}/timeout", s.setTimeout)
	s.route("GET /sandboxes/{id}/metrics", s.sandboxMetrics)
	s.route("GET /sandboxes/metrics", s.batchMetrics)
	s.route("GET /sandboxes/{id}/egress", s.sandboxEgress)
	s.route("GET /sandboxes/{id}/logs", s.sandboxLogs)
	s.route("GET /v2/sandboxes/{id}/logs", s.sandboxLogsV2)
	s.route("POST /sandboxes/{id}/execute", s.execute)
	s.route("POST /sandboxes/{id}/files/write", s.writeFileJSON)
	s.route("GET /sandboxes/{id}/files/read", s.readFileJSON)
	s.route("PUT /sandboxes/{id}/files", s.writeFileRaw)
	s.route("GET /sandboxes/{id}/files", s.readFileRaw)

	s.route("PUT /sandboxes/{id}/network", s.updateNetwork)
	s.route("POST /sandboxes/{id}/pause", s.pauseSandbox)
	s.route("POST /sandboxes/{id}/resume", s.resumeSandbox)
	s.route("POST /v2/sandboxes/{id}/connect", s.connectSandbox)
	s.route("POST /sandboxes/{id}/connect", s.connectSandbox)
	s.route("POST /sandboxes/{id}/fork", s.idempotent(s.forkSandbox))
	s.route("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	s.route("POST /snapshots/{id}/fork", s.idempotent(s.forkSnapshot))
	s.route("POST /templates", s.createTemplate)
	s.route("DELETE /templates/{id}", s.deleteTemplate)
	s.routeBuilds()
	if cfg.NodeInfo != nil {
		s.route("GET /node", s.getNode)
	}
	s.routeTeams()
	s.routeAudit()
	s.routeUsage()
	s.routeVolumes()
	s.routeSecrets()

	s.routeUnknown()
	return s
}

// NewCatalog builds the handler of the read-only routes (sandbox and
// template records) over a catalog: what a cluster gateway serves itself.
// Every other path answers 404; requests go through cfg.Authorize.
func NewCatalog(cfg Config, catalog node.Catalog, logger *slog.Logger, reg prometheus.Registerer) *Server {
	s := newServer(cfg, nil, logger, reg)
	s.catalog = catalog
	s.routeCatalog()
	s.routeTeams()
	s.routeAudit()
	s.routeUsage()
	if cfg.VolumeRecords != nil {
		s.route("GET /volumes", s.listVolumes)
	}
	s.routeSecrets()
	s.routeUnknown()
	return s
}

func newServer(cfg Config, sandboxes node.Node, logger *slog.Logger, reg prometheus.Registerer) *Server {
	s := &Server{cfg: cfg, sandboxes: sandboxes, catalog: sandboxes, logger: logger, mux: http.NewServeMux(),
		idem: cfg.Idempotency, authFails: NewAuthLimiter(), execOutput: newOutputBudget(cfg.ExecOutputBudget),
		keyUses: auth.NewUseRecorder(time.Minute, 4096)}
	if s.idem == nil {
		s.idem = newIdempotency()
	}
	s.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "aenv_api_request_duration_seconds",
		Help:    "Control-plane request latency by route and status.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"route", "code"})
	reg.MustRegister(s.requests)
	return s
}

// routeCatalog registers the routes that only read records.
func (s *Server) routeCatalog() {
	for _, prefix := range []string{"", "/v2"} {
		s.route("GET "+prefix+"/sandboxes", s.listSandboxes)
	}
	s.route("GET /sandboxes/{id}", s.getSandbox)
	s.route("GET /snapshots", s.listSnapshots)
	s.route("GET /snapshots/{id}", s.getSnapshot)
	s.route("GET /templates", s.listTemplates)
	s.route("GET /templates/{id}", s.getTemplate)
	s.route("GET /templates/aliases/{alias}", s.getTemplateAlias)
}

// routeUnknown gives unknown paths the JSON error shape too.
func (s *Server) routeUnknown() {
	s.route("/", func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{http.StatusNotFound, "no such endpoint: " + r.Method + " " + r.URL.Path}
	})
}

// route registers an authenticated control-plane handler; a route that
// names an object by ID finds only the caller's team's (see scoped).
func (s *Server) route(pattern string, h func(http.ResponseWriter, *http.Request) error) {
	h = s.scoped(pattern, h)
	s.mux.Handle(pattern, s.requireKey(s.cfg.Audit.Middleware(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, s.logger, err)
		}
	}))))
}

// requireKey lets through only requests carrying a valid API key, with
// who made them in their context (auth.FromContext).
func (s *Server) requireKey(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok, err := s.authorized(r)
		if err != nil {
			writeError(w, r, s.logger, badRequest(err.Error()))
			return
		}
		if ok {
			h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
			return
		}
		if retry, blocked := s.authFails.Blocked(r); blocked {
			WriteTooManyAuthFailures(w, retry)
			return
		}
		if RequestKey(r) != "" {
			s.authFails.Failed(r) // a request without a key guesses nothing
		}
		writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized,
			Message: "missing or invalid API key (X-API-Key header)"})
	})
}

// adminOnly lets through only an admin's requests (what labels every
// team's sandboxes, such as metrics, is the operator's).
func (s *Server) adminOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !principal(r).Admin {
			writeError(w, r, s.logger, errAdminOnly)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// authorized finds who r is made by from its key, X-API-Key (E2B's SDKs)
// or a bearer token (what Prometheus and most HTTP tools send): the
// operator for the node's own key, else the team of a stored key. err is
// a malformed request (an admin's Aenv-Team header).
func (s *Server) authorized(r *http.Request) (auth.Principal, bool, error) {
	if s.cfg.Authorize != nil {
		p, ok := s.cfg.Authorize(r)
		return p, ok, nil
	}
	key := RequestKey(r)
	p, ok := auth.Operator(), s.isOperatorKey(key)
	if !ok {
		p, ok = s.keyPrincipal(r.Context(), key)
	}
	if !ok {
		return auth.Principal{}, false, nil
	}
	p, err := ActAs(r, p)
	return p, err == nil, err
}

// isOperatorKey tells whether key is the node's API key (or, on a node of
// a cluster, the cluster secret).
func (s *Server) isOperatorKey(key string) bool {
	return key != "" && len(key) <= MaxKeyBytes && subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) == 1
}

// isKey tells whether key is a credential of the API's, for proxies to
// strip on the way to a sandbox: the node's key, or anything shaped like
// a key aenv makes (checked without asking the database).
func (s *Server) isKey(key string) bool { return s.isOperatorKey(key) || auth.LooksLikeKey(key) }

// RequestKey is the API key a request carries: X-API-Key (E2B's SDKs) or
// a bearer token (what Prometheus and most HTTP tools send).
func RequestKey(r *http.Request) string {
	if key := r.Header.Get("X-API-Key"); key != "" {
		return key
	}
	return BearerToken(r)
}

// BearerToken is the token of r's Authorization: Bearer header, or "".
func BearerToken(r *http.Request) string {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(v)
}

// ServeHTTP routes envd traffic (marked by E2b-Sandbox-Id, or a signed file
// URL) to the sandbox and everything else to the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := s.exposedPort(r.Host); ok && s.proxy != nil {
		s.serveExposedPort(w, r, id, port)
		return
	}
	if IsEnvdTraffic(r) && s.proxy != nil {
		s.proxy.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	tracer := s.cfg.Tracer
	if tracer != nil {
		if _, ok, _ := s.authorized(r); !ok {
			tracer = nil // a caller without the key leaves no traces
		}
	}
	r, span := tracer.StartRequest(r)
	s.mux.ServeHTTP(rec, r)
	tracing.EndRequest(span, r.Pattern, rec.status)
	route := r.Pattern
	if route == "" {
		route = "unmatched"
	}
	s.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Observe(time.Since(start).Seconds())
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
