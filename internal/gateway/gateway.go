// Package gateway is the front of a cluster: one API over many nodes. It
// places creates on nodes with room, routes every call that names a
// sandbox (control plane, envd traffic, signed file URLs, exposed ports)
// to the node holding it, and serves the records of the whole cluster
// from the shared PostgreSQL database. Gateways keep no state of their
// own: run as many as needed, behind any load balancer.
//
// Calls that name a sandbox are forwarded byte for byte: the node's API
// already speaks E2B's wire exactly, streams and terminals included, and a
// gateway re-encoding them could only lose fidelity.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/proxybody"
	"github.com/aenv-dev/aenv/internal/requestid"
	"github.com/aenv-dev/aenv/internal/secret"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/tracing"
	"github.com/aenv-dev/aenv/internal/usage"
)

// Config of a gateway.
type Config struct {
	// Domain of exposed ports (<port>-<sandboxID>.<domain>), as the
	// nodes'.
	Domain string
	// NodeTimeout: a node whose last heartbeat is older is unreachable.
	NodeTimeout time.Duration
	// Refresh is how often the node list is read (default: a fifth of
	// NodeTimeout).
	Refresh time.Duration
	// MaxJSONBytes bounds request bodies the gateway reads itself.
	MaxJSONBytes int64
	// ClusterSecret authenticates the gateway to nodes.
	ClusterSecret string
	// APIKey, when set, is accepted besides the cluster's keys in the
	// database (and added to them at start).
	APIKey string
	// Version of this gateway's release, named when a node's cluster
	// protocol is one it cannot work with.
	Version string
	// Tracer traces control-plane requests and passes their trace to the
	// nodes (traceparent); nil: tracing off.
	Tracer *tracing.Tracer
	// Audit records the changes asked through the gateway and serves GET
	// /audit; nil: no audit log.
	Audit *audit.Log
	// MoveVolumes lets a create move the volumes it names, when nothing
	// mounts them, to the node that takes the sandbox: when their own node
	// cannot take it, or when they are kept by several nodes.
	MoveVolumes bool
	// MoveIdle ends a volume move whose nodes make no progress for this
	// long (0: two minutes).
	MoveIdle time.Duration
	// Secrets keeps the users' secrets (/secrets) in the cluster's
	// database; nil: no such routes.
	Secrets *secret.Service
}

// Gateway is the HTTP handler of a gateway.
type Gateway struct {
	cfg    Config
	db     Store
	logger *slog.Logger
	nodes  *nodes
	routes *routeCache
	keys   *keyCache
	// templates remembers template copies for a moment; builds, the node
	// running each template's builds.
	templates *ttlCache[[]*store.Template]
	// unlimited remembers, for a second, the teams read without limits,
	// so that their creates cost the early check no read.
	unlimited *ttlCache[bool]
	builds    *ttlCache[string]
	catalog   http.Handler // the read routes, over the cluster's records
	// idem keeps the answers of creates and forks with an Idempotency-Key
	// in the database, for every gateway.
	idem *sharedIdempotency
	mux  *http.ServeMux
	// traced is mux, in a span per request when tracing is on.
	traced http.Handler
	proxy  *httputil.ReverseProxy
	// client makes the calls the gateway reads the answer of (creates,
	// which it may retry on another node).
	client *http.Client

	// queries counts database round trips made for requests; the node
	// list's refreshes count in refreshes (a fixed rate, whatever the load).
	queries, refreshes atomic.Int64

	// tokens finds the sandbox of a signed file URL (which names none).
	tokens *tokenSet
	// authFails slows down guessing keys and signatures, per address.
	authFails *api.AuthLimiter
	requests  *prometheus.CounterVec

	// runCtx ends at Close: the refresh loop and the moves carried out
	// after their answers (moves) stop then.
	runCtx context.Context
	stop   func()
	done   sync.WaitGroup
	moves  sync.WaitGroup
	// closing, once Close began, refuses new moves (trackMove).
	closeMu sync.Mutex
	closing bool
}

// New builds a gateway over the cluster's database and starts its node
// refresh; Close stops it. reg receives its metrics.
func New(ctx context.Context, cfg Config, db Store, logger *slog.Logger, reg prometheus.Registerer) (*Gateway, error) {
	if cfg.Refresh == 0 {
		cfg.Refresh = max(cfg.NodeTimeout/5, 50*time.Millisecond)
	}
	g := &Gateway{cfg: cfg, db: db, logger: logger, routes: newRouteCache(1 << 20),
		keys:      newKeyCache(db, keyConfirmTTL),
		authFails: api.NewAuthLimiter(), templates: newTTLCache[[]*store.Template](10 * time.Second),
		unlimited: newTTLCache[bool](time.Second),
		builds:    newTTLCache[string](5 * time.Second)}
	g.nodes = newNodes(db, cfg.NodeTimeout, &g.refreshes)
	g.tokens = newTokenSet(db, tokenReadGap, &g.queries)
	g.nodes.version, g.nodes.logger = cfg.Version, logger
	g.idem = &sharedIdempotency{db: db, logger: logger, queries: &g.queries, lease: idempotencyLease}
	transport := newTransport()
	g.client = &http.Client{Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	g.proxy = g.newProxy(transport)
	g.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "aenv_gateway_requests_total", Help: "Requests by how the gateway handled them.",
	}, []string{"route"})
	reg.MustRegister(g.requests, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "aenv_gateway_database_queries_total", Help: "Round trips to the cluster's database made for requests.",
	}, func() float64 { return float64(g.queries.Load()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "aenv_gateway_node_refreshes_total", Help: "Reads of the cluster's node list (one per refresh interval).",
	}, func() float64 { return float64(g.refreshes.Load()) }), newNodesCollector(g.nodes))

	if err := g.nodes.refresh(ctx); err != nil {
		return nil, fmt.Errorf("gateway: read nodes: %w", err)
	}
	// The teams' use by day, which the nodes write to the cluster's
	// database.
	ledger, _ := db.(usage.Ledger)
	g.catalog = api.NewCatalog(api.Config{MaxJSONBytes: cfg.MaxJSONBytes, Domain: cfg.Domain,
		// ServeHTTP checked the key and put who made the request in its
		// context.
		Authorize:     func(r *http.Request) (auth.Principal, bool) { return auth.FromContext(r.Context()) },
		Teams:         db,
		Audit:         cfg.Audit,
		Ledger:        ledger,
		VolumeRecords: db,
		Secrets:       cfg.Secrets,
		Building:      g.nodes.building,
	}, &catalog{g: g}, logger, reg)
	g.routeMux()
	g.traced = cfg.Tracer.Handler(g.mux)

	g.runCtx, g.stop = context.WithCancel(context.WithoutCancel(ctx))
	// The reads that requests share end when the gateway closes.
	g.nodes.rereads.base, g.tokens.reads.base = g.runCtx, g.runCtx
	g.done.Add(1)
	go g.refreshLoop(g.runCtx)
	return g, nil
}

// newTransport is the gateway's pool of connections to the nodes.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
}

// newProxy is the reverse proxy that forwards calls to nodes (see
// forwardNode).
func (g *Gateway) newProxy(transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:   g.rewrite,
		Transport: transport,
		// Streams (commands, terminals, watches) reach the client frame by
		// frame.
		FlushInterval: -1,
		ErrorHandler:  g.upstreamError,
		// A node that answers a sandbox is not there (gone, or moved to
		// another node while this route was cached) drops the route: the
		// next call reads where it is now.
		ModifyResponse: func(resp *http.Response) error {
			proxybody.EndsEarly(resp)
			// The answer already names the request's ID (the node echoes
			// the same one): copied, it would be there twice.
			if requestid.FromContext(resp.Request.Context()) != "" {
				resp.Header.Del(requestid.Header)
			}
			t, _ := resp.Request.Context().Value(targetKey{}).(target)
			if t.sandbox != "" && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusBadGateway) {
				g.routes.forget(t.sandbox)
			}
			return nil
		},
		// An answer cut mid-stream is only ever reported here.
		ErrorLog: slog.NewLogLogger(g.logger.Handler(), slog.LevelWarn),
	}
}

// Close stops the node refresh.
func (g *Gateway) Close() {
	g.closeMu.Lock()
	g.closing = true
	g.closeMu.Unlock()
	g.stop()
	g.done.Wait()
	g.nodes.close()
	g.tokens.reads.close()
	g.moves.Wait() // each aborted, unless it ended first
}

func (g *Gateway) refreshLoop(ctx context.Context) {
	defer g.done.Done()
	t := time.NewTicker(g.cfg.Refresh)
	defer t.Stop()
	var failing bool
	lastClean := time.Now()
	lastPurge := time.Time{} // keys are purged at the first tick, then hourly
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(lastClean) >= cleanEvery {
			lastClean = time.Now()
			g.cleanIdempotency(ctx)
		}
		if time.Since(lastPurge) >= auth.PurgeEvery {
			lastPurge = time.Now()
			pctx, cancel := context.WithTimeout(ctx, g.cfg.NodeTimeout)
			auth.PurgeOldKeys(pctx, g.db, lastPurge, g.logger)
			cancel()
		}
		rctx, cancel := context.WithTimeout(ctx, g.cfg.NodeTimeout)
		err := g.nodes.refresh(rctx)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			g.logger.Warn("cannot read the cluster's nodes; routing by the last view", "err", err)
		case err == nil && failing:
			g.logger.Info("cluster database reachable again")
		}
		failing = err != nil
	}
}

func (g *Gateway) routeMux() {
	g.mux = http.NewServeMux()
	// The cluster's nodes are the operator's to see and manage.
	g.handle("GET /cluster/nodes", g.adminOnly(g.listNodes))
	g.handle("POST /cluster/nodes/{id}/drain", g.adminOnly(func(w http.ResponseWriter, r *http.Request) { g.drain(w, r, true) }))
	g.handle("POST /cluster/nodes/{id}/undrain", g.adminOnly(func(w http.ResponseWriter, r *http.Request) { g.drain(w, r, false) }))
	g.handle("DELETE /cluster/nodes/{id}", g.adminOnly(g.removeNode))

	g.handle("POST /sandboxes", g.idempotent(g.create))
	g.handle("POST /v2/sandboxes", g.idempotent(g.create))
	g.handle("/sandboxes/{id}/{rest...}", http.HandlerFunc(g.bySandbox))
	g.handle("DELETE /sandboxes/{id}", http.HandlerFunc(g.bySandbox))
	// Named, or the mux would redirect it to the subtree above.
	g.handle("GET /sandboxes/{id}", g.catalog)
	g.handle("GET /sandboxes/metrics", http.HandlerFunc(g.sandboxMetrics))
	g.handle("POST /v2/sandboxes/{id}/connect", http.HandlerFunc(g.bySandbox))
	g.handle("GET /v2/sandboxes/{id}/logs", http.HandlerFunc(g.bySandbox))
	g.handle("POST /snapshots/{id}/fork", g.idempotent(g.forkSnapshot))
	g.handle("POST /templates", http.HandlerFunc(g.createTemplate))
	g.handle("DELETE /templates/{id}", http.HandlerFunc(g.deleteTemplate))

	g.handle("POST /v3/templates", http.HandlerFunc(g.requestBuild))
	g.handle("GET /templates/{templateID}/files/{hash}", http.HandlerFunc(g.byBuild))
	g.handle("POST /v2/templates/{templateID}/builds/{buildID}", http.HandlerFunc(g.byBuild))
	g.handle("GET /templates/{templateID}/builds/{buildID}/status", http.HandlerFunc(g.byBuild))
	g.handle("GET /templates/{templateID}/builds", http.HandlerFunc(g.byBuild))
	g.handle("POST /templates/tags", http.HandlerFunc(g.tags))
	g.handle("DELETE /templates/tags", http.HandlerFunc(g.tags))
	g.handle("GET /templates/{templateID}/tags", http.HandlerFunc(g.tags))

	g.handle("POST /volumes", http.HandlerFunc(g.createVolume))
	g.handle("GET /volumes/{volumeID}", http.HandlerFunc(g.byVolume))
	g.handle("DELETE /volumes/{volumeID}", http.HandlerFunc(g.byVolume))
	g.handle("POST /volumes/{volumeID}/move", http.HandlerFunc(g.moveVolume))

	// Everything else reads records: the catalog serves it (and answers
	// unknown paths with the API's 404).
	g.mux.Handle("/", g.catalog)
}

// handle registers a route of the gateway's own. A change through it is
// recorded in the audit log here; the catalog's routes record their own.
func (g *Gateway) handle(pattern string, h http.Handler) {
	g.mux.Handle(pattern, g.cfg.Audit.Middleware(pattern, h))
}

// ServeHTTP gives the request its ID (see requestid), which the nodes it
// is forwarded to log and answer with too, and serves it. Traffic to a
// sandbox's exposed port is its application's: it passes untouched.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := api.ExposedPort(r.Host, g.cfg.Domain); ok {
		g.serve(w, r)
		return
	}
	requestid.Middleware(http.HandlerFunc(g.serve)).ServeHTTP(w, r)
}

// serve routes envd traffic and exposed ports by sandbox, answers health
// checks, and sends the control plane (with a valid API key) through the
// mux.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	if id, _, ok := api.ExposedPort(r.Host, g.cfg.Domain); ok {
		g.count("exposed-port")
		g.forwardSandbox(w, r, id, false)
		return
	}
	if api.IsEnvdTraffic(r) {
		g.count("envd")
		g.envd(w, r)
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}` + "\n"))
		return
	case strings.HasPrefix(r.URL.Path, "/volumecontent/"):
		// Its calls bear the volume's token, not an API key.
		g.count("volume-content")
		g.volumeContent(w, r)
		return
	case r.Method == http.MethodPut && len(r.URL.Path) > len("/build-uploads/") &&
		r.URL.Path[:len("/build-uploads/")] == "/build-uploads/":
		// Signed by the node that made the link, which the link names.
		g.count("build-upload")
		g.forwardNode(w, r, r.URL.Query().Get("node"), "", false)
		return
	}
	p, ok := g.authorize(w, r)
	if !ok {
		return
	}
	g.traced.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
}

func (g *Gateway) count(route string) { g.requests.WithLabelValues(route).Inc() }

// envd routes envd traffic: by E2b-Sandbox-Id, or for a signed file URL
// by the sandbox whose token made the signature.
func (g *Gateway) envd(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(api.HeaderSandboxID)
	if id == "" {
		var ok bool
		if id, ok = g.signer(w, r); !ok {
			return
		}
		// The node need not search again; envd checks the signature.
		r.Header.Set(api.HeaderSandboxID, id)
	}
	g.forwardSandbox(w, r, id, false)
}

// signer finds the running sandbox whose envd token signed r's file URL,
// or answers r: 401 for a signature no running sandbox made (or one that
// cannot be valid: malformed, expired), 429 once its address has sent too
// many. Valid signatures of known sandboxes cost no database round trip.
func (g *Gateway) signer(w http.ResponseWriter, r *http.Request) (string, bool) {
	refuse := func() (string, bool) {
		g.authFails.Failed(r)
		g.refuse(w, r, errdefs.ErrUnauthenticated, "invalid or expired signature")
		return "", false
	}
	if !api.SignaturePlausible(r) {
		return refuse()
	}
	if api.SignatureExpired(r, time.Now()) {
		// Refused without a lookup, in envd's words.
		g.authFails.Failed(r)
		g.refuse(w, r, errdefs.ErrUnauthenticated, api.ExpiredSignatureMessage)
		return "", false
	}
	// A URL signed by a running sandbox whose token is held passes even
	// from an address that failed too often, as a known key does: one
	// client's bad URLs must not lock out its good ones. A URL refused a
	// moment ago is refused again before the search among the tokens.
	arrived := time.Now()
	u := readSignedRequest(r)
	if g.tokens.missed(u) {
		return refuse()
	}
	if id := g.tokens.match(u); id != "" {
		return id, true
	}
	if retry, blocked := g.authFails.Blocked(r); blocked {
		api.WriteTooManyAuthFailures(w, retry)
		return "", false
	}
	id, err := g.tokens.signer(r.Context(), u, arrived)
	if err != nil {
		g.databaseDown(w, r, err)
		return "", false
	}
	if id == "" {
		return refuse()
	}
	return id, true
}

// bySandbox forwards a control-plane call to the node holding the
// sandbox its path names.
func (g *Gateway) bySandbox(w http.ResponseWriter, r *http.Request) {
	g.count("sandbox")
	if k := r.Header.Get(api.HeaderIdempotencyKey); k != "" && len(k) <= 256 {
		// A fork of a sandbox is made by the one node holding it, which
		// keeps its answer: it is sent a key of this caller's only, so
		// that two callers' keys never meet there (a key too long is
		// left for the node to refuse).
		scope := api.IdempotencyScope(r)
		r.Header.Set(api.HeaderIdempotencyKey, hex.EncodeToString(scope[:]))
	}
	g.forwardSandbox(w, r, r.PathValue("id"), true)
}

// forwardSandbox forwards r to the node holding sandbox id.
func (g *Gateway) forwardSandbox(w http.ResponseWriter, r *http.Request, id string, controlPlane bool) {
	nodeID, err := g.nodeOf(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if controlPlane {
			g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", id))
		} else {
			api.WriteSandboxGone(w, id)
		}
		return
	case err != nil:
		g.databaseDown(w, r, err)
		return
	}
	if controlPlane && r.Method == http.MethodDelete {
		// The record goes with the sandbox; so does the route.
		defer g.routes.forget(id)
	}
	if controlPlane && resumesSandbox(r) {
		if n, ok := g.nodes.current().get(nodeID); !ok || !n.reachable {
			g.takeOver(w, r, id, nodeID)
			return
		}
	}
	g.forwardNode(w, r, nodeID, id, controlPlane)
}

// SandboxExists says whether the cluster has sandbox id (the ACME host
// policy asks, before ordering a certificate for one of its hosts). An
// error means it could not tell (the database is down).
func (g *Gateway) SandboxExists(ctx context.Context, id string) (bool, error) {
	_, err := g.nodeOf(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// nodeOf returns the node holding sandbox id: from the cache, else from
// the database. A sandbox moves only when its node is gone (a sandbox
// paused to disk resumed elsewhere, see takeOver), so a cached route stays
// right while its node lives, and a stale one reaches the node that held
// it, which answers that it is gone.
func (g *Gateway) nodeOf(ctx context.Context, id string) (string, error) {
	if n, ok := g.routes.get(id); ok {
		return n, nil
	}
	g.queries.Add(1)
	n, err := g.db.SandboxNode(ctx, id)
	if err != nil {
		return "", err
	}
	g.routes.put(id, n)
	return n, nil
}

// targetKey carries where a forwarded request goes.
type targetKey struct{}

type target struct {
	node, addr, sandbox string
	controlPlane        bool
}

// forwardNode forwards r unchanged to node nodeID (control-plane calls
// with the cluster secret in place of the user's key).
func (g *Gateway) forwardNode(w http.ResponseWriter, r *http.Request, nodeID, sandboxID string, controlPlane bool) {
	n, ok := g.nodes.current().get(nodeID)
	if !ok || !n.reachable {
		n, ok = g.nodes.recheck(r.Context()).get(nodeID)
	}
	switch {
	case !ok:
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf("node %q is not part of the cluster", nodeID))
		return
	case !n.reachable:
		if controlPlane && sandboxID != "" && g.hidden(r, sandboxID) {
			g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", sandboxID))
			return
		}
		msg := fmt.Sprintf("node %s is unreachable (no heartbeat for %s)", nodeID, n.HeartbeatAge.Round(time.Second))
		if sandboxID != "" {
			msg = fmt.Sprintf("sandbox %s is on node %s, which is unreachable (no heartbeat for %s)",
				sandboxID, nodeID, n.HeartbeatAge.Round(time.Second))
		}
		g.refuse(w, r, errdefs.ErrUnavailable, msg)
		return
	case controlPlane && !g.keepsTeams(r, n):
		g.refuse(w, r, errdefs.ErrUnavailable, tooOldForTeams(n))
		return
	}
	// Full duplex, for every call: by default Go's HTTP/1 server reads
	// what is left of a request body, and closes it, when the answer
	// starts. The transport sends the body to the node from a goroutine
	// of its own, which may not have seen the body's end by then (the
	// node answers as soon as it has the bytes): its next read fails on
	// the closed body, the transport drops the node's connection, and the
	// answer being streamed from it is cut (a command's or a terminal's
	// last frames). A body still arriving would hold the answer back.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		g.logger.DebugContext(r.Context(), "full duplex unavailable", "err", err)
	}
	t := target{node: nodeID, addr: n.Address, sandbox: sandboxID, controlPlane: controlPlane}
	ctx, span := tracing.ChildClient(r.Context(), "forward to node", tracing.NodeID.String(nodeID),
		tracing.SandboxID.String(sandboxID))
	defer span.End()
	g.proxy.ServeHTTP(w, proxybody.KeepBody(r.WithContext(context.WithValue(ctx, targetKey{}, t))))
}

func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(targetKey{}).(target)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = t.addr
	// Exposed ports are named by the Host, and upload links are made from
	// it: the node sees what the client asked for.
	pr.Out.Host = pr.In.Host
	// Links the node hands back (upload links) keep the scheme the client
	// used to reach this gateway (or, behind a proxy of the operator's,
	// the one that proxy says; a client can only mislead itself with it).
	pr.Out.Header.Set(api.HeaderForwardedProto, api.RequestScheme(pr.In))
	// The node's spans join this request's trace (a request not traced
	// here keeps the caller's traceparent, if any).
	g.cfg.Tracer.Inject(pr.In.Context(), pr.Out.Header)
	if t.controlPlane {
		pr.Out.Header.Del("Authorization")
		pr.Out.Header.Set("X-API-Key", g.cfg.ClusterSecret)
		g.actAs(pr.In, pr.Out.Header)
		return
	}
	// Envd traffic and exposed ports end in a sandbox: no key of the
	// cluster's goes there (the node strips its own again).
	port := node.EnvdPort
	if t.sandbox == "" {
		// The node's own (a volume's content, a build's upload): only
		// the cluster's keys are kept from it; a volume's token goes on.
		port = 0
	} else if _, p, ok := api.ExposedPort(pr.In.Host, g.cfg.Domain); ok {
		port = p
	} else if v := pr.In.Header.Get(api.HeaderSandboxPort); v != "" {
		port, _ = strconv.Atoi(v)
	}
	api.StripCredentials(pr.Out.Header, port, g.isKey)
}

// isKey tells whether key is one of the cluster's credentials as far as
// the gateway knows without asking the database: its --api-key, the
// cluster secret, or a key confirmed lately.
func (g *Gateway) isKey(key string) bool {
	if key == "" || len(key) > api.MaxKeyBytes {
		return false
	}
	if auth.LooksLikeKey(key) {
		return true
	}
	for _, k := range []string{g.cfg.APIKey, g.cfg.ClusterSecret} {
		if k != "" && subtle.ConstantTimeCompare([]byte(key), []byte(k)) == 1 {
			return true
		}
	}
	if g.keys == nil {
		return false
	}
	_, seen := g.keys.valid.Get(sha256.Sum256([]byte(key)))
	return seen
}

// hidden reports whether sandbox id is another team's than r's caller's
// (or gone): the node that would say so cannot be asked, so the gateway
// reads the record itself rather than tell the caller the sandbox exists.
func (g *Gateway) hidden(r *http.Request, id string) bool {
	p := callerOf(r)
	if p.Admin {
		return false
	}
	g.queries.Add(1)
	sb, err := g.db.GetSandbox(r.Context(), id)
	return errors.Is(err, store.ErrNotFound) || (err == nil && !p.Sees(sb.TeamID))
}

// keepsTeams reports whether node n may serve r's caller: an admin's
// calls go anywhere, a team's only to nodes that keep sandboxes in teams
// (an older node would act for it as the operator).
func (g *Gateway) keepsTeams(r *http.Request, n *nodeState) bool {
	p := callerOf(r)
	return p.Admin || cluster.SpeaksTeams(n.Protocol)
}

func tooOldForTeams(n *nodeState) string {
	return fmt.Sprintf("node %s runs aenv %s (cluster protocol %d), which does not keep teams apart: a team's key cannot use it until it is upgraded",
		n.ID, n.Version, n.Protocol)
}

// adminOnly lets through only an admin's requests.
func (g *Gateway) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p := callerOf(r); !p.Admin {
			g.refuse(w, r, errdefs.ErrPermissionDenied, "only an admin key may do this")
			return
		}
		h(w, r)
	}
}

// actAs makes a call to a node, made with the cluster secret, act for the
// team of the caller of in.
func (g *Gateway) actAs(in *http.Request, h http.Header) {
	api.SetTeamHeaders(h, callerOf(in))
}

// callerOf is who r is made by: every request the gateway serves passed
// authorize, which put its caller in its context; one without (the
// gateway's own calls) is the operator's.
func callerOf(r *http.Request) auth.Principal {
	if p, ok := auth.FromContext(r.Context()); ok {
		return p
	}
	return auth.Operator()
}

// upstreamError answers a forwarded request its node did not take.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	defer proxybody.EndBody(w, r)
	if r.Context().Err() != nil {
		return // the client left
	}
	t, _ := r.Context().Value(targetKey{}).(target)
	g.logger.WarnContext(r.Context(), "node did not answer", "node", t.node, "sandbox", t.sandbox, "err", err)
	msg := fmt.Sprintf("node %s did not answer: %v", t.node, err)
	if t.sandbox != "" {
		msg = fmt.Sprintf("sandbox %s is on node %s, which did not answer: %v", t.sandbox, t.node, err)
	}
	g.refuse(w, r, errdefs.ErrUnavailable, msg)
}

func (g *Gateway) databaseDown(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	g.logger.WarnContext(r.Context(), "cluster database unavailable", "err", err)
	g.refuse(w, r, errdefs.ErrUnavailable, "the cluster's database is unavailable; try again")
}

// routeCache maps sandbox IDs to nodes. Bounded: when full it starts
// over (routes are re-read from the database on a miss).
type routeCache struct {
	mu    sync.RWMutex
	m     map[string]string
	limit int
}

func newRouteCache(limit int) *routeCache {
	return &routeCache{m: map[string]string{}, limit: limit}
}

func (c *routeCache) get(id string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.m[id]
	return n, ok
}

func (c *routeCache) put(id, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.limit {
		clear(c.m)
	}
	c.m[id] = node
}

func (c *routeCache) forget(id string) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}

// RequireKey lets through only requests carrying one of the cluster's API
// keys.
func (g *Gateway) RequireKey(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := g.authorize(w, r); ok {
			h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
		}
	})
}

// refuse answers a request the gateway itself does not take, with the
// status of kind (the API's one mapper) and msg as the message.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, kind error, msg string) {
	api.WriteError(w, r, g.logger, errdefs.Errorf(kind, "%s", msg))
}
