// Package pgtest runs a throwaway PostgreSQL server for tests: a cluster
// made with initdb in a temporary directory, listening only on a unix
// socket there, removed when the test ends.
//
// The server binaries come from Debian's postgresql package (installed by
// scripts/install-deps.sh). PostgreSQL refuses to run as root, so a root
// test runs it as the package's postgres user. Tiering follows roottest:
// with AENV_REQUIRE_ROOT_TESTS=1 a missing server fails the test; else
// it skips, and -short skips without looking.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// Bounds on waits for the server; generous, as a busy machine is slow.
const (
	readyTimeout = 90 * time.Second
	stopTimeout  = 60 * time.Second
)

// superuser is the role initdb makes; local connections trust it.
const superuser = "postgres"

// port names the socket (.s.PGSQL.<port>); the socket's directory is the
// cluster's own, so every cluster can use the same one.
const port = "5432"

// Server is one throwaway PostgreSQL cluster.
type Server struct {
	bin     string              // directory of initdb and postgres
	dir     string              // holds data/, the socket and postgres.log
	cred    *syscall.Credential // whom the server runs as; nil: this user
	log     *os.File            // the server's output, shown when a test fails
	nextDB  atomic.Int64        // suffix of the next NewDatabase
	mu      sync.Mutex          // guards proc
	proc    *exec.Cmd           // the running postmaster; nil when stopped
	exited  chan struct{}       // closed when proc has exited
	exitErr error               // proc's exit status, once exited is closed
}

// New makes and starts a cluster; it is stopped and removed when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	if testing.Short() && os.Getenv("AENV_REQUIRE_ROOT_TESTS") != "1" {
		t.Skip("-short: no throwaway PostgreSQL")
	}
	bin, err := findBin()
	if err != nil {
		roottest.SkipOrFail(t, err.Error())
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		s.cred, err = unprivileged()
		if err != nil {
			roottest.SkipOrFail(t, err.Error())
		}
	}
	// Under /tmp rather than t.TempDir(): the server's user must reach it
	// (t.TempDir's parents are private to root), and a unix socket path
	// must stay short.
	s.dir, err = os.MkdirTemp("/tmp", "aenv-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(s.dir); err != nil {
			t.Errorf("pgtest: remove %s: %v", s.dir, err)
		}
	})
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	s.log, err = os.Create(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.dumpLog(t)
		}
		s.log.Close()
	})
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	s.initdb(t)
	s.Start(t)
	return s
}

// findBin returns the directory of the newest installed server version
// (Debian keeps each in /usr/lib/postgresql/<major>/bin), else the one on
// PATH.
func findBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		d := filepath.Dir(initdb)
		if isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server not installed (initdb, postgres; scripts/install-deps.sh installs it)")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// unprivileged returns the credentials of the postgres user that Debian's
// package creates.
func unprivileged() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root and there is no postgres user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user: gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) initdb(t testing.TB) {
	t.Helper()
	// --no-sync: the cluster dies with the test; the C locale makes text
	// order byte order whatever the machine's locale.
	cmd := s.command("initdb", "--pgdata", s.dataDir(), "--username", superuser, "--auth", "trust",
		"--encoding", "UTF8", "--locale", "C", "--no-sync")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out.String())
	}
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		t.Fatal("pgtest: Start: server already running")
	}
	// Durability is of no use in a throwaway cluster, and turning it off
	// keeps the tests fast on a busy disk. No TCP listener: the socket in
	// the cluster's directory cannot collide with another test's.
	cmd := s.command("postgres", "-D", s.dataDir(), "-k", s.dir, "-p", port, "-c", "listen_addresses=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "max_connections=100")
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Should the test binary die without cleaning up, the postmaster gets
	// SIGQUIT (immediate shutdown) instead of living on.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		s.exitErr = cmd.Wait()
		close(exited)
	}()
	s.proc, s.exited = cmd, exited
	if err := s.waitReady(exited); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// waitReady polls with a connection until the server accepts one.
func (s *Server) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("postgres exited while starting: %v (see postgres.log)", s.exitErr)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("postgres not ready after %v: %v", readyTimeout, lastErr)
}

// Stop shuts the server down (fast: clients are disconnected) and waits
// for it to exit; Start brings it back with the same data.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	defer func() { s.proc = nil }()
	// SIGINT is PostgreSQL's fast shutdown.
	if err := s.proc.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop postgres: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(stopTimeout):
		s.proc.Process.Kill()
		<-s.exited
		return fmt.Errorf("postgres did not stop within %v; killed", stopTimeout)
	}
}

// ConnString is the keyword/value connection string of database db, as
// the superuser.
func (s *Server) ConnString(db string) string {
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", s.dir, port, superuser, db)
}

// NewDatabase creates an empty database and returns its connection
// string.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test%d", s.nextDB.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return s.ConnString(name)
}

// dumpLog shows the end of the server's log.
func (s *Server) dumpLog(t testing.TB) {
	b, err := os.ReadFile(s.log.Name())
	if err != nil {
		t.Logf("pgtest: read postgres.log: %v", err)
		return
	}
	const max = 8 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	t.Logf("pgtest: end of postgres.log:\n%s", b)
}
