// Package envd is the in-sandbox agent: the E2B envd protocol (Connect RPC
// process and filesystem services, /files, /health, /init, /envs, /metrics)
// as one http.Handler.
package envd

import (
	"log/slog"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/aenv-dev/aenv/api/envd/filesystem/filesystemconnect"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
)

// Config configures a Server.
type Config struct {
	// Logger receives envd's logs. Required.
	Logger *slog.Logger
	// DefaultUser runs requests that name no user until /init says
	// otherwise. Empty means root.
	DefaultUser string
	// ResolvConfPath is the file /init's nameservers replace; empty means
	// /etc/resolv.conf.
	ResolvConfPath string
	// PasswdPath and GroupPath locate the account files; empty means
	// /etc/passwd and /etc/group.
	PasswdPath string
	GroupPath  string
	// Children starts and waits for the processes envd runs. When envd is
	// the sandbox's init it is the Reaper that reaps orphans; nil: one of
	// envd's own that reaps nothing.
	Children *Reaper
	// OnInit, when set, is called after each successful /init: the code
	// interpreter starts its default kernel once the sandbox's user and
	// env vars are known. reseed is the request's Reseed.
	OnInit func(reseed bool)
}

// Server holds envd's state. Its zero value is not usable; call New.
type Server struct {
	log      *slog.Logger
	users    userDB
	settings *settings
	procs    *processService
	fs       *filesystemService
	cpu      *cpuSampler
	resolv   string // resolv.conf path /init rewrites
	children *Reaper
	onInit   func(reseed bool)
	// initMu orders /init calls: each checks the token and applies its
	// changes as one step.
	initMu sync.Mutex
}

// New builds a Server from cfg.
func New(cfg Config) *Server {
	users := userDB{passwdPath: cfg.PasswdPath, groupPath: cfg.GroupPath}
	if users.passwdPath == "" {
		users.passwdPath = "/etc/passwd"
	}
	if users.groupPath == "" {
		users.groupPath = "/etc/group"
	}
	s := &Server{
		log:      cfg.Logger,
		users:    users,
		settings: newSettings(cfg.DefaultUser),
		cpu:      &cpuSampler{},
		resolv:   cfg.ResolvConfPath,
		children: cfg.Children,
		onInit:   cfg.OnInit,
	}
	if s.children == nil {
		s.children = NewReaper()
	}
	s.procs = newProcessService(s)
	s.fs = newFilesystemService(s)
	return s
}

// Handler returns the HTTP handler serving the whole envd protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(s.procs, connect.WithCompressMinBytes(1<<62))
	mux.Handle(path, s.requireToken(h))
	path, h = filesystemconnect.NewFilesystemHandler(s.fs, connect.WithCompressMinBytes(1<<62))
	mux.Handle(path, s.requireToken(h))
	mux.HandleFunc("GET /health", handleHealth)
	mux.HandleFunc("POST /init", s.handleInit)
	mux.Handle("GET /envs", s.requireToken(http.HandlerFunc(s.handleEnvs)))
	mux.Handle("GET /metrics", s.requireToken(http.HandlerFunc(s.handleMetrics)))
	mux.HandleFunc("GET /files", s.handleFilesGet)
	mux.HandleFunc("POST /files", s.handleFilesPost)
	return mux
}

// Close kills every running process and stops every watcher.
func (s *Server) Close() {
	s.procs.killAll()
	s.fs.removeAll()
}
