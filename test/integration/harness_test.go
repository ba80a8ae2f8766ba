// Package integration drives a real `aenv server` with real gVisor
// sandboxes through its HTTP API. It needs root; with
// AENV_REQUIRE_ROOT_TESTS=1 (as `make test` and CI set) a missing
// requirement fails the suite instead of skipping it.
//
// Tests run two at a time (t.Parallel, go test's -parallel: the number
// of CPUs by default): a test mostly waits on its servers and sandboxes,
// and each server owns its data directory, network prefix, address range
// and ports, so tests share only the template cache (built under a lock).
// One test runs alone, before the others: TestGatewayImageInPodman, so that
// the two tests that run podman never overlap (see there).
package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

const apiKey = "aenv_test_key"

// binDir holds aenv, envd and runsc, built by `make build`.
var binDir string

// serverBin is the aenv that runs the tests' servers, nodes and gateways:
// $AENV_SERVER_BIN (make test's race-enabled build, whose reports fail the
// test), else binDir's. The CLI's client commands run binDir's.
var serverBin string

// templateCache is shared by every server of the suite (and across runs),
// so the base template is built once per machine.
const templateCache = "/var/cache/aenv-test"

// rootImageCache holds the root images of the suite's servers, shared as
// nodes of a cluster share theirs (the same path on every node) and kept
// across runs with the templates they are made of.
const rootImageCache = templateCache + "/rootfs-images"

func TestMain(m *testing.M) {
	flag.Parse()
	if msg := requirements(); msg != "" {
		if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			fmt.Fprintln(os.Stderr, "integration tests cannot run:", msg)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "SKIP integration tests:", msg)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func requirements() string {
	if testing.Short() {
		return "-short"
	}
	if os.Geteuid() != 0 {
		return "not root"
	}
	binDir = os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		abs, _ := filepath.Abs("../../bin")
		binDir = abs
	}
	for _, name := range []string{"aenv", "envd", "runsc"} {
		if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
			return fmt.Sprintf("%s missing in %s (run `make build`)", name, binDir)
		}
	}
	serverBin = os.Getenv("AENV_SERVER_BIN")
	if serverBin == "" {
		serverBin = filepath.Join(binDir, "aenv")
	}
	if _, err := os.Stat(serverBin); err != nil {
		return fmt.Sprintf("server binary: %v", err)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "debootstrap not installed (run `make deps`)"
	}
	return ""
}

// server is one `aenv server` process of a test.
type server struct {
	t       testing.TB
	dataDir string
	// raceDir receives the race detector's reports of a race-enabled
	// server (see raceEnv).
	raceDir string
	prefix  string
	cidr    string
	addr    string
	url     string
	// bin, when set, is the aenv this server runs instead of serverBin
	// (another release, for an upgrade).
	bin string
	// run, when set, makes the command that runs aenv with these
	// arguments (a container of the node image); else it is bin's.
	run    func(args []string) *exec.Cmd
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	logs   *syncBuffer
	extra  []string
	// env is added to the process's environment (credentials).
	env []string
	// cluster, when set, makes this an `aenv node` of that cluster rather
	// than a single server.
	cluster *nodeOf
	// api is the shared client, for what a test does rather than checks;
	// do sends requests whose wire details (status, headers) a test checks.
	api *client.Client
	// checked sends do's requests; every answer is checked against the
	// OpenAPI document (nil: http.DefaultClient, unchecked).
	checked *http.Client
}

func randomLetters(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	return string(b)
}

// newServer prepares a server with its own data dir, network prefix and
// address range; start launches it. At cleanup it is stopped with
// --kill-on-exit semantics and the suite checks that nothing leaked.
func newServer(t testing.TB, extra ...string) *server {
	t.Helper()
	s := &server{
		t:       t,
		dataDir: t.TempDir(),
		raceDir: t.TempDir(),
		prefix:  "it" + randomLetters(3),
		extra:   extra,
	}
	s.cidr = randomCIDR()
	// Every answer the tests get is checked against the OpenAPI document.
	s.checked = &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}
	s.listenOn(freeAddr(t))
	t.Cleanup(func() {
		s.stop(syscall.SIGTERM)
		s.checkNoLeaks()
	})
	return s
}

// listenOn makes addr the server's API address, and the tests' client's.
func (s *server) listenOn(addr string) {
	s.addr = addr
	s.url = "http://" + addr
	s.api = client.New(client.Config{URL: s.url, APIKey: apiKey, HTTP: s.checked})
}

// randomCIDR picks one of 12,800 /24s in 10.200.0.0-10.249.255.0 for a
// server's sandboxes; start picks again should it overlap another's.
func randomCIDR() string {
	b := make([]byte, 2)
	rand.Read(b)
	return fmt.Sprintf("10.%d.%d.0/24", 200+int(b[0])%50, int(b[1]))
}

// rangeConflict is how a server refuses a --sandbox-cidr that overlaps
// another server's range or the host's addresses (network.ErrRangeConflict).
const rangeConflict = "sandbox range conflicts with the host's network"

// start launches the server and waits until it is healthy. Should its
// random range collide with a concurrent server's (which it refuses,
// naming the conflict), it starts again on another range.
func (s *server) start() {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		switch s.startOnce(attempt < 5) {
		case started:
			return
		case rangeTaken:
			s.t.Logf("sandbox range %s is taken on this host; trying another", s.cidr)
			s.cidr = randomCIDR()
		case portTaken:
			// The port was picked free and let go: something (one of the
			// server's own listeners on an ephemeral port) took it first.
			s.t.Logf("port of %s was taken before the server bound it; trying another", s.addr)
			s.listenOn(freeAddr(s.t))
		}
	}
}

// startResult is how one launch of a server ended.
type startResult int

const (
	started startResult = iota
	rangeTaken
	portTaken
)

// startOnce launches the server; with retry it returns rangeTaken or
// portTaken, instead of failing the test, when the server refuses its
// range or finds its port taken.
func (s *server) startOnce(retry bool) startResult {
	s.t.Helper()
	args := []string{"server", "--api-key", apiKey}
	if s.cluster != nil {
		// Nodes take the cluster secret; tests use the API key for it, so
		// that s.api reaches the node directly.
		args = []string{"node", "--database-url", s.cluster.dsn, "--node-id", s.cluster.id,
			"--advertise", s.addr, "--cluster-secret", apiKey, "--heartbeat-interval-ms", "200"}
	}
	args = append(append(args,
		"--data-dir", s.dataDir, "--listen", s.addr,
		"--net-prefix", s.prefix, "--sandbox-cidr", s.cidr, "--warm-slots", "2",
		"--template-cache-dir", templateCache, "--root-image-dir", rootImageCache, "--kill-on-exit", "--log-level", "debug",
		"--allow-private-registries", // tests serve images from registries on loopback
	), s.extra...)
	s.logs = &syncBuffer{}
	bin := serverBin
	if s.bin != "" {
		bin = s.bin
	}
	if s.run != nil {
		s.cmd = s.run(args)
	} else {
		s.cmd = exec.Command(bin, args...)
	}
	s.cmd.Env = append(append(os.Environ(), s.env...), raceEnv(s.raceDir))
	s.cmd.Stdout = s.logs
	s.cmd.Stderr = s.logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { s.cmd.Wait(); close(exited) }()
	// The first server on a machine builds the base template (minutes).
	deadline := time.Now().Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			logs := s.logs.String()
			switch {
			case retry && strings.Contains(logs, rangeConflict):
				s.cmd = nil
				return rangeTaken
			case retry && strings.Contains(logs, "listen api on "+s.addr) && strings.Contains(logs, "address already in use"):
				s.cmd = nil
				return portTaken
			}
			s.t.Fatalf("server exited during start:\n%s", logs)
		default:
		}
		resp, err := http.Get(s.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				s.cmd.Process.Signal(syscall.Signal(0))
				return started
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("server did not become healthy:\n%s", s.logs.String())
	return started
}

// stop ends the server with sig and waits for it.
func (s *server) stop(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		// Not running, or ended by the test: what it reported still counts.
		checkRaces(s.t, "server "+s.addr, s.raceDir)
		return
	}
	s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(90 * time.Second):
		s.cmd.Process.Kill()
		s.t.Errorf("server did not stop within 90s on %v", sig)
	}
	checkRaces(s.t, "server "+s.addr, s.raceDir)
	if s.t.Failed() {
		s.t.Logf("server logs:\n%s", tail(s.logs.String(), 200))
	}
	s.cmd = nil
}

// raceEnv is the environment entry that makes a race-enabled aenv write
// its reports to files in dir (race.<pid>) instead of among its logs, and
// go on after one, so that checkRaces finds them all when it stops. A
// static aenv ignores it.
func raceEnv(dir string) string {
	return "GORACE=log_path=" + filepath.Join(dir, "race") + " halt_on_error=0"
}

// checkRaces fails t with the race reports that a process (what) left in
// dir, and removes them so that a restarted process's are told apart.
func checkRaces(t testing.TB, what, dir string) {
	t.Helper()
	report, err := raceReports(dir)
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
	if report != "" {
		t.Errorf("%s: the race detector reported:\n%s", what, report)
	}
}

// raceReports reads and removes the race reports in dir: the non-empty
// race.* files, concatenated, or "" when there are none.
func raceReports(dir string) (string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "race.*"))
	if err != nil {
		return "", fmt.Errorf("race reports: %w", err)
	}
	var all strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return all.String(), fmt.Errorf("race report: %w", err)
		}
		if len(bytes.TrimSpace(data)) > 0 {
			fmt.Fprintf(&all, "%s:\n%s\n", filepath.Base(p), data)
		}
		if err := os.Remove(p); err != nil {
			return all.String(), fmt.Errorf("race report: %w", err)
		}
	}
	return all.String(), nil
}

// syncBuffer collects a process's output while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// response is a decoded HTTP answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
}

// do sends a request with the API key; body may be nil, []byte, string
// or a value to encode as JSON.
func (s *server) do(method, path string, body any, headers ...string) response {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	hc := s.checked
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// doNoFail is do for requests that may fail at the transport (a server
// killed mid-request); the error becomes status 0.
func (s *server) doNoFail(method, path string, body any) response {
	enc, _ := json.Marshal(body)
	req, err := http.NewRequest(method, s.url+path, bytes.NewReader(enc))
	if err != nil {
		return response{}
	}
	req.Header.Set("X-API-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// expect fails the test unless the answer has the given status.
func (s *server) expect(r response, status int, what string) response {
	s.t.Helper()
	if r.status != status {
		s.t.Fatalf("%s: status %d, want %d; body %s", what, r.status, status, truncate(r.body))
	}
	return r
}

func truncate(b []byte) string {
	if len(b) > 500 {
		return string(b[:500]) + "..."
	}
	return string(b)
}

// create sends body as it is (tests send both spellings of some fields)
// and checks the 201 and the ID's form.
func (s *server) create(body map[string]any) client.Sandbox {
	s.t.Helper()
	if body == nil {
		body = map[string]any{"templateID": "base"}
	}
	var sb client.Sandbox
	s.expect(s.do("POST", "/sandboxes", body), 201, "create").json(s.t, &sb)
	if len(sb.SandboxID) != 20 {
		s.t.Fatalf("sandbox ID %q is not 20 characters", sb.SandboxID)
	}
	return sb
}

// exec runs a command through the shared client and fails the test
// unless the server answers with a result.
func (s *server) exec(id string, req client.ExecuteRequest) client.ExecuteResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := s.api.Execute(ctx, id, req)
	if err != nil {
		s.t.Fatalf("execute %q in %s: %v", req.Command, id, err)
	}
	return res
}

// checkNoLeaks verifies that a stopped server left nothing behind: no
// runsc process, mount, loop device, network namespace, veth or firewall
// table of its.
func (s *server) checkNoLeaks() {
	t := s.t
	if out, _ := exec.Command("pgrep", "-af", s.dataDir).Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("processes left behind:\n%s", out)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, s.dataDir) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	// The volume pool's loop device (it detaches once unmounted), by the
	// path it shows or, as a node in a container that is gone attached it
	// through a mount of its own, by its backing file's inode.
	pool := filepath.Join(s.dataDir, "volumes.img")
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		dev := filepath.Base(filepath.Dir(filepath.Dir(p)))
		b, _ := os.ReadFile(p)
		leaked := strings.Contains(string(b), s.dataDir) || volume.LoopBacks("/dev/"+dev, pool)
		if leaked {
			t.Errorf("loop device left behind: %s for %s", dev, strings.TrimSpace(string(b)))
		}
	}
	netns, _ := os.ReadDir("/var/run/netns")
	for _, e := range netns {
		if strings.HasPrefix(e.Name(), s.prefix) {
			t.Errorf("network namespace left behind: %s", e.Name())
		}
	}
	links, _ := os.ReadDir("/sys/class/net")
	for _, e := range links {
		if strings.HasPrefix(e.Name(), s.prefix) {
			t.Errorf("network interface left behind: %s", e.Name())
		}
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil && strings.Contains(string(out), s.prefix) {
		t.Errorf("nftables table left behind:\n%s", out)
	}
	// The gVisor driver names its cgroup parent after its state dir.
	sum := sha256.Sum256([]byte(filepath.Join(s.dataDir, "runtime")))
	parent := "aenv-" + hex.EncodeToString(sum[:])[:12]
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	for _, c := range cgroups {
		t.Errorf("cgroup left behind: %s", c)
	}
}

// runscProcesses counts runsc processes of a sandbox.
func runscProcesses(id string) int {
	out, _ := exec.Command("pgrep", "-f", "runsc.*"+id).Output()
	return len(strings.Fields(string(out)))
}

// TestRaceReports checks that the harness finds what a race-enabled
// server's detector writes (synthetic reports here), so that a race fails
// the test that ran into it.
func TestRaceReports(t *testing.T) {
	t.Parallel()
	const report = "==================\nWARNING: DATA RACE\nWrite at 0x00c000 by goroutine 7:\n==================\n"
	cases := []struct {
		name  string
		files map[string]string
		want  []string // substrings of the result; none means ""
	}{
		{"none", nil, nil},
		{"other files only", map[string]string{"server.log": "WARNING: DATA RACE"}, nil},
		{"empty report file", map[string]string{"race.12": ""}, nil},
		{"one", map[string]string{"race.12": report}, []string{"race.12:", "WARNING: DATA RACE"}},
		{"two processes", map[string]string{"race.12": report, "race.34": report}, []string{"race.12:", "race.34:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, text := range c.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := raceReports(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.want) == 0 && got != "" {
				t.Fatalf("got a report, want none:\n%s", got)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Fatalf("report lacks %q:\n%s", w, got)
				}
			}
			// Read reports are removed, so that a restarted server's own
			// are told apart from its predecessor's.
			if again, err := raceReports(dir); err != nil || again != "" {
				t.Fatalf("second read = %q, %v; want nothing", again, err)
			}
		})
	}
	t.Run("checkRaces fails the test", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "race.12"), []byte(report), 0o600); err != nil {
			t.Fatal(err)
		}
		rec := &recordingTB{TB: t}
		checkRaces(rec, "server", dir)
		if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "WARNING: DATA RACE") {
			t.Fatalf("errors = %q, want one with the report", rec.errors)
		}
	})
}

// recordingTB records a test's failures instead of failing it.
type recordingTB struct {
	testing.TB
	errors []string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
