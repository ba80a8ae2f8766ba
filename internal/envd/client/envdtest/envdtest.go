// Package envdtest runs a real envd in-process for tests, with an account
// of its own: the processes it starts get a fresh home directory, so login
// shells (bash -l) read no profile of the host's user. Tests then behave
// the same on any machine, whatever its user's profile does (a slow pyenv
// init, a noisy banner).
package envdtest

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/envd"
)

// Env is an envd server and the account its processes run as.
type Env struct {
	Server *envd.Server
	User   string // the current user's name
	Home   string // the account's home: empty, removed after the test
}

// New builds an envd whose default user is the current user with a fresh
// home directory, described by account files of the test's own. It is
// closed when the test ends.
func New(t testing.TB) *Env {
	t.Helper()
	me, err := user.Current()
	if err != nil {
		t.Fatalf("current user: %v", err)
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	write(t, passwd, fmt.Sprintf("%s:x:%s:%s::%s:/bin/bash\n", me.Username, me.Uid, me.Gid, home))
	write(t, group, fmt.Sprintf("%s:x:%s:\n", groupName(me.Gid), me.Gid))
	srv := envd.New(envd.Config{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		DefaultUser: me.Username,
		PasswdPath:  passwd,
		GroupPath:   group,
	})
	t.Cleanup(srv.Close)
	return &Env{Server: srv, User: me.Username, Home: home}
}

func groupName(gid string) string {
	if g, err := user.LookupGroupId(gid); err == nil {
		return g.Name
	}
	return "g" + gid
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
