package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/release"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// TestComposeClusterInPodman brings up deploy/compose's whole cluster
// (PostgreSQL, the S3 store, two nodes, a gateway) in a real container
// engine, from the file as it is, and drives it through the gateway: a
// sandbox on one node, its snapshot uploaded to the store, and a sandbox
// from that snapshot on the other node, with the first one's files; a
// node's container replaced, its sandbox adopted by the new one; the E2B
// SDK's sandbox and volumes suites, on the nodes' volume pools.
//
// Neither docker compose nor a registry is here, so:
//   - the file is read by compose-go (the Compose Specification's own
//     loader, which docker compose uses), and each service is run with
//     `podman run` by composeRunner, which does what compose does with the
//     service keys the file uses and refuses any other;
//   - the PostgreSQL and SeaweedFS images the file names are stand-ins
//     built here, under those names, from this machine's PostgreSQL and
//     weed with the same contract (the POSTGRES_* variables, pg_isready;
//     weed's command line).
//
// What the test changes is what tests must own (ports, address ranges,
// network prefixes, data directories), the shared template cache, the
// nodes' volume pools (off in the file) and, so that nothing outlives the
// test, the kill-on-exit of node-b and of node-a's second container; the
// rest is the file's.
func TestComposeClusterInPodman(t *testing.T) {
	t.Parallel() // TestGatewayImageInPodman, the other podman test, runs before every parallel one
	p := newPodman(t)
	keepHostNetworkClean(t)
	gatewayImage := p.loadGatewayImage()
	nodeImage := p.loadNodeImageWithMkfs(nodeBase(t))

	// The project directory, as an operator makes it (the file's header).
	dir := t.TempDir()
	secretsKey := make([]byte, 32)
	rand.Read(secretsKey)
	if err := os.WriteFile(filepath.Join(dir, "secrets-key"), []byte(base64.StdEncoding.EncodeToString(secretsKey)+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	password := make([]byte, 16)
	rand.Read(password)
	// The nodes' data directories are shared with the host both ways: the
	// mounts a node makes for its sandboxes are the host's.
	dataRoot := t.TempDir()
	mounted := false
	t.Cleanup(func() {
		if !mounted {
			return
		}
		if out, err := exec.Command("umount", "--recursive", dataRoot).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dataRoot, err, out)
		}
	})
	for _, args := range [][]string{{"--bind", dataRoot, dataRoot}, {"--make-private", dataRoot}, {"--make-shared", dataRoot}} {
		if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %v: %v: %s", args, err, out)
		}
		mounted = true
	}
	sharedNetnsDir(t)
	env := map[string]string{
		"POSTGRES_PASSWORD":  hex.EncodeToString(password),
		"AENV_API_KEY":       apiKey,
		"AENV_NODE_IMAGE":    nodeImage,
		"AENV_GATEWAY_IMAGE": gatewayImage,
		"AENV_DATA_ROOT":     dataRoot,
	}

	// The images the file takes from registries, made here.
	named := loadCompose(t, dir, env)
	for service, build := range map[string]func(*testing.T, string) string{"postgres": standInPostgres, "s3": standInSeaweed} {
		image := named.Services[service].Image
		p.load(build(t, image), image)
	}

	// The ports last: picked free, they are held only once the services
	// start.
	gatewayAddr := freeAddr(t)
	env["AENV_GATEWAY_LISTEN"] = gatewayAddr
	env["AENV_POSTGRES_PORT"] = portOf(t, freeAddr(t))
	env["AENV_S3_PORT"] = portOf(t, freeAddr(t))
	project := loadCompose(t, dir, env)

	// What a test owns. node-b kills its sandboxes when it stops, the
	// harness's way; node-a starts as the file has it, keeping them, to be
	// replaced by a new container that adopts them (and kills them when it
	// stops).
	nodes := map[string]*server{}
	for _, id := range []string{"node-a", "node-b"} {
		svc := project.Services[id]
		addr := freeAddr(t)
		n := &server{t: t, prefix: "it" + randomLetters(3), cidr: randomCIDR(), dataDir: *svc.Environment["AENV_DATA_DIR"]}
		n.listenOn(addr)
		for k, v := range map[string]string{
			"AENV_LISTEN": addr, "AENV_ADVERTISE": addr, "AENV_NET_PREFIX": n.prefix, "AENV_SANDBOX_CIDR": n.cidr,
			"AENV_TEMPLATE_CACHE_DIR": templateCache, "AENV_WARM_SLOTS": "2",
			"AENV_LOG_LEVEL": "debug", "AENV_VOLUME_POOL_GB": "1",
		} {
			svc.Environment[k] = &v
		}
		svc.Volumes = append(svc.Volumes, types.ServiceVolumeConfig{Type: types.VolumeTypeBind, Source: templateCache, Target: templateCache})
		project.Services[id] = svc
		nodes[id] = n
		t.Cleanup(n.checkNoLeaks) // after the containers are stopped
	}
	killOnExit(project, "node-b")

	run := &composeRunner{t: t, p: p, project: project}
	g := &gateway{t: t, addr: gatewayAddr, url: "http://" + gatewayAddr}
	g.api = client.New(client.Config{URL: g.url, APIKey: apiKey,
		HTTP: &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}})
	t.Cleanup(func() {
		// Sandboxes first, while the cluster runs, then the services.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if sandboxes, err := g.api.ListSandboxes(ctx, ""); err == nil {
			for _, sb := range sandboxes {
				g.api.DeleteSandbox(ctx, sb.SandboxID)
			}
		}
		defer run.down() // should what follows fail too
		// A failure may have left sandboxes of node-a's first container,
		// which keeps them: a container that kills its sandboxes when it
		// stops adopts and ends them, while the database is still up.
		if slices.Contains(run.started, "node-a") {
			run.stop("node-a")
		}
		if leftBehind(nodes["node-a"].dataDir) {
			killOnExit(project, "node-a")
			run.start(project.Services["node-a"])
			run.waitHealthyURL("node-a", nodes["node-a"].url)
		}
	})
	run.up()
	waitFor(t, 2*time.Minute, "the gateway healthy", func() bool {
		resp, err := http.Get(g.url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	waitForEvery(t, 5*time.Minute, time.Second, "both nodes ready behind the gateway", func() bool {
		nodes, err := g.api.ClusterNodes(context.Background())
		if err != nil {
			return false
		}
		ready := 0
		for _, n := range nodes {
			if n.State == "ready" {
				ready++
			}
		}
		return ready == 2
	})

	// A sandbox, a file in it, and its snapshot in the object store.
	ctx := context.Background()
	first := g.create(t)
	g.echo(t, first, "in-compose")
	if _, err := g.api.Execute(ctx, first, client.ExecuteRequest{Command: "echo kept > /tmp/state"}); err != nil {
		t.Fatal(err)
	}
	firstNode, _ := g.sandboxNode(t, first)
	snap, err := g.api.CreateSnapshot(ctx, first, "compose-snap")
	if err != nil {
		t.Fatalf("snapshot through the gateway: %v", err)
	}
	waitFor(t, 3*time.Minute, "the snapshot uploaded", func() bool {
		state, msg := templateUpload(t, g, snap.SnapshotID)
		if msg != "" {
			t.Logf("upload attempt failed (retried): %s", msg)
		}
		return state == "uploaded"
	})

	// Its node drained, the snapshot's sandbox starts on the other node,
	// from the store.
	if err := g.api.DrainNode(ctx, firstNode, true); err != nil {
		t.Fatal(err)
	}
	sb, err := g.api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "compose-snap"})
	if err != nil {
		t.Fatalf("create from the snapshot on the other node: %v", err)
	}
	if node, _ := g.sandboxNode(t, sb.SandboxID); node == firstNode || node == "" {
		t.Fatalf("the snapshot's sandbox is on %q, want the node that is not %s", node, firstNode)
	}
	res, err := g.api.Execute(ctx, sb.SandboxID, client.ExecuteRequest{Command: "cat /tmp/state"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "kept\n" {
		t.Fatalf("the sandbox from the snapshot has %q in /tmp/state, want kept", res.Stdout)
	}
	if err := g.api.DrainNode(ctx, firstNode, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, firstNode+" ready again", func() bool { return g.nodeStates(t)[firstNode].State == "ready" })
	for _, id := range []string{first, sb.SandboxID} {
		if err := g.api.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// node-a's container replaced, as a new image or `compose up
	// --force-recreate` does: a sandbox on it, with a file and a process,
	// outlives the container, and the new container adopts it.
	if err := g.api.DrainNode(ctx, "node-b", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-b draining", func() bool { return g.nodeStates(t)["node-b"].State == "draining" })
	// node-a learns it is no longer drained (step 3 may have drained it)
	// at its next look at the database: until then it refuses.
	var kept string
	waitFor(t, 30*time.Second, "a sandbox placed on node-a", func() bool {
		sb, err := g.api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
		kept = sb.SandboxID
		return err == nil
	})
	if err := g.api.DrainNode(ctx, "node-b", false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "node-b ready again", func() bool { return g.nodeStates(t)["node-b"].State == "ready" })
	if node, _ := g.sandboxNode(t, kept); node != "node-a" {
		t.Fatalf("sandbox on %q, want node-a", node)
	}
	state := client.ExecuteRequest{Command: "echo kept > /tmp/state; nohup sleep 1000 >/dev/null 2>&1 &"}
	if _, err := g.api.Execute(ctx, kept, state); err != nil {
		t.Fatal(err)
	}
	run.stop("node-a")
	if runscProcesses(kept) == 0 {
		t.Fatal("the sandbox ended with node-a's container")
	}
	killOnExit(project, "node-a") // the new container: the harness's way
	run.start(project.Services["node-a"])
	// A node answers /health once it has adopted what it found, which can
	// be before its first heartbeat is in the database; the gateway routes
	// to it once that heartbeat is there.
	run.waitHealthyURL("node-a", nodes["node-a"].url)
	g.waitReady(t, "node-a")
	res, err = g.api.Execute(ctx, kept, client.ExecuteRequest{Command: "cat /tmp/state; pgrep -x sleep >/dev/null && echo sleeper"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "kept\nsleeper\n" {
		t.Fatalf("the adopted sandbox lost its state: %+v", res)
	}
	if node, state := g.sandboxNode(t, kept); node != "node-a" || state != "running" {
		t.Fatalf("sandbox on %q in state %q, want node-a, running", node, state)
	}
	if err := g.api.DeleteSandbox(ctx, kept); err != nil {
		t.Fatal(err)
	}

	// The E2B SDK's suite, the files that ask nothing of a server's own,
	// through the compose cluster's gateway.
	// A hung suite is ended (its whole process group) in time for the
	// cleanups to take the cluster down.
	suiteCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	e2e := exec.CommandContext(suiteCtx, "./run.sh", "sandbox.test.mjs", "volumes.test.mjs")
	e2e.Dir = filepath.Join("..", "..", "e2e")
	e2e.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	e2e.Cancel = func() error { return syscall.Kill(-e2e.Process.Pid, syscall.SIGKILL) }
	e2e.WaitDelay = 10 * time.Second
	e2e.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "AENV_E2E_") // the suite's own modes: not here
	})
	e2e.Env = append(e2e.Env, "AENV_E2E_URL="+g.url, "AENV_E2E_API_KEY="+apiKey, "AENV_BIN_DIR="+binDir,
		"AENV_E2E_VOLUME_POOL=1", "AENV_E2E_REPORTER=spec")
	out, err := e2e.CombinedOutput()
	if err != nil {
		t.Fatalf("the E2B SDK suite through the compose cluster: %v\n%s", err, tail(string(out), 80))
	}
	passed := regexp.MustCompile(`(?m)^ℹ pass (\d+)$`).FindSubmatch(out)
	if passed == nil || string(passed[1]) == "0" {
		t.Fatalf("the E2B SDK suite through the compose cluster passed no test:\n%s", tail(string(out), 40))
	}
	t.Logf("the E2B SDK suite through the compose cluster: %s tests passed", passed[1])

	// The suite killed what it made.
	left, err := g.api.ListSandboxes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("the E2B SDK suite left %d sandboxes: %+v", len(left), left)
	}
}

// loadNodeImageWithMkfs builds and loads the node image as `make images`
// does, over nodeBase (the base template's Debian) with btrfs-progs'
// mkfs.btrfs and erofs-utils' mkfs.erofs from this machine added, as `make
// images` installs those packages: a node in a container makes its volume
// pool and its root images with them (their libraries are in the base).
func (p *podman) loadNodeImageWithMkfs(nodeBase string) string {
	p.t.Helper()
	in := release.Inputs{BinDir: binDir, NodeBase: nodeBase, Version: "podman-test-mkfs", Repository: "localhost/aenv", Created: time.Now()}
	spec := release.NodeSpec(in)
	for _, tool := range []string{"mkfs.btrfs", "mkfs.erofs"} {
		path, err := exec.LookPath(tool)
		if err != nil {
			p.t.Fatalf("%s: %v (run scripts/install-deps.sh)", tool, err)
		}
		spec.Files = append(spec.Files, release.File{Src: path, Dst: "/usr/sbin/" + tool, Mode: 0o755})
	}
	ref := in.Repository + "/aenv-node:" + in.Version
	return p.load(writeStandIn(p.t, ref, spec), ref)
}

// leftBehind reports whether processes or mounts of a node's data
// directory are on the host: what a node that keeps its sandboxes leaves
// when it stops.
func leftBehind(dataDir string) bool {
	if out, _ := exec.Command("pgrep", "-f", dataDir).Output(); len(bytes.TrimSpace(out)) > 0 {
		return true
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	return bytes.Contains(mounts, []byte(dataDir+"/"))
}

// killOnExit makes a node service's next container kill its sandboxes
// when it stops.
func killOnExit(project *types.Project, name string) {
	svc := project.Services[name]
	yes := "true"
	svc.Environment["AENV_KILL_ON_EXIT"] = &yes
	project.Services[name] = svc
}

// portOf is the port of a host:port address.
func portOf(t testing.TB, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// loadCompose reads deploy/compose/compose.yaml as `docker compose
// --project-directory dir` would (dir "": the file's own), with env as its
// .env.
func loadCompose(t testing.TB, dir string, env map[string]string) *types.Project {
	t.Helper()
	file, err := filepath.Abs("../../deploy/compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir = filepath.Dir(file)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	project, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: file, Content: raw}},
		Environment: env,
	}, func(o *loader.Options) { o.SetProjectName("aenv", true) })
	if err != nil {
		t.Fatalf("deploy/compose: %v", err)
	}
	return project
}

// composeRunner runs a compose project's services with podman, in
// dependency order, as compose does with the keys deploy/compose uses.
type composeRunner struct {
	t       testing.TB
	p       *podman
	project *types.Project
	started []string // services, in the order they were started
}

func (r *composeRunner) container(service string) string {
	return r.project.Name + "-" + service + "-1"
}

// composeKeys are the service keys composeRunner does what compose does
// with (restart alone it leaves: a test's containers are not restarted).
var composeKeys = []string{"name", "image", "command", "entrypoint", "environment", "ports", "volumes", "secrets",
	"healthcheck", "depends_on", "privileged", "network_mode", "pid", "cgroup", "stop_grace_period", "restart", "networks"}

// check refuses a service key composeRunner does not know, so that a key
// added to the file is either taught here or seen to be untested.
func (r *composeRunner) check() {
	r.t.Helper()
	for name, svc := range r.project.Services {
		raw, err := json.Marshal(svc)
		if err != nil {
			r.t.Fatal(err)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			r.t.Fatal(err)
		}
		for k, v := range keys {
			switch {
			case !slices.Contains(composeKeys, k):
				r.t.Errorf("compose: %s: key %s (%s) is not one this test's runner knows", name, k, v)
			case k == "networks" && string(v) != `{"default":null}`:
				// Only the default network compose gives a service
				// without network_mode.
				r.t.Errorf("compose: %s: networks %s are not one this test's runner knows", name, v)
			}
		}
	}
	if r.t.Failed() {
		r.t.FailNow()
	}
}

// up starts every service once what it depends on is started, or healthy
// when it says so.
func (r *composeRunner) up() {
	r.t.Helper()
	r.check()
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range r.project.Services {
			if !yield(name) {
				return
			}
		}
	})
	for len(r.started) < len(names) {
		progressed := false
		for _, name := range names {
			svc := r.project.Services[name]
			if slices.Contains(r.started, name) || !r.ready(svc) {
				continue
			}
			r.start(svc)
			progressed = true
		}
		if !progressed {
			r.t.Fatalf("compose: services %v wait on each other", names)
		}
	}
}

// ready reports whether what svc depends on is up, waiting for a health
// check it names.
func (r *composeRunner) ready(svc types.ServiceConfig) bool {
	r.t.Helper()
	for dep, cond := range svc.DependsOn {
		if !slices.Contains(r.started, dep) {
			return false
		}
		switch cond.Condition {
		case types.ServiceConditionStarted:
		case types.ServiceConditionHealthy:
			r.waitHealthy(r.project.Services[dep])
		default:
			r.t.Fatalf("compose: %s: depends_on condition %q is not one this runner knows", svc.Name, cond.Condition)
		}
	}
	return true
}

// waitHealthy runs a service's health check in its container until it
// passes, as often and as many times as the check says.
func (r *composeRunner) waitHealthy(svc types.ServiceConfig) {
	r.t.Helper()
	hc := svc.HealthCheck
	if hc == nil || len(hc.Test) < 2 || hc.Test[0] != "CMD" || hc.Interval == nil || hc.Retries == nil {
		r.t.Fatalf("compose: %s: a health check of CMD, interval and retries is what this runner knows, not %+v", svc.Name, hc)
	}
	var out []byte
	for range *hc.Retries {
		var err error
		out, err = r.p.command(append([]string{"exec", r.container(svc.Name)}, hc.Test[1:]...)...).CombinedOutput()
		if err == nil {
			return
		}
		time.Sleep(time.Duration(*hc.Interval))
	}
	logs, _ := r.p.command("logs", r.container(svc.Name)).CombinedOutput()
	r.t.Fatalf("compose: %s not healthy after %d checks: %s\nits logs:\n%s", svc.Name, *hc.Retries, out, tail(string(logs), 40))
}

// waitHealthyURL waits until a service answers 200 on url's /health,
// failing with its container's logs should it not within two minutes.
func (r *composeRunner) waitHealthyURL(name, url string) {
	r.t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	var state []byte
	for time.Now().Before(deadline) {
		if resp, err := hc.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		state, _ = r.p.command("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", r.container(name)).CombinedOutput()
		if !bytes.HasPrefix(state, []byte("running")) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	logs, _ := r.p.command("logs", r.container(name)).CombinedOutput()
	r.t.Fatalf("compose: %s did not answer on %s/health (container: %s); its logs:\n%s",
		name, url, bytes.TrimSpace(state), tail(string(logs), 40))
}

// start runs one service's container.
func (r *composeRunner) start(svc types.ServiceConfig) {
	r.t.Helper()
	// Counted started before it is: a failed run may leave a container.
	r.started = append(r.started, svc.Name)
	args := append([]string{"run", "--detach", "--pull", "never", "--name", r.container(svc.Name)}, limits(r.t)...)
	if svc.Privileged {
		args = append(args, "--privileged")
	}
	if svc.NetworkMode != "" {
		args = append(args, "--network", svc.NetworkMode)
	}
	if svc.Pid != "" {
		args = append(args, "--pid", svc.Pid)
	}
	if svc.Cgroup != "" {
		args = append(args, "--cgroupns", svc.Cgroup)
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range svc.Environment {
			if !yield(k) {
				return
			}
		}
	}) {
		if v := svc.Environment[k]; v != nil {
			args = append(args, "--env", k+"="+*v)
		}
	}
	for _, pc := range svc.Ports {
		publish := fmt.Sprintf("%s:%d/%s", pc.Published, pc.Target, pc.Protocol)
		if pc.HostIP != "" {
			publish = net.JoinHostPort(pc.HostIP, pc.Published) + fmt.Sprintf(":%d/%s", pc.Target, pc.Protocol)
		}
		args = append(args, "--publish", publish)
	}
	for _, v := range svc.Volumes {
		switch v.Type {
		case types.VolumeTypeBind:
			var opts []string
			if v.Bind != nil {
				if v.Bind.CreateHostPath {
					if err := os.MkdirAll(v.Source, 0o755); err != nil {
						r.t.Fatal(err)
					}
				}
				if v.Bind.Propagation != "" {
					opts = append(opts, v.Bind.Propagation)
				}
			}
			if v.ReadOnly {
				opts = append(opts, "ro")
			}
			spec := v.Source + ":" + v.Target
			if len(opts) > 0 {
				spec += ":" + strings.Join(opts, ",")
			}
			args = append(args, "--volume", spec)
		case types.VolumeTypeVolume:
			spec := r.project.Volumes[v.Source].Name + ":" + v.Target
			if v.ReadOnly {
				spec += ":ro"
			}
			args = append(args, "--volume", spec)
		default:
			r.t.Fatalf("compose: %s: a %s volume is not one this runner knows", svc.Name, v.Type)
		}
	}
	for _, s := range svc.Secrets {
		secret, ok := r.project.Secrets[s.Source]
		if !ok || secret.File == "" {
			r.t.Fatalf("compose: %s: secret %s is not a file", svc.Name, s.Source)
		}
		target := s.Target
		if target == "" {
			target = s.Source
		}
		if !strings.HasPrefix(target, "/") {
			target = "/run/secrets/" + target
		}
		args = append(args, "--volume", secret.File+":"+target+":ro")
	}
	if len(svc.Entrypoint) > 0 {
		args = append(args, "--entrypoint", svc.Entrypoint[0])
	}
	args = append(args, svc.Image)
	args = append(args, svc.Entrypoint[min(1, len(svc.Entrypoint)):]...)
	args = append(args, svc.Command...)
	r.p.output(args...)
}

// down stops the services in the reverse order of their start, each
// given its stop_grace_period, and removes their containers.
func (r *composeRunner) down() {
	for _, name := range slices.Backward(slices.Clone(r.started)) {
		r.stop(name)
	}
	if left := r.p.output("ps", "--all", "--quiet"); left != "" {
		r.t.Errorf("containers left: %s", left)
	}
}

// stop stops one service's container, given its stop_grace_period, and
// removes it, as `compose down` does to each.
func (r *composeRunner) stop(name string) {
	svc := r.project.Services[name]
	grace := 10 * time.Second
	if svc.StopGracePeriod != nil {
		grace = time.Duration(*svc.StopGracePeriod)
	}
	c := r.container(name)
	if out, err := r.p.command("stop", "--time", fmt.Sprint(int(grace.Seconds())), c).CombinedOutput(); err != nil {
		r.t.Errorf("podman stop %s: %v: %s", c, err, out)
	}
	if r.t.Failed() {
		logs, _ := r.p.command("logs", c).CombinedOutput()
		r.t.Logf("%s's logs:\n%s", name, tail(string(logs), 60))
	}
	r.p.command("rm", "--force", "--time", "0", c).Run()
	r.started = slices.DeleteFunc(r.started, func(s string) bool { return s == name })
}

// keepHostNetworkClean removes, after the test, what podman's bridge
// network (CNI) adds to the host for published ports and that podman
// leaves behind: its bridge, its iptables chains and its state, unless
// they were there before.
func keepHostNetworkClean(t *testing.T) {
	t.Helper()
	_, bridgeErr := net.InterfaceByName("cni-podman0")
	_, stateErr := os.Stat("/var/lib/cni")
	chains := map[string]bool{}
	for _, table := range []string{"nat", "filter"} {
		for _, c := range cniChains(table) {
			chains[table+"/"+c] = true
		}
	}
	t.Cleanup(func() {
		if bridgeErr != nil {
			exec.Command("ip", "link", "delete", "cni-podman0").Run()
		}
		if stateErr != nil {
			os.RemoveAll("/var/lib/cni")
		}
		for _, table := range []string{"nat", "filter"} {
			// Rules jumping to a chain go first, then the chains.
			var made []string
			for _, c := range cniChains(table) {
				if !chains[table+"/"+c] {
					made = append(made, c)
				}
			}
			if len(made) == 0 {
				continue
			}
			rules, _ := exec.Command("iptables", "-t", table, "-S").Output()
			for _, line := range strings.Split(string(rules), "\n") {
				f := ruleFields(line)
				if len(f) < 2 || f[0] != "-A" || slices.Contains(made, f[1]) {
					continue
				}
				if i := slices.Index(f, "-j"); i >= 0 && i+1 < len(f) && slices.Contains(made, f[i+1]) {
					del := append([]string{"-t", table, "-D"}, f[1:]...)
					if out, err := exec.Command("iptables", del...).CombinedOutput(); err != nil {
						t.Errorf("iptables %v: %v: %s", del, err, out)
					}
				}
			}
			for _, c := range made {
				exec.Command("iptables", "-t", table, "-F", c).Run()
			}
			for _, c := range made {
				if out, err := exec.Command("iptables", "-t", table, "-X", c).CombinedOutput(); err != nil {
					t.Errorf("iptables -t %s -X %s: %v: %s", table, c, err, out)
				}
			}
		}
	})
}

// ruleFields splits a line of `iptables -S` into its arguments: words,
// and quoted comments whole, with their escaped quotes (CNI's name
// theirs: "name: \"podman\" id: \"…\"").
func ruleFields(line string) []string {
	var fields []string
	var field strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			field.WriteByte(line[i])
		case c == '"':
			quoted, inWord = !quoted, true
		case !quoted && (c == ' ' || c == '\t'):
			if inWord {
				fields = append(fields, field.String())
				field.Reset()
				inWord = false
			}
		default:
			field.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		fields = append(fields, field.String())
	}
	return fields
}

// cniChains lists the chains of an iptables table that CNI made.
func cniChains(table string) []string {
	out, _ := exec.Command("iptables", "-t", table, "-S").Output()
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "CNI-") {
			chains = append(chains, f[1])
		}
	}
	return chains
}

// standInPostgres builds an image named ref that does what the official
// PostgreSQL image does for deploy/compose: a database cluster made on
// first start in its volume, owned by POSTGRES_USER with POSTGRES_PASSWORD,
// a database POSTGRES_DB, password logins over TCP, and pg_isready. It is
// this machine's PostgreSQL, with the libraries its programs load, and it
// returns the image's tarball.
func standInPostgres(t *testing.T, ref string) string {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) == 0 {
		t.Fatal("no PostgreSQL under /usr/lib/postgresql (run scripts/install-deps.sh)")
	}
	// The newest, as pgtest takes.
	slices.SortFunc(matches, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(a))))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(b))))
		return va - vb
	})
	pgBin := filepath.Dir(matches[len(matches)-1])
	version := filepath.Base(filepath.Dir(pgBin))
	// The data directory is made by root and handed over, as the official
	// image's entrypoint does (gosu there, setpriv here); the user is named
	// POSTGRES_USER, so that initdb makes that role its superuser.
	const entrypoint = `set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
PGDATA=/var/lib/postgresql/data
printf 'root:x:0:0:root:/root:/bin/sh\n%s:x:999:999::/var/lib/postgresql:/bin/sh\n' "$POSTGRES_USER" > /etc/passwd
as_postgres() { setpriv --reuid=999 --regid=999 --clear-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown 999:999 "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	umask 077
	printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
	chown 999:999 /tmp/pwfile
	as_postgres initdb -D "$PGDATA" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 --locale=C -E UTF8 >/dev/null
	rm /tmp/pwfile
	echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		echo "CREATE DATABASE \"$POSTGRES_DB\";" | as_postgres postgres --single -D "$PGDATA" postgres >/dev/null
	fi
fi
case "$1" in -*) set -- postgres "$@" ;; esac
exec setpriv --reuid=999 --regid=999 --clear-groups "$@" -D "$PGDATA" -c listen_addresses='*'
`
	spec := release.Spec{
		Skeleton: map[string][]byte{
			"/etc/passwd":                  []byte("root:x:0:0:root:/root:/bin/sh\n"),
			"/etc/group":                   []byte("root:x:0:\npostgres:x:999:\n"),
			"/usr/local/bin/entrypoint.sh": []byte(entrypoint),
		},
		Dirs:       map[string]fs.FileMode{"/tmp": 0o777 | fs.ModeSticky, "/var/lib/postgresql": 0o755},
		Entrypoint: []string{"/bin/sh", "/usr/local/bin/entrypoint.sh"},
		Cmd:        []string{"postgres"},
		Env:        []string{"PATH=" + pgBin + ":/usr/bin:/bin"},
		Volumes:    []string{"/var/lib/postgresql/data"},
	}
	for _, prog := range []string{"/bin/sh", "/usr/bin/mkdir", "/usr/bin/chown", "/usr/bin/chmod", "/usr/bin/rm", "/usr/bin/setpriv"} {
		spec.Files = append(spec.Files, release.File{Src: prog, Dst: prog, Mode: 0o755})
	}
	addHostFiles(t, &spec, filepath.Dir(pgBin), "/usr/share/postgresql/"+version, "/usr/share/zoneinfo")
	return writeStandIn(t, ref, spec)
}

// standInSeaweed builds an image named ref that runs this machine's weed
// as the official SeaweedFS image runs it (its arguments are weed's), and
// returns the image's tarball.
func standInSeaweed(t *testing.T, ref string) string {
	t.Helper()
	weed := filepath.Join(binDir, "weed")
	spec := release.Spec{
		Skeleton:   map[string][]byte{"/etc/passwd": []byte("root:x:0:0:root:/root:/bin/sh\n")},
		Dirs:       map[string]fs.FileMode{"/tmp": 0o777 | fs.ModeSticky, "/data": 0o755},
		Files:      []release.File{{Src: weed, Dst: "/usr/bin/weed", Mode: 0o755}},
		Entrypoint: []string{"/usr/bin/weed"},
		Volumes:    []string{"/data"},
	}
	addHostFiles(t, &spec)
	return writeStandIn(t, ref, spec)
}

// addHostFiles adds to spec every file under the host's trees (a link as
// the file it names), then the shared libraries that its programs and
// libraries load, as ldd finds them here, at the same paths.
func addHostFiles(t *testing.T, spec *release.Spec, trees ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, f := range spec.Files {
		have[f.Dst] = true
	}
	add := func(p string) {
		if have[p] {
			return
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().IsRegular() {
			have[p] = true
			spec.Files = append(spec.Files, release.File{Src: p, Dst: p, Mode: st.Mode().Perm()})
		}
	}
	for _, tree := range trees {
		err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				add(p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range slices.Clone(spec.Files) {
		if head, err := readHead(f.Src, 4); err != nil || string(head) != "\x7fELF" {
			continue
		}
		out, err := exec.Command("ldd", f.Src).Output()
		if err != nil {
			continue // not a dynamic program or library
		}
		for _, line := range strings.Split(string(out), "\n") {
			switch f := strings.Fields(line); {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				add(f[2])
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				add(f[0])
			}
		}
	}
}

// readHead reads a file's first n bytes.
func readHead(file string, n int) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, n)
	_, err = io.ReadFull(f, head)
	return head, err
}

// writeStandIn builds spec as the image ref and writes its tarball.
func writeStandIn(t testing.TB, ref string, spec release.Spec) string {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := release.Build(spec, time.Now(), t.TempDir())
	if err != nil {
		t.Fatalf("stand-in %s: %v", ref, err)
	}
	file := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestIptablesRuleFields(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line string
		want []string
	}{
		{`-N CNI-FORWARD`, []string{"-N", "CNI-FORWARD"}},
		{`-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`,
			[]string{"-A", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", "CNI-HOSTPORT-MASQ"}},
		{`-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"podman\" id: \"abc\"" -j CNI-DN-1`,
			[]string{"-A", "CNI-HOSTPORT-DNAT", "-p", "tcp", "-m", "comment", "--comment", `dnat name: "podman" id: "abc"`, "-j", "CNI-DN-1"}},
	} {
		if got := ruleFields(c.line); !slices.Equal(got, c.want) {
			t.Errorf("ruleFields(%s) = %q, want %q", c.line, got, c.want)
		}
	}
}
