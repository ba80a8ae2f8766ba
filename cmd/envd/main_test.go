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
	http   *http.Client // no keep-alive: a killed child takes its connections along
	url    string
	port   int
	me     envdtest.User
	alt    envdtest.User // a second name for the test's UID, with its own home
	exited chan struct{}
}

func startInit(t *testing.T) *initEnvd {
	t.Helper()
	bin := buildEnvd(t)
	accounts, me := envdtest.NewAccounts(t)
	// Same UID and GID, so envd can run as it without root.
	alt := accounts.Add(t, "aenvt-alt", me.UID, me.GID)
	port := freePort(t)
	cmd := exec.Command(bin, "--init", "--listen-addr", "127.0.0.1", "--port", strconv.Itoa(port),
		"--passwd", accounts.Passwd, "--group", accounts.Group, "--default-user", me.Name)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &initEnvd{cmd: cmd, http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, url: "http://127.0.0.1:" + strconv.Itoa(port), port: port, me: me, alt: alt, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(e.exited)
	}()
	t.Cleanup(func() {
		// SIGTERM ends the serve child too; SIGKILL only if that fails.
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

// servePID reads the serve child's PID from the last field of out: what
// envd runs prints $PPID there.
func (e *initEnvd) servePID(t *testing.T, out string) int {
	t.Helper()
	fields := strings.Fields(out)
	if len(fields) == 0 {
		t.Fatalf("no PID in %q", out)
	}
	pid, _ := strconv.Atoi(fields[len(fields)-1])
	if pid <= 1 || pid == e.cmd.Process.Pid {
		t.Fatalf("serve pid %q, init pid %d", out, e.cmd.Process.Pid)
	}
	return pid
}

// TestInitSupervises runs envd in --init mode: it answers through its serve
// child, brings the child back when it dies, and exits on SIGTERM.
func TestInitSupervises(t *testing.T) {
	e := startInit(t)
	ctx := context.Background()
	out, err := e.run(ctx, "", "echo $PPID")
	if err != nil {
		t.Fatal(err)
	}
	servePID := e.servePID(t, out)
	if err := syscall.Kill(servePID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The init keeps the port: requests wait for the next child.
	out, err = e.run(ctx, "", "echo $PPID")
	if err != nil {
		t.Fatal(err)
	}
	if next := e.servePID(t, out); next == servePID {
		t.Fatalf("served by the killed child %d", next)
	}

	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("init did not exit after SIGTERM")
	}
}

// TestRestartedServeKeepsSettings: code in the sandbox can kill `envd serve`
// (as root, through sudo). The init must bring it back with the token, env
// vars and default user /init set, keep the port meanwhile so nothing else
// can serve on it, and keep the latest settings after a re-key (a fork's).
func TestRestartedServeKeepsSettings(t *testing.T) {
	e := startInit(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New(e.url, e.http, "")
	err := c.Init(ctx, client.InitRequest{AccessToken: "tok-1", EnvVars: map[string]string{"SBX": "yes"}, DefaultUser: e.alt.Name})
	if err != nil {
		t.Fatal(err)
	}
	const script = `echo "$SBX $USER $HOME $PPID"`
	want := "yes " + e.alt.Name + " " + e.alt.Home + " "

	kill := func(t *testing.T, token string) {
		t.Helper()
		out, err := e.run(ctx, token, script)
		if err != nil || !strings.HasPrefix(out, want) {
			t.Fatalf("before kill: %q %v, want prefix %q", out, err, want)
		}
		pid := e.servePID(t, out)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// While no child runs, the port stays taken.
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(e.port)); err == nil {
			ln.Close()
			t.Fatal("envd's port was free for anyone to take after its serve process died")
		}
		// A request waits for the new child, which must know the token.
		out, err = e.run(ctx, token, script)
		if err != nil || !strings.HasPrefix(out, want) {
			t.Fatalf("after kill: %q %v, want prefix %q", out, err, want)
		}
		if e.servePID(t, out) == pid {
			t.Fatal("served by the killed child")
		}
	}
	expect := func(t *testing.T, method, path, token string, wantStatus int) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s with token %q: %d, want %d", method, path, token, resp.StatusCode, wantStatus)
		}
	}

	kill(t, "tok-1")
	expect(t, "POST", "/process.Process/List", "", 401)
	expect(t, "POST", "/init", "", 401)
	expect(t, "GET", "/envs", "tok-1", 200)

	// Re-key as the server does for a fork, then lose the child again: the
	// new token is what the next child knows.
	if err := c.Init(ctx, client.InitRequest{AccessToken: "tok-2"}); err != nil {
		t.Fatal(err)
	}
	kill(t, "tok-2")
	expect(t, "POST", "/process.Process/List", "tok-1", 401)
	expect(t, "POST", "/process.Process/List", "tok-2", 200)
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    []string
		want    options
		wantErr bool
	}{
		{args: nil, want: options{port: 49983, listenAddr: "0.0.0.0", defaultUser: "root", passwdPath: "/etc/passwd", groupPath: "/etc/group"}},
		{args: []string{"--port", "1", "--listen-addr", "10.0.0.2", "--init"}, want: options{init: true, port: 1, listenAddr: "10.0.0.2", defaultUser: "root", passwdPath: "/etc/passwd", groupPath: "/etc/group"}},
		{args: []string{"--state-fd", "3", "--listen-fd", "4", "--passwd", "p"}, want: options{port: 49983, listenAddr: "0.0.0.0", defaultUser: "root", passwdPath: "p", groupPath: "/etc/group", stateFD: 3, listenFD: 4}},
		{args: []string{"extra"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseFlags(tt.args, &strings.Builder{})
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Fatalf("parseFlags(%q) = %+v, %v", tt.args, got, err)
		}
	}
	if got := fmt.Sprint(serveArgs(options{port: 7, listenAddr: "a", defaultUser: "u", passwdPath: "p", groupPath: "g"})); got != "[serve --port 7 --listen-addr a --default-user u --passwd p --group g --state-fd 3 --listen-fd 4]" {
		t.Fatalf("serveArgs = %s", got)
	}
}
