package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/client/envdtest"
)

// newEnvd serves a real envd handler in-process; its processes run in a
// home of their own (see envdtest).
func newEnvd(t *testing.T) *httptest.Server {
	t.Helper()
	ts, _ := newEnvdIn(t)
	return ts
}

func newEnvdIn(t *testing.T) (*httptest.Server, *envdtest.Env) {
	t.Helper()
	env := envdtest.New(t)
	ts := httptest.NewServer(env.Server.Handler())
	t.Cleanup(ts.Close)
	return ts, env
}

// Login shells read the profile of the test's own home, never the host
// user's: a host whose profile is slow or prints must not change results.
func TestLoginShellUsesTheTestHome(t *testing.T) {
	ts, env := newEnvdIn(t)
	if err := os.WriteFile(filepath.Join(env.Home, ".profile"), []byte("export FROM_PROFILE=test-home\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := client.New(ts.URL, ts.Client(), "")
	res, err := c.Run(t.Context(), client.RunRequest{Command: `echo "$HOME|$FROM_PROFILE"; pwd`})
	if err != nil {
		t.Fatal(err)
	}
	if want := env.Home + "|test-home\n" + env.Home + "\n"; string(res.Stdout) != want || res.ExitCode != 0 {
		t.Fatalf("stdout %q (exit %d, stderr %q), want %q", res.Stdout, res.ExitCode, res.Stderr, want)
	}
}

func TestRun(t *testing.T) {
	ts := newEnvd(t)
	c := client.New(ts.URL, ts.Client(), "")
	ctx := context.Background()
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Init(ctx, client.InitRequest{EnvVars: map[string]string{"FROM_INIT": "init"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct {
		name     string
		req      client.RunRequest
		wantCode int
		stdout   string
		stderr   string
		timedOut bool
		trunc    bool
	}{
		{name: "echo", req: client.RunRequest{Command: "echo hi"}, stdout: "hi\n"},
		{name: "exit code and stderr", req: client.RunRequest{Command: "echo oops >&2; exit 42"}, wantCode: 42, stderr: "oops\n"},
		{name: "env", req: client.RunRequest{Command: `echo "$FOO|$FROM_INIT"`, Envs: map[string]string{"FOO": "bar baz"}}, stdout: "bar baz|init\n"},
		{name: "cwd", req: client.RunRequest{Command: "pwd", Cwd: dir}, stdout: dir + "\n"},
		{name: "missing command", req: client.RunRequest{Command: "definitely-not-a-command-xyz"}, wantCode: 127},
		{name: "timeout", req: client.RunRequest{Command: "sleep 20", Timeout: 500 * time.Millisecond}, wantCode: -1, timedOut: true},
		{name: "timeout keeps earlier output", req: client.RunRequest{Command: "echo before; sleep 20", Timeout: 1500 * time.Millisecond}, wantCode: -1, stdout: "before\n", timedOut: true},
		{name: "truncated", req: client.RunRequest{Command: "head -c 5000 /dev/zero | tr '\\0' a", MaxOutputBytes: 1000}, stdout: strings.Repeat("a", 1000), trunc: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			began := time.Now()
			res, err := c.Run(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.wantCode || res.TimedOut != tt.timedOut || res.Truncated != tt.trunc || string(res.Stdout) != tt.stdout {
				t.Fatalf("result %+v (stdout %q stderr %q)", res, res.Stdout, res.Stderr)
			}
			if tt.stderr != "" && string(res.Stderr) != tt.stderr {
				t.Fatalf("stderr %q, want %q", res.Stderr, tt.stderr)
			}
			if tt.timedOut && time.Since(began) > 3*time.Second {
				t.Fatalf("timeout took %v", time.Since(began))
			}
		})
	}
}

func TestRunLargeOutput(t *testing.T) {
	ts := newEnvd(t)
	c := client.New(ts.URL, ts.Client(), "")
	const size = 10 << 20
	res, err := c.Run(context.Background(), client.RunRequest{Command: "head -c 10485760 /dev/urandom | base64 -w0 | head -c 10485760"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != size || res.ExitCode != 0 || res.Truncated {
		t.Fatalf("got %d bytes, exit %d, truncated %v", len(res.Stdout), res.ExitCode, res.Truncated)
	}
}

func TestInitRekeyAndErrors(t *testing.T) {
	ts := newEnvd(t)
	ctx := context.Background()
	c := client.New(ts.URL, ts.Client(), "")
	if err := c.Init(ctx, client.InitRequest{AccessToken: "first"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, client.RunRequest{Command: "true"}); err != nil {
		t.Fatalf("run with the new token: %v", err)
	}
	stranger := client.New(ts.URL, ts.Client(), "wrong")
	if _, err := stranger.Run(ctx, client.RunRequest{Command: "true"}); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("run with a wrong token: %v", err)
	}
	if err := stranger.Init(ctx, client.InitRequest{AccessToken: "hijack"}); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("init with a wrong token: %v", err)
	}
	// Re-key as after a fork: the old token authorizes the new one.
	forked := client.New(ts.URL, ts.Client(), "first")
	if err := forked.Init(ctx, client.InitRequest{AccessToken: "second"}); err != nil {
		t.Fatal(err)
	}
	if _, err := forked.Run(ctx, client.RunRequest{Command: "true"}); err != nil {
		t.Fatalf("run after re-key: %v", err)
	}
	if _, err := c.Run(ctx, client.RunRequest{Command: "true"}); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("old token after re-key: %v", err)
	}
	if _, err := forked.Run(ctx, client.RunRequest{Command: "true", User: "no-such-user-x"}); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("unknown user: %v", err)
	}
	if _, err := forked.Run(ctx, client.RunRequest{Command: "true", Cwd: "/no/such/dir"}); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("missing cwd: %v", err)
	}
	// Clearing the token (a secure: false sandbox restored from a secure
	// one's image) leaves envd open to calls without one.
	if err := forked.Init(ctx, client.InitRequest{ClearAccessToken: true}); err != nil {
		t.Fatal(err)
	}
	anyone := client.New(ts.URL, ts.Client(), "")
	if _, err := anyone.Run(ctx, client.RunRequest{Command: "true"}); err != nil {
		t.Fatalf("run without a token after clearing it: %v", err)
	}
	if _, err := forked.Run(ctx, client.RunRequest{Command: "true"}); err != nil {
		t.Fatalf("run by the clearing client: %v", err)
	}
}

func TestFiles(t *testing.T) {
	ts := newEnvd(t)
	ctx := context.Background()
	c := client.New(ts.URL, ts.Client(), "tok")
	if err := c.Init(ctx, client.InitRequest{AccessToken: "tok"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sub/file.bin")
	content := bytes.Repeat([]byte("0123456789"), 100000)
	if err := c.WriteFile(ctx, path, bytes.NewReader(content), ""); err != nil {
		t.Fatal(err)
	}
	rc, size, err := c.ReadFile(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if size != int64(len(content)) || !bytes.Equal(got, content) {
		t.Fatalf("read %d bytes (size %d), want %d", len(got), size, len(content))
	}
	if err := c.WriteFile(ctx, filepath.Join(dir, "empty"), strings.NewReader(""), ""); err != nil {
		t.Fatal(err)
	}
	if _, size, err := c.ReadFile(ctx, filepath.Join(dir, "empty"), ""); err != nil || size != 0 {
		t.Fatalf("empty: size %d err %v", size, err)
	}
	tests := []struct {
		name string
		path string
		user string
		want error
	}{
		{"missing", filepath.Join(dir, "nope"), "", client.ErrNotFound},
		{"directory", dir, "", client.ErrInvalidArgument},
		{"unknown user", path, "no-such-user-x", client.ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := c.ReadFile(ctx, tt.path, tt.user); !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
		})
	}
	if err := c.WriteFile(ctx, dir, strings.NewReader("x"), ""); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("write onto a directory: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

func TestShellCode(t *testing.T) {
	tests := []struct {
		exit client.Exit
		want int
	}{
		{client.Exit{Code: 0, Exited: true, Status: "exit status 0"}, 0},
		{client.Exit{Code: 7, Exited: true, Status: "exit status 7"}, 7},
		{client.Exit{Code: -1, Status: "signal: killed"}, 137},
		{client.Exit{Code: -1, Status: "signal: terminated"}, 143},
		{client.Exit{Code: -1, Status: "signal: user defined signal 1"}, 1},
		{client.Exit{Code: 9, Status: "odd"}, 9},
	}
	for _, tt := range tests {
		if got := tt.exit.ShellCode(); got != tt.want {
			t.Errorf("%+v: %d, want %d", tt.exit, got, tt.want)
		}
	}
}
