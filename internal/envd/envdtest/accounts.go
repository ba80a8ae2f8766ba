// Package envdtest gives envd's tests accounts of their own: a passwd and a
// group file whose users have fresh, empty homes. A login shell envd starts
// for them then reads no profile of the host's (a slow or noisy root
// profile would otherwise slow or break the tests), and adding users needs
// no useradd on the host.
package envdtest

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// Accounts are a passwd and a group file plus the homes they name.
type Accounts struct {
	Passwd string // path of the passwd file
	Group  string // path of the group file
	dir    string
}

// User is one account of Accounts.
type User struct {
	Name string
	UID  uint32
	GID  uint32
	Home string
}

// NewAccounts creates the files with one account: the user the test runs
// as, under its own name, with a fresh home. The files and homes go when
// the test ends.
func NewAccounts(t testing.TB) (*Accounts, User) {
	t.Helper()
	// Not t.TempDir: its directories are private to the test's user, and
	// the other users' homes must be reachable by them.
	dir, err := os.MkdirTemp("", "aenv-accounts-")
	if err != nil {
		t.Fatalf("accounts dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("accounts dir: %v", err)
	}
	a := &Accounts{Passwd: filepath.Join(dir, "passwd"), Group: filepath.Join(dir, "group"), dir: dir}
	for _, f := range []string{a.Passwd, a.Group} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatalf("accounts: %v", err)
		}
	}
	name := "aenvt-me"
	if me, err := user.Current(); err == nil && me.Username != "" {
		name = me.Username
	}
	me := a.Add(t, name, uint32(os.Getuid()), uint32(os.Getgid()))
	return a, me
}

// Add appends an account with its own primary group and a fresh home owned
// by it, and makes it a member of each of groups (by GID; created as needed).
// Homes owned by another UID need root.
func (a *Accounts) Add(t testing.TB, name string, uid, gid uint32, groups ...uint32) User {
	t.Helper()
	home := filepath.Join(a.dir, "home-"+name)
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatalf("home of %s: %v", name, err)
	}
	if err := os.Chown(home, int(uid), int(gid)); err != nil {
		t.Fatalf("home of %s: %v", name, err)
	}
	appendLine(t, a.Passwd, fmt.Sprintf("%s:x:%d:%d::%s:/bin/bash", name, uid, gid, home))
	appendLine(t, a.Group, fmt.Sprintf("%s:x:%d:", name, gid))
	for _, g := range groups {
		appendLine(t, a.Group, "aenvt-g"+strconv.FormatUint(uint64(g), 10)+":x:"+strconv.FormatUint(uint64(g), 10)+":"+name)
	}
	return User{Name: name, UID: uid, GID: gid, Home: home}
}

func appendLine(t testing.TB, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("append to %s: %v", path, err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Fatalf("append to %s: %v", path, err)
	}
}
