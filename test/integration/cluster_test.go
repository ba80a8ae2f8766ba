package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// A cluster on this one machine: a throwaway PostgreSQL, `aenv node`s
// (each with its own data dir, network prefix and address range) and
// `aenv gateway`s, all real processes.

// nodeTimeout is the gateways' bound on a node's silence (nodes beat every
// 200 ms in tests).
const nodeTimeout = 1500 * time.Millisecond

// nodeOf makes a server an `aenv node` of a cluster.
type nodeOf struct {
	dsn, id string
	key     []byte // the cluster's secrets key
}

type cluster struct {
	t        testing.TB
	pg       *pgtest.Server
	dsn      string
	key      []byte
	keyFile  string // key's file: --secrets-key-file of every node and gateway
	nodes    []*server
	gateways []*gateway
}

func newCluster(t testing.TB) *cluster {
	pg := pgtest.New(t)
	// The cluster's secrets are kept encrypted, with one key for all.
	key := bytes.Repeat([]byte{7}, 32)
	keyFile := filepath.Join(t.TempDir(), "secrets-key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, pg: pg, dsn: pg.NewDatabase(t), key: key, keyFile: keyFile}
}

// addNode starts a node named id; extra are more flags.
func (c *cluster) addNode(id string, extra ...string) *server {
	c.t.Helper()
	// The test's limits are about counts: the machine's memory must not be
	// the bound (sandboxes are given 1 GiB each, and few use it).
	s := newServer(c.t, append([]string{"--max-memory-percent", "1000"}, extra...)...)
	s.cluster = &nodeOf{dsn: c.dsn, id: id, key: c.key}
	s.env = append(s.env, "AENV_SECRETS_KEY_FILE="+c.keyFile)
	s.start()
	c.nodes = append(c.nodes, s)
	return s
}

// gateway is one `aenv gateway` process.
type gateway struct {
	t    testing.TB
	addr string
	url  string
	// raceDir receives a race-enabled gateway's reports (see raceEnv).
	raceDir string
	cmd     *exec.Cmd
	exited  chan struct{}
	logs    *syncBuffer
	dsn     string
	keyFile string
	api     *client.Client
	// extra are more flags of the gateway.
	extra []string
	// run, when set, makes the command that runs the gateway with these
	// flags (a container of its image); else it is serverBin's gateway.
	run func(flags []string) *exec.Cmd
}

// addGateway starts a gateway; extra are more flags.
func (c *cluster) addGateway(extra ...string) *gateway {
	c.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	g := &gateway{t: c.t, addr: l.Addr().String(), dsn: c.dsn, keyFile: c.keyFile, raceDir: c.t.TempDir(), extra: extra}
	l.Close()
	g.url = "http://" + g.addr
	// The gateway's answers are checked against the OpenAPI document too.
	g.api = client.New(client.Config{URL: g.url, APIKey: apiKey,
		HTTP: &http.Client{Transport: wiretest.Transport(c.t, client.NewHTTPClient(4).Transport)}})
	g.start()
	c.t.Cleanup(func() { g.stop(syscall.SIGTERM) })
	c.gateways = append(c.gateways, g)
	return g
}

func (g *gateway) start() {
	g.t.Helper()
	g.logs = &syncBuffer{}
	flags := append([]string{"--database-url", g.dsn, "--secrets-key-file", g.keyFile,
		"--listen", g.addr, "--api-key", apiKey, "--node-timeout-ms", fmt.Sprint(nodeTimeout.Milliseconds()),
		"--log-level", "debug"}, g.extra...)
	if g.run != nil {
		g.cmd = g.run(flags)
	} else {
		g.cmd = exec.Command(serverBin, append([]string{"gateway"}, flags...)...)
		g.cmd.Env = append(os.Environ(), raceEnv(g.raceDir))
	}
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	exited := make(chan struct{})
	g.exited = exited
	go func() { g.cmd.Wait(); close(exited) }()
	waitFor(g.t, time.Minute, "gateway healthy", func() bool {
		select {
		case <-exited:
			g.t.Fatalf("gateway exited during start:\n%s", g.logs.String())
		default:
		}
		resp, err := http.Get(g.url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (g *gateway) stop(sig syscall.Signal) {
	if g.cmd == nil {
		// Not running, or ended by the test: what it reported still counts.
		checkRaces(g.t, "gateway "+g.addr, g.raceDir)
		return
	}
	g.cmd.Process.Signal(sig)
	select {
	case <-g.exited:
	case <-time.After(30 * time.Second):
		g.cmd.Process.Kill()
		g.t.Errorf("gateway did not stop within 30s on %v", sig)
	}
	checkRaces(g.t, "gateway "+g.addr, g.raceDir)
	if g.t.Failed() {
		g.t.Logf("gateway %s logs:\n%s", g.addr, tail(g.logs.String(), 100))
	}
	g.cmd = nil
}

// nodeStates reads GET /cluster/nodes through g.
func (g *gateway) nodeStates(t testing.TB) map[string]client.Node {
	t.Helper()
	nodes, err := g.api.ClusterNodes(context.Background())
	if err != nil {
		t.Fatalf("cluster nodes: %v", err)
	}
	out := map[string]client.Node{}
	for _, n := range nodes {
		out[n.ID] = n
	}
	return out
}

// waitReady waits until every node in ids is ready behind g.
func (g *gateway) waitReady(t testing.TB, ids ...string) {
	t.Helper()
	waitFor(t, time.Minute, "nodes ready", func() bool {
		states := g.nodeStates(t)
		for _, id := range ids {
			if states[id].State != "ready" {
				return false
			}
		}
		return true
	})
}

// sandboxNode returns the node a sandbox is on, as the gateway says.
func (g *gateway) sandboxNode(t testing.TB, id string) (node, state string) {
	t.Helper()
	var out struct {
		NodeID string `json:"nodeID"`
		State  string `json:"state"`
	}
	if _, err := g.api.DoJSON(context.Background(), http.MethodGet, "/sandboxes/"+id, nil, nil, &out); err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return out.NodeID, out.State
}

func (g *gateway) create(t testing.TB) string {
	t.Helper()
	sb, err := g.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("create through gateway %s: %v", g.addr, err)
	}
	return sb.SandboxID
}

func (g *gateway) echo(t testing.TB, id, text string) {
	t.Helper()
	res, err := g.api.Execute(context.Background(), id, client.ExecuteRequest{Command: "echo " + text})
	if err != nil {
		t.Fatalf("exec in %s through gateway %s: %v", id, g.addr, err)
	}
	if strings.TrimSpace(res.Stdout) != text {
		t.Fatalf("exec in %s: stdout %q, want %q", id, res.Stdout, text)
	}
}

// Creates spread over the nodes by their room, a full node gets none, and
// every call reaches the node holding its sandbox through either gateway.
func TestClusterPlacementAndRouting(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	c.addNode("node-b")
	full := c.addNode("node-c", "--max-sandboxes", "2")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a", "node-b", "node-c")

	// Fill node-c to its limit directly, then check that it refuses more.
	for range 2 {
		full.create(map[string]any{"templateID": "base"})
	}
	r := full.doNoFail(http.MethodPost, "/sandboxes", map[string]any{"templateID": "base"})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("create on a full node: %d %s, want 503", r.status, truncate(r.body))
	}
	waitFor(t, 10*time.Second, "node-c's use reported", func() bool { return g1.nodeStates(t)["node-c"].Use.Sandboxes == 2 })

	const creates = 30
	ids := make([]string, creates)
	var wg sync.WaitGroup
	errs := make(chan error, creates)
	sem := make(chan struct{}, 4)
	for i := range creates {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			g := []*gateway{g1, g2}[i%2]
			sb, err := g.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			ids[i] = sb.SandboxID
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for i, id := range ids {
		node, state := []*gateway{g1, g2}[i%2].sandboxNode(t, id)
		if state != "running" {
			t.Errorf("%s: state %q", id, state)
		}
		perNode[node]++
	}
	t.Logf("placement of %d creates: %v", creates, perNode)
	if perNode["node-c"] != 0 {
		t.Errorf("the full node received %d sandboxes", perNode["node-c"])
	}
	// Both nodes with room take a fair share (best of two spreads them).
	if perNode["node-a"] < creates/4 || perNode["node-b"] < creates/4 {
		t.Errorf("creates not spread over the nodes with room: %v", perNode)
	}

	// Every sandbox answers through the other gateway too (routes from the
	// database, not only from the gateway that placed it).
	for i, id := range ids {
		[]*gateway{g2, g1}[i%2].echo(t, id, fmt.Sprintf("hello-%d", i))
	}
	// A sandbox's own log is read on its node, through either gateway.
	checkSandboxLogs(t, g1.api, ids[0])
	checkSandboxLogs(t, g2.api, ids[1])

	// The list sees the whole cluster, page by page.
	seen := map[string]bool{}
	next := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("list does not end")
		}
		q := map[string][]string{"limit": {"7"}}
		if next != "" {
			q["nextToken"] = []string{next}
		}
		var page []struct {
			SandboxID string `json:"sandboxID"`
			NodeID    string `json:"nodeID"`
		}
		h, err := g1.api.DoJSON(context.Background(), http.MethodGet, "/v2/sandboxes", q, nil, &page)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			if p.NodeID == "" {
				t.Errorf("listed %s without its node", p.SandboxID)
			}
			seen[p.SandboxID] = true
		}
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(seen) != creates+2 {
		t.Errorf("list through the gateway saw %d sandboxes, want %d", len(seen), creates+2)
	}

	// A drained node takes no new sandboxes.
	if err := g1.api.DrainNode(context.Background(), "node-a", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "drain seen by the other gateway", func() bool { return g2.nodeStates(t)["node-a"].State == "draining" })
	for range 4 {
		id := g2.create(t)
		if node, _ := g2.sandboxNode(t, id); node != "node-b" {
			t.Errorf("create landed on %s while node-a is drained and node-c full", node)
		}
	}
	// The CLI sees the same, and undrains.
	cli := &server{t: t, url: g1.url}
	var status []client.Node
	if err := json.Unmarshal([]byte(cli.cliOK("cluster", "status", "-o", "json")), &status); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, n := range status {
		states[n.ID] = n.State
	}
	if states["node-a"] != "draining" || states["node-b"] != "ready" || states["node-c"] != "ready" {
		t.Errorf("aenv cluster status: %v", states)
	}
	cli.cliOK("node", "undrain", "node-a")
	if out, code := cli.cli("node", "drain", "no-such-node"); code != 3 {
		t.Errorf("drain of an unknown node: exit %d, want 3 (not found): %s", code, out)
	}
	waitFor(t, 10*time.Second, "undrain seen", func() bool { return g2.nodeStates(t)["node-a"].State == "ready" })

	// Deletes go to the right node; afterwards the sandbox is gone.
	for _, id := range ids[:5] {
		if err := g2.api.DeleteSandbox(context.Background(), id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
		r := g1.doNoFail(http.MethodGet, "/sandboxes/"+id, nil)
		if r.status != http.StatusNotFound {
			t.Errorf("get of killed %s: %d", id, r.status)
		}
	}

	// Without a valid key, nothing.
	req, _ := http.NewRequest(http.MethodGet, g1.url+"/v2/sandboxes", nil)
	req.Header.Set("X-API-Key", "wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong key: %d, want 401", resp.StatusCode)
	}
}

// A node killed -9 is reported unreachable within the bound, its
// sandboxes answer 503 and show so, creates go elsewhere; restarted, it
// serves its sandboxes again.
func TestClusterNodeFailure(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	a := c.addNode("node-a")
	b := c.addNode("node-b")
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")

	onA := a.create(map[string]any{"templateID": "base"}).SandboxID
	onB := b.create(map[string]any{"templateID": "base"}).SandboxID
	g.echo(t, onA, "before")

	a.stop(syscall.SIGKILL)
	// Should the test end early, the node comes back to clean up its
	// sandboxes (they outlive its process).
	defer func() {
		if a.cmd == nil {
			a.start()
		}
	}()
	killed := time.Now()
	waitFor(t, 3*nodeTimeout+5*time.Second, "node-a unreachable", func() bool {
		return g.nodeStates(t)["node-a"].State == "unreachable"
	})
	t.Logf("node-a reported unreachable %v after kill -9", time.Since(killed).Round(10*time.Millisecond))
	if _, state := g.sandboxNode(t, onA); state != "unreachable" {
		t.Errorf("sandbox on the dead node: state %q, want unreachable", state)
	}
	r := g.doNoFail(http.MethodPost, "/sandboxes/"+onA+"/execute", map[string]any{"command": "true"})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "unreachable") {
		t.Errorf("exec on the dead node's sandbox: %d %s, want 503 naming the node unreachable", r.status, truncate(r.body))
	}
	for range 3 {
		id := g.create(t)
		if node, _ := g.sandboxNode(t, id); node != "node-b" {
			t.Errorf("create landed on %s while node-a is down", node)
		}
	}
	g.echo(t, onB, "unaffected")

	a.start()
	g.waitReady(t, "node-a")
	g.echo(t, onA, "after")
	if node, state := g.sandboxNode(t, onA); node != "node-a" || state != "running" {
		t.Errorf("after restart: %s on %s, want running on node-a", state, node)
	}

	// A node gone for good is removed with its records; a live one is not.
	var apiErr *client.APIError
	if err := g.api.RemoveNode(context.Background(), "node-b"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		t.Errorf("removing a live node: %v, want 409", err)
	}
	c3 := c.addNode("node-c")
	g.waitReady(t, "node-c")
	onC := c3.create(map[string]any{"templateID": "base"}).SandboxID
	c3.stop(syscall.SIGKILL)
	waitFor(t, 3*nodeTimeout+5*time.Second, "node-c unreachable", func() bool {
		return g.nodeStates(t)["node-c"].State == "unreachable"
	})
	if err := g.api.RemoveNode(context.Background(), "node-c"); err != nil {
		t.Fatalf("remove node-c: %v", err)
	}
	if _, ok := g.nodeStates(t)["node-c"]; ok {
		t.Error("a removed node is still listed")
	}
	if r := g.doNoFail(http.MethodGet, "/sandboxes/"+onC, nil); r.status != http.StatusNotFound {
		t.Errorf("sandbox of a removed node: %d, want 404", r.status)
	}
	// Should it come back after all, it holds no records: it removes the
	// sandbox it still runs (the leak check at cleanup proves it).
	c3.start()
	g.waitReady(t, "node-c")
	waitFor(t, time.Minute, "the removed node's sandbox reclaimed", func() bool { return runscProcesses(onC) == 0 })
}

// A gateway killed mid-stream leaves the other serving; a restarted
// database is reconnected to by gateways and nodes on their own, and
// nothing acknowledged is lost.
func TestClusterGatewayAndDatabaseFailure(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a")
	id := g1.create(t)

	// A command streaming through g1 when g1 dies.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := g1.api.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	envd := g1.api.Envd(id, sb.EnvdAccessToken)
	firstLine := make(chan struct{})
	streamErr := make(chan error, 1)
	go func() {
		w := &lineSignal{first: firstLine}
		proc, err := envd.Start(ctx, envdclient.ProcessSpec{Cmd: "/bin/bash",
			Args: []string{"-c", "for i in $(seq 1 600); do echo $i; sleep 0.1; done"}})
		if err != nil {
			streamErr <- err
			return
		}
		_, err = proc.Wait(envdclient.Output{Stdout: w, Stderr: io.Discard})
		streamErr <- err
	}()
	select {
	case <-firstLine:
	case <-time.After(30 * time.Second):
		t.Fatal("no output streamed through the gateway")
	}
	g1.stop(syscall.SIGKILL)
	select {
	case err := <-streamErr:
		if err == nil {
			t.Error("the stream through the killed gateway ended cleanly")
		}
	case <-time.After(30 * time.Second):
		t.Error("the stream through the killed gateway did not end")
	}
	g2.echo(t, id, "still-here")

	// The database restarts under the running cluster.
	c.pg.Stop(t)
	// Routed calls need no database: the route is cached.
	g2.echo(t, id, "database-down")
	// Calls that read or write a record answer 503 saying why, never 500:
	// the gateway's own reads, and a node's pause (routed from the cache).
	for _, call := range []struct{ method, path string }{
		{http.MethodGet, "/sandboxes/" + id},
		{http.MethodGet, "/v2/sandboxes"},
		{http.MethodGet, "/sandboxes"},
		{http.MethodPost, "/sandboxes/" + id + "/pause"},
	} {
		r := g2.doNoFail(call.method, call.path, nil)
		if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "database is unavailable") {
			t.Errorf("%s %s with the database down: %d %s, want 503 saying the database is unavailable",
				call.method, call.path, r.status, truncate(r.body))
		}
	}
	// The failed pause left the sandbox as it was: running.
	g2.echo(t, id, "pause-refused")
	c.pg.Start(t)
	var second string
	waitFor(t, time.Minute, "creates work again after the database restart", func() bool {
		sb, err := g2.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
		if err != nil {
			var apiErr *client.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable {
				t.Logf("create during recovery: %v", err)
			}
			return false
		}
		second = sb.SandboxID
		return true
	})
	g2.echo(t, second, "new")
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if _, err := g2.api.DoJSON(context.Background(), http.MethodGet, "/v2/sandboxes", nil, nil, &list); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, sb := range list {
		found[sb.SandboxID] = true
	}
	if !found[id] || !found[second] {
		t.Errorf("list after the database restart lacks acknowledged sandboxes: %v", found)
	}
	waitFor(t, 30*time.Second, "node heartbeat resumed", func() bool { return g2.nodeStates(t)["node-a"].State == "ready" })
}

// lineSignal closes first on the first write.
type lineSignal struct {
	first chan struct{}
	once  sync.Once
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.once.Do(func() { close(l.first) })
	return len(p), nil
}

// doNoFail through a gateway, for the status tests check.
func (g *gateway) doNoFail(method, path string, body any) response {
	g.t.Helper()
	s := &server{t: g.t, url: g.url}
	return s.doNoFail(method, path, body)
}
