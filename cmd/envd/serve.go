package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/codeinterp"
	"github.com/aenv-dev/aenv/internal/envd"
)

// shutdownGrace bounds how long open streams may keep envd alive on SIGTERM.
const shutdownGrace = 3 * time.Second

// runServe serves the envd protocol until ctx is done; the processes it
// starts go through children.
func runServe(ctx context.Context, opts options, children *envd.Reaper, log *slog.Logger) error {
	cfg := envd.Config{
		Logger:      log,
		DefaultUser: opts.defaultUser,
		PasswdPath:  opts.passwdPath,
		GroupPath:   opts.groupPath,
		Children:    children,
	}
	// The code interpreter is served where the template asks for it; its
	// default kernel starts at /init, once the user and env vars are known.
	var ci *codeinterp.Service
	_, markerErr := os.Stat(codeinterp.MarkerFile)
	if markerErr == nil {
		cfg.OnInit = func(reseed bool) {
			if reseed {
				ci.Reseed()
			}
			ci.Warm()
		}
	}
	srv := envd.New(cfg)
	defer srv.Close()
	if markerErr == nil {
		ci = codeinterp.New(codeinterp.Config{
			Logger: log.With("component", "code-interpreter"),
			Prepare: func(cmd *exec.Cmd, cwd string) error {
				return srv.PrepareKernel(cmd, cwd, nil)
			},
			Token:    srv.AccessToken,
			Env:      srv.Env,
			Children: children,
		})
		defer ci.Close()
		ciAddr := net.JoinHostPort(opts.listenAddr, strconv.Itoa(codeinterp.Port))
		var lc net.ListenConfig
		ciLn, err := lc.Listen(ctx, "tcp", ciAddr)
		if err != nil {
			return fmt.Errorf("code interpreter: listen %s: %w", ciAddr, err)
		}
		ciSrv := &http.Server{Handler: ci.Handler(), ReadHeaderTimeout: 30 * time.Second}
		defer ciSrv.Close()
		go func() {
			if err := ciSrv.Serve(ciLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("code interpreter stopped serving", "err", err)
			}
		}()
		log.Info("code interpreter serving", "addr", ciAddr)
	}
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
