package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExec(t *testing.T) {
	requireRoot(t)
	srv := newFakeServer(t)
	sb := srv.addSandbox("tpl-base")
	tests := []struct {
		name           string
		stdin          string
		argv           []string
		code           int
		stdout, stderr string
	}{
		{name: "stdout and stderr apart", argv: []string{"exec", sb.ID, "echo out; echo err >&2"},
			stdout: "out\n", stderr: "err\n"},
		{name: "exit code", argv: []string{"exec", sb.ID, "exit 7"}, code: 7},
		{name: "missing command", argv: []string{"exec", sb.ID, "no-such-command-aenv"}, code: 127},
		{name: "killed by a signal", argv: []string{"exec", sb.ID, "kill -KILL $$"}, code: 137},
		{name: "arguments quoted", argv: []string{"exec", sb.ID, "printf", "%s|", "a b", "$HOME", "it's"},
			stdout: "a b|$HOME|it's|"},
		{name: "flags after the ID belong to the command", argv: []string{"exec", sb.ID, "echo", "-n", "x"}, stdout: "x"},
		{name: "a -- after the ID is dropped", argv: []string{"exec", sb.ID, "--", "echo", "-n", "x"}, stdout: "x"},
		{name: "a -- later is the command's", argv: []string{"exec", sb.ID, "echo", "--", "x"}, stdout: "-- x\n"},
		{name: "workdir and env", argv: []string{"exec", "-w", "/tmp", "-e", "A=b c", sb.ID, `echo "$A"; pwd`},
			stdout: "b c\n/tmp\n"},
		{name: "stdin with -i", stdin: "line1\nline2\n", argv: []string{"exec", "-i", sb.ID, "cat"}, stdout: "line1\nline2\n"},
		{name: "no stdin without -i", stdin: "ignored", argv: []string{"exec", sb.ID, "cat"}},
		{name: "tty", argv: []string{"exec", "-t", sb.ID, "test -t 0 && test -t 1 && echo $TERM"}, stdout: "xterm-256color\r\n"},
		{name: "timeout kills", argv: []string{"exec", "--timeout", "1", sb.ID, "sleep 30"}, code: 137},
		{name: "unknown sandbox", argv: []string{"exec", "ghost", "true"}, code: ExitNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			res := newCLIEnv(t, srv).run(tt.stdin, tt.argv...)
			if res.code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", res.code, tt.code, res.stderr)
			}
			if res.stdout != tt.stdout {
				t.Errorf("stdout %q, want %q", res.stdout, tt.stdout)
			}
			if tt.code < ExitNotFound && res.stderr != tt.stderr {
				t.Errorf("stderr %q, want %q", res.stderr, tt.stderr)
			}
			if time.Since(start) > 20*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
		})
	}
}

func TestInteractiveShell(t *testing.T) {
	requireRoot(t)
	srv := newFakeServer(t)
	env := newCLIEnv(t, srv)
	// Input arrives after the shell has started, as typing would.
	in, typing := io.Pipe()
	go func() {
		time.Sleep(300 * time.Millisecond)
		io.WriteString(typing, "echo marker-$((6*7))\n")
		time.Sleep(200 * time.Millisecond)
		io.WriteString(typing, "exit 3\n")
	}()
	t.Cleanup(func() { typing.Close() })
	res := env.runWith(in, "start", "base", "--rm")
	if res.code != 3 {
		t.Errorf("exit %d, want the shell's 3; stderr %q", res.code, res.stderr)
	}
	if !strings.Contains(res.stdout, "marker-42") {
		t.Errorf("shell output lacks the command's: %q", res.stdout)
	}
	if !strings.Contains(res.stderr, "started from base") {
		t.Errorf("stderr %q", res.stderr)
	}
	srv.mu.Lock()
	left := len(srv.sandboxes)
	srv.mu.Unlock()
	if left != 0 {
		t.Errorf("--rm left %d sandboxes", left)
	}
}

// An interrupted aenv (Ctrl-C cancels the context in main) kills the remote
// command instead of leaving it running, and exits 130 like a shell.
func TestExecInterruptKillsRemoteCommand(t *testing.T) {
	requireRoot(t)
	srv := newFakeServer(t)
	sb := srv.addSandbox("tpl-base")
	marker := filepath.Join(t.TempDir(), "survived")
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := newCLIEnv(t, srv).runCtx(ctx, strings.NewReader(""), "exec", sb.ID, "sleep 2; touch "+marker)
	if res.code != 130 || time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("exit %d after %v, want 130 at once; stderr %q", res.code, time.Since(start), res.stderr)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the remote command kept running after the interrupt")
	}
}
