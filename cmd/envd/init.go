package main

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// restartDelay keeps a crashing serve process from spinning.
const restartDelay = time.Second

// supervisor is the PID 1 loop: it runs `envd serve` as a child, restarts it
// when it dies, forwards SIGTERM/SIGINT to it and reaps every zombie that
// reparents to PID 1. It never uses os/exec, whose Wait would race with the
// wait4(-1) loop.
type supervisor struct {
	log         *slog.Logger
	opts        options
	child       *os.Process
	terminating bool
}

func superviseServe(opts options, log *slog.Logger) int {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	s := &supervisor{log: log, opts: opts}
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

func (s *supervisor) start() error {
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		exe = os.Args[0]
	}
	args := append([]string{os.Args[0]}, serveArgs(s.opts)...)
	p, err := os.StartProcess(exe, args, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		return err
	}
	s.child = p
	s.log.Info("started envd serve", "pid", p.Pid)
	return nil
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
