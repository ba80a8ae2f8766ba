package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
	"github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/envd/envdtest"
	"github.com/aenv-dev/aenv/internal/roottest"
)

// requireRoot: see roottest.Require.
func requireRoot(t *testing.T) {
	t.Helper()
	roottest.Require(t)
}

// buildEnvd compiles the static envd binary the sandbox runs.
func buildEnvd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "envd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitHealthy polls /health until envd answers or the deadline passes.
func waitHealthy(t *testing.T, c *client.Client, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("envd not healthy after %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// initEnvd is envd started in --init mode on a free loopback port, with
// test accounts instead of the host's.
type initEnvd struct {
	cmd    *exec.Cmd
	http   *http.Client
	url    string
	exited chan struct{}
}

func startInit(t *testing.T) *initEnvd {
	t.Helper()
	bin := buildEnvd(t)
	accounts, me := envdtest.NewAccounts(t)
	port := freePort(t)
	cmd := exec.Command(bin, "--init", "--listen-addr", "127.0.0.1", "--port", strconv.Itoa(port),
		"--passwd", accounts.Passwd, "--group", accounts.Group, "--default-user", me.Name)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &initEnvd{cmd: cmd, http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, url: "http://127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(e.exited)
	}()
	t.Cleanup(func() {
		// SIGTERM ends envd; SIGKILL only if that fails.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-e.exited
		}
	})
	waitHealthy(t, client.New(e.url, e.http, ""), 10*time.Second)
	return e
}

// run runs script with bash (not a login shell: no host profile) and
// returns its stdout; token "" sends none.
func (e *initEnvd) run(ctx context.Context, token, script string) (string, error) {
	pc := processconnect.NewProcessClient(e.http, e.url)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}})
	if token != "" {
		req.Header().Set("X-Access-Token", token)
	}
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return "", err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetStdout())
	}
	return out.String(), stream.Err()
}

// TestInitReapsOrphans runs envd in --init mode: it runs commands itself
// (their exit codes intact while it reaps), collects the orphans its
// commands leave, and exits on SIGTERM.
func TestInitReapsOrphans(t *testing.T) {
	e := startInit(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.run(ctx, "", "echo $PPID")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != strconv.Itoa(e.cmd.Process.Pid) {
		t.Fatalf("commands' parent %q, want envd itself (%d)", out, e.cmd.Process.Pid)
	}
	// Orphans: each command leaves a background process, which envd
	// (a subreaper under --init) inherits; the command's own exit code
	// must still arrive.
	envdPID := strconv.Itoa(e.cmd.Process.Pid)
	var orphans []string
	for i := range 5 {
		c := client.New(e.url, e.http, "")
		res, err := c.Run(ctx, client.RunRequest{Command: fmt.Sprintf("sleep 2 > /dev/null 2>&1 & echo $!; exit %d", i)})
		if err != nil || res.ExitCode != i {
			t.Fatalf("run %d: %+v %v; want exit code %d", i, res, err, i)
		}
		orphans = append(orphans, strings.TrimSpace(string(res.Stdout)))
	}
	// While it runs, the last orphan is envd's child.
	stat, err := os.ReadFile("/proc/" + orphans[len(orphans)-1] + "/stat")
	if err != nil {
		t.Fatalf("the last orphan ended within two seconds of its start: %v", err)
	}
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) < 2 || f[1] != envdPID {
		t.Fatalf("orphan %s: stat %q; want envd (%s) its parent", orphans[len(orphans)-1], stat, envdPID)
	}
	// Once they have exited, they are gone, and nothing is left under
	// envd: no zombie.
	deadline := time.Now().Add(30 * time.Second)
	for {
		for len(orphans) > 0 {
			if _, err := os.Stat("/proc/" + orphans[0]); err == nil {
				break
			}
			orphans = orphans[1:]
		}
		if len(orphans) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("orphans not reaped: %v", orphans)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		left := childrenOf(t, e.cmd.Process.Pid)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left under envd: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("envd did not exit after SIGTERM")
	}
}

// childrenOf lists the processes whose parent is pid (any of its threads),
// exited or not.
func childrenOf(t *testing.T, pid int) []string {
	t.Helper()
	lists, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil || len(lists) == 0 {
		t.Fatalf("children of %d: %v", pid, err)
	}
	var left []string
	for _, list := range lists {
		b, _ := os.ReadFile(list) // a thread that ended since: none
		for _, c := range strings.Fields(string(b)) {
			if stat, err := os.ReadFile("/proc/" + c + "/stat"); err == nil {
				left = append(left, string(stat[:min(len(stat), 40)]))
			}
		}
	}
	return left
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    []string
		want    options
		wantErr bool
	}{
		{args: nil, want: options{port: 49983, listenAddr: "0.0.0.0", defaultUser: "root", passwdPath: "/etc/passwd", groupPath: "/etc/group"}},
		{args: []string{"--port", "1", "--listen-addr", "10.0.0.2", "--init"}, want: options{init: true, port: 1, listenAddr: "10.0.0.2", defaultUser: "root", passwdPath: "/etc/passwd", groupPath: "/etc/group"}},
		{args: []string{"--passwd", "p", "--default-user", "u"}, want: options{port: 49983, listenAddr: "0.0.0.0", defaultUser: "u", passwdPath: "p", groupPath: "/etc/group"}},
		// The serve child of envd's earlier init is gone with its flags.
		{args: []string{"serve", "--state-fd", "3"}, wantErr: true},
		{args: []string{"extra"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseFlags(tt.args, &strings.Builder{})
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Fatalf("parseFlags(%q) = %+v, %v", tt.args, got, err)
		}
	}
}
