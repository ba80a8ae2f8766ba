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
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/codeinterp"
	"github.com/aenv-dev/aenv/internal/envd"
)

// shutdownGrace bounds how long open streams may keep envd alive on SIGTERM.
const shutdownGrace = 3 * time.Second

// runServe serves the envd protocol until ctx is done.
func runServe(ctx context.Context, opts options, log *slog.Logger) error {
	cfg := envd.Config{
		Logger:      log,
		DefaultUser: opts.defaultUser,
		PasswdPath:  opts.passwdPath,
		GroupPath:   opts.groupPath,
	}
	if opts.stateFD > 0 {
		// Under the init: take back what /init configured before a restart,
		// or refuse to serve at all rather than serve without the token.
		conn, state, err := openStateConn(opts.stateFD, stateReceiveTimeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		cfg.State = &state
		cfg.HandOver = conn.send
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
			Token: srv.AccessToken,
			Env:   srv.Env,
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
	ln, addr, err := serveListener(ctx, opts)
	if err != nil {
		return err
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

// serveListener is the inherited listener when the init passed one, else a
// new one on the configured address.
func serveListener(ctx context.Context, opts options) (net.Listener, string, error) {
	if opts.listenFD > 0 {
		syscall.CloseOnExec(opts.listenFD)
		f := os.NewFile(uintptr(opts.listenFD), "envd-listener")
		defer f.Close() // FileListener holds its own duplicate
		ln, err := net.FileListener(f)
		if err != nil {
			return nil, "", fmt.Errorf("inherited listener fd %d: %w", opts.listenFD, err)
		}
		return ln, ln.Addr().String(), nil
	}
	addr := net.JoinHostPort(opts.listenAddr, strconv.Itoa(opts.port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen %s: %w", addr, err)
	}
	return ln, addr, nil
}
