package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/console"
	"github.com/aenv-dev/aenv/internal/gateway"
	"github.com/aenv-dev/aenv/internal/secret"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// RunGateway serves a cluster's API until ctx ends: it needs only the
// cluster's database, holds no state of its own, and may run anywhere
// the nodes can be reached from (root not needed).
func RunGateway(ctx context.Context, cfg config.Gateway, logger *slog.Logger) error {
	logger = requestLogger(logger)
	if err := cfg.Validate(); err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		logger.WarnContext(ctx, w)
	}
	consoleBundle, err := console.LoadBundle()
	if err != nil {
		return err
	}
	tracer, err := startTracing(ctx, cfg.Tracing.Config("aenv-gateway", cfg.Version), logger)
	if err != nil {
		return err
	}
	defer stopTracing(tracer, logger)
	hosts := newSandboxHosts(cfg.Domain)
	tlsSrc, err := newTLSSource(cfg.TLS, cfg.Domain, hosts, logger)
	if err != nil {
		return err
	}
	db, err := postgres.OpenWith(ctx, cfg.Database.URL, "", postgres.Options{SecretsKey: cfg.SecretsKey.Key})
	if err != nil {
		return err
	}
	defer db.Close()
	clusterSecret, err := db.ClusterSecret(ctx, cfg.ClusterSecret)
	if err != nil {
		return err
	}
	if err := ensureAPIKey(ctx, db, cfg.APIKey); err != nil {
		return err
	}

	auditLog, closeAudit, err := openAudit(cfg.Audit, db, logger)
	if err != nil {
		return err
	}
	defer closeAudit()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(auditLog.Collector())
	secrets, err := secret.NewService(db, cfg.SecretsKey.Key,
		secret.NoClusterKey)
	if err != nil {
		return err
	}
	g, err := gateway.New(ctx, gateway.Config{
		Domain: cfg.Domain, NodeTimeout: time.Duration(cfg.NodeTimeoutMS) * time.Millisecond,
		MaxJSONBytes: int64(cfg.MaxJSONBodyMB) << 20, ClusterSecret: clusterSecret, APIKey: cfg.APIKey,
		Version: cfg.Version, Tracer: tracer, Audit: auditLog, Secrets: secrets, MoveVolumes: cfg.MoveVolumes,
	}, db, logger.With("component", "gateway"), reg)
	if err != nil {
		return err
	}
	defer g.Close()
	hosts.set(g.SandboxExists)
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("GET /metrics", g.RequireKey(metrics))
	mux.Handle("/", console.New(consoleBundle, g, g, cfg.Domain))

	maxConns, err := autoMaxConns()
	if err != nil {
		return err
	}
	servers, err := apiListeners("gateway", cfg.Listen, cfg.TLS.Listen, tlsSrc, mux, maxConns,
		config.Seconds(cfg.IdleTimeoutSecs), logger)
	if err != nil {
		return err
	}
	serveErr := make(chan error, len(servers))
	for _, hs := range servers {
		go func() { serveErr <- hs.serve() }()
		logger.InfoContext(ctx, "aenv gateway listening", "addr", hs.listener.Addr().String(), "serves", hs.what,
			"max_connections", maxConns)
	}
	logConsole(ctx, logger, consoleBundle, servers)
	var served error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		served = fmt.Errorf("http server: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, hs := range servers {
		if err := hs.srv.Shutdown(shutdownCtx); err != nil {
			hs.srv.Close()
		}
	}
	if served != nil {
		return served
	}
	logger.Info("stopped")
	return nil
}

// ensureAPIKey adds the configured key to the cluster's, or makes and
// prints one when the cluster has none (as `aenv server` does on first
// start).
func ensureAPIKey(ctx context.Context, db *postgres.Store, configured string) error {
	if configured != "" {
		return db.AddAPIKey(ctx, configured)
	}
	n, err := db.CountAPIKeys(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	key, err := newAPIKey()
	if err != nil {
		return err
	}
	if err := db.AddAPIKey(ctx, key); err != nil {
		return errors.Join(errors.New("save the cluster's first API key"), err)
	}
	fmt.Fprintf(os.Stderr, "\nGenerated the cluster's first API key (kept, as a digest, in the database):\n\n    %s\n\n", key)
	return nil
}
