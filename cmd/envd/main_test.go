package main

import (
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

	"github.com/aenv-dev/aenv/internal/envd/client"
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

// TestInitSupervises runs envd in --init mode: it answers through its serve
// child, brings the child back when it dies, and exits on SIGTERM.
func TestInitSupervises(t *testing.T) {
	bin := buildEnvd(t)
	port := freePort(t)
	cmd := exec.Command(bin, "--init", "--listen-addr", "127.0.0.1", "--port", strconv.Itoa(port))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	c := client.New("http://127.0.0.1:"+strconv.Itoa(port), http.DefaultClient, "")
	waitHealthy(t, c, 10*time.Second)

	res, err := c.Run(context.Background(), client.RunRequest{Command: "echo $PPID"})
	if err != nil {
		t.Fatal(err)
	}
	servePID, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if servePID == 0 || servePID == cmd.Process.Pid {
		t.Fatalf("serve pid %q, init pid %d", res.Stdout, cmd.Process.Pid)
	}
	if err := syscall.Kill(servePID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	waitHealthy(t, c, 10*time.Second)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("init did not exit after SIGTERM")
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    []string
		want    options
		wantErr bool
	}{
		{args: nil, want: options{port: 49983, listenAddr: "0.0.0.0", defaultUser: "root"}},
		{args: []string{"--port", "1", "--listen-addr", "10.0.0.2", "--init"}, want: options{init: true, port: 1, listenAddr: "10.0.0.2", defaultUser: "root"}},
		{args: []string{"extra"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseFlags(tt.args, &strings.Builder{})
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Fatalf("parseFlags(%q) = %+v, %v", tt.args, got, err)
		}
	}
	if got := fmt.Sprint(serveArgs(options{port: 7, listenAddr: "a", defaultUser: "u"})); got != "[serve --port 7 --listen-addr a --default-user u]" {
		t.Fatalf("serveArgs = %s", got)
	}
}
