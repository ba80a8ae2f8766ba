package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/envd"
)

// shutdownGrace bounds how long open streams may keep envd alive on SIGTERM.
const shutdownGrace = 3 * time.Second

// runServe serves the envd protocol until ctx is done.
func runServe(ctx context.Context, opts options, log *slog.Logger) error {
	srv := envd.New(envd.Config{Logger: log, DefaultUser: opts.defaultUser})
	defer srv.Close()
	addr := net.JoinHostPort(opts.listenAddr, strconv.Itoa(opts.port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("envd serving", "addr", addr)
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	log.Info("envd shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
