package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/envd"
)

// restartDelay keeps a crashing serve process from spinning.
const restartDelay = time.Second

// drainTimeout bounds the wait for a dead child's last settings. Its end of
// the socket closed when it exited, so the wait normally ends at once.
const drainTimeout = 5 * time.Second

// supervisor is the PID 1 loop: it runs `envd serve` as a child, restarts it
// when it dies, forwards SIGTERM/SIGINT to it and reaps every zombie that
// reparents to PID 1. It never uses os/exec, whose Wait would race with the
// wait4(-1) loop. It owns envd's listening socket and keeps the settings
// /init configured (see handover.go).
type supervisor struct {
	log         *slog.Logger
	opts        options
	listener    *os.File
	child       *os.Process
	terminating bool
	// drained is closed once the current child's settings socket has been
	// read to its end.
	drained chan struct{}

	mu    sync.Mutex
	state envd.State // the latest settings a child handed over
}

func superviseServe(opts options, log *slog.Logger) int {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	listener, err := listenFile(opts)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	s := &supervisor{log: log, opts: opts, listener: listener}
	if err := s.start(); err != nil {
		log.Error("start envd serve", "err", err)
		return 1
	}
	restart := make(chan struct{}, 1)
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				if code, done := s.reap(restart); done {
					return code
				}
				continue
			}
			s.log.Info("forwarding signal to envd serve", "signal", sig)
			s.terminating = true
			if s.child != nil {
				_ = s.child.Signal(sig)
			} else {
				return 0
			}
		case <-restart:
			if s.terminating {
				return 0
			}
			if err := s.start(); err != nil {
				s.log.Error("restart envd serve", "err", err)
				time.AfterFunc(restartDelay, func() { restart <- struct{}{} })
			}
		}
	}
}

// listenFile opens envd's listening socket as a file every serve child
// inherits.
func listenFile(opts options) (*os.File, error) {
	addr := net.JoinHostPort(opts.listenAddr, strconv.Itoa(opts.port))
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	// The file is a duplicate: closing ln leaves the socket listening.
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", addr, err)
	}
	return f, nil
}

func (s *supervisor) start() error {
	// The dead child's last hand-over must be in before the next child
	// gets the settings.
	if s.drained != nil {
		select {
		case <-s.drained:
		case <-time.After(drainTimeout):
			s.log.Warn("settings socket of the previous envd serve still open")
		}
	}
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		exe = os.Args[0]
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("settings socket: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "envd-state"), os.NewFile(uintptr(pair[1]), "envd-state-child")
	args := append([]string{os.Args[0]}, serveArgs(s.opts)...)
	files := make([]*os.File, childListenFD+1)
	files[0], files[1], files[2] = os.Stdin, os.Stdout, os.Stderr
	files[childStateFD], files[childListenFD] = theirs, s.listener
	p, err := os.StartProcess(exe, args, &os.ProcAttr{
		Env:   os.Environ(),
		Files: files,
		// Outside a sandbox (--init) nothing else would end the child
		// along with the init.
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	theirs.Close()
	if err != nil {
		mine.Close()
		return fmt.Errorf("start %s: %w", exe, err)
	}
	s.child = p
	s.drained = make(chan struct{})
	go s.converse(mine, s.settings(), s.drained)
	s.log.Info("started envd serve", "pid", p.Pid)
	return nil
}

func (s *supervisor) settings() envd.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// converse sends a child the settings it starts from, then keeps each
// settings it hands over until its end of the socket closes.
func (s *supervisor) converse(conn *os.File, initial envd.State, done chan<- struct{}) {
	defer close(done)
	defer conn.Close()
	if err := json.NewEncoder(conn).Encode(initial); err != nil {
		s.log.Error("send settings to envd serve", "err", err)
		return
	}
	dec := json.NewDecoder(conn)
	for {
		var state envd.State
		if err := dec.Decode(&state); err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Error("receive settings from envd serve", "err", err)
			}
			return
		}
		s.mu.Lock()
		s.state = state
		s.mu.Unlock()
	}
}

// reap collects every exited child. When the serve child is among them it
// schedules a restart, or reports done when envd is shutting down.
func (s *supervisor) reap(restart chan<- struct{}) (code int, done bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return 0, false
		}
		if s.child == nil || pid != s.child.Pid {
			continue
		}
		s.child = nil
		if s.terminating {
			return ws.ExitStatus(), true
		}
		s.log.Error("envd serve died, restarting", "pid", pid, "exitCode", ws.ExitStatus(), "signaled", ws.Signaled())
		time.AfterFunc(restartDelay, func() { restart <- struct{}{} })
	}
}
