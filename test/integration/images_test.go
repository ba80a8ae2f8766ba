package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/release"
	"github.com/aenv-dev/aenv/internal/roottest"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// podman is Debian's container engine with storage of its own (under a
// test's temporary dir, in plain directories: no mounts to leak), so a
// test neither sees nor leaves images on the machine.
type podman struct {
	t      testing.TB
	global []string
}

func newPodman(t testing.TB) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		roottest.SkipOrFail(t, "podman not installed (run scripts/install-deps.sh)")
	}
	// What podman makes outside its storage whatever it is told: a blob
	// cache and its containers' parent cgroups. Removed afterwards unless
	// they were there before (another user's).
	var made []string
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, p := range append([]string{"/var/lib/containers"}, cgroups...) {
		if strings.HasPrefix(p, "/sys/") {
			p = filepath.Join(p, "libpod_parent")
		}
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			made = append(made, p)
		}
	}
	t.Cleanup(func() {
		for _, p := range made {
			if !strings.HasPrefix(p, "/sys/") {
				os.RemoveAll(p)
				continue
			}
			// A cgroup goes with rmdir, children first, once empty.
			dirs, _ := filepath.Glob(filepath.Join(p, "*", ""))
			for _, d := range dirs {
				if fi, err := os.Stat(d); err == nil && fi.IsDir() {
					syscall.Rmdir(d)
				}
			}
			syscall.Rmdir(p)
		}
	})
	dir := t.TempDir()
	return &podman{t: t, global: []string{
		"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run"), "--tmpdir", filepath.Join(dir, "tmp"),
		"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
	}}
}

func (p *podman) command(args ...string) *exec.Cmd {
	return exec.Command("podman", append(append([]string{}, p.global...), args...)...)
}

// output runs podman and returns its standard output, failing the test on
// an error.
func (p *podman) output(args ...string) string {
	p.t.Helper()
	cmd := p.command(args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// loadGatewayImage builds the gateway's image as `make images` does,
// loads it from its tarball as an operator would, and returns its
// reference.
func (p *podman) loadGatewayImage() string {
	p.t.Helper()
	in := release.Inputs{BinDir: binDir, CACerts: "/etc/ssl/certs/ca-certificates.crt",
		Version: "podman-test", Repository: "localhost/aenv", Created: time.Now()}
	images, err := release.BuildAll(in, p.t.TempDir())
	if err != nil {
		p.t.Fatal(err)
	}
	out := p.t.TempDir()
	if err := release.Write(out, images); err != nil {
		p.t.Fatal(err)
	}
	for _, b := range images {
		if name := path.Base(b.Ref.RepositoryStr()); name == "aenv-gateway" {
			return p.load(filepath.Join(out, name+".tar"), b.Ref.String())
		}
	}
	p.t.Fatal("no gateway image was built")
	return ""
}

// load loads an image's tarball, checks podman names it image, and
// returns that name.
func (p *podman) load(tarball, image string) string {
	p.t.Helper()
	if loaded := p.output("load", "-q", "-i", tarball); !strings.Contains(loaded, image) {
		p.t.Fatalf("podman load: %q, want %s", loaded, image)
	}
	return image
}

// limits are the --ulimit flags of a container: podman's defaults raise
// the open-files and process limits past what a host that denies raising
// them allows (runc then fails at start), so a container gets the test's
// own, at most 16384.
func limits(t testing.TB) []string {
	var out []string
	for _, l := range []struct {
		name     string
		resource int
	}{{"nofile", syscall.RLIMIT_NOFILE}, {"nproc", 6 /* RLIMIT_NPROC */}} {
		var r syscall.Rlimit
		if err := syscall.Getrlimit(l.resource, &r); err != nil {
			t.Fatal(err)
		}
		n := min(r.Cur, 16384)
		out = append(out, "--ulimit", fmt.Sprintf("%s=%d:%d", l.name, n, n))
	}
	return out
}

// TestGatewayImageInPodman runs the gateway image `make images` builds in
// a real container engine: loaded from its tarball as an operator would,
// running as its unprivileged user over a real PostgreSQL, in front of a
// node on the host. A sandbox is created and driven through it.
//
// It is the one test of the package not run in parallel: sequential tests
// all run before the parallel ones, so it never overlaps the compose test,
// whose podman would share (and might remove) the blob cache and cgroups
// podman makes outside its own storage.
func TestGatewayImageInPodman(t *testing.T) {
	p := newPodman(t)
	image := p.loadGatewayImage()

	c := newCluster(t)
	c.addNode("node-a")

	// The gateway reaches PostgreSQL through its socket, mounted alone
	// (its directory is the database user's), and reads the cluster's
	// key from a copy its user owns.
	fields := strings.Fields(c.dsn)
	var socketDir, port string
	for i, f := range fields {
		switch {
		case strings.HasPrefix(f, "host="):
			socketDir = strings.TrimPrefix(f, "host=")
			fields[i] = "host=/run/postgresql"
		case strings.HasPrefix(f, "port="):
			port = strings.TrimPrefix(f, "port=")
		}
	}
	socket := ".s.PGSQL." + port
	key, err := os.ReadFile(c.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	keyCopy := filepath.Join(t.TempDir(), "secrets-key")
	if err := os.WriteFile(keyCopy, key, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(keyCopy, release.NonRootUID, release.NonRootUID); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	name := fmt.Sprintf("aenv-gateway-%d", time.Now().UnixNano())
	g := &gateway{t: t, addr: addr, url: "http://" + addr, dsn: strings.Join(fields, " "),
		keyFile: "/run/secrets/aenv-key", raceDir: t.TempDir()}
	g.api = client.New(client.Config{URL: g.url, APIKey: apiKey,
		HTTP: &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}})
	g.run = func(flags []string) *exec.Cmd {
		args := append([]string{"run", "--rm", "--name", name, "--network", "host"}, limits(t)...)
		args = append(args,
			"-v", filepath.Join(socketDir, socket)+":/run/postgresql/"+socket,
			"-v", keyCopy+":/run/secrets/aenv-key:ro",
			image)
		return p.command(append(args, flags...)...)
	}
	t.Cleanup(func() {
		g.stop(syscall.SIGTERM)
		p.command("rm", "--force", "--time", "0", name).Run()
	})
	g.start()
	g.waitReady(t, "node-a")

	// The gateway in the container runs as the image's user, not root.
	pid := p.output("inspect", "--format", "{{.State.Pid}}", name)
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		t.Fatal(err)
	}
	wantUID := fmt.Sprintf("Uid:\t%d\t%d", release.NonRootUID, release.NonRootUID)
	if !strings.Contains(string(status), wantUID) {
		t.Fatalf("the gateway's process is not the image's user (want %q):\n%s", wantUID, status)
	}

	id := g.create(t)
	g.echo(t, id, "through-the-container")
	if node, _ := g.sandboxNode(t, id); node != "node-a" {
		t.Fatalf("sandbox on %q, want node-a", node)
	}
	if err := g.api.DeleteSandbox(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	// SIGTERM to podman reaches the gateway, which ends cleanly.
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway's container did not end within 30s of SIGTERM")
	}
	if code := g.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the gateway's container ended with %d:\n%s", code, tail(g.logs.String(), 40))
	}
	g.cmd = nil
	if left := p.output("ps", "--all", "--quiet"); left != "" {
		t.Fatalf("containers left: %s", left)
	}
}

// nodeBase is a Debian for the node image: the base template's root
// filesystem, a debootstrapped Debian, which the suite's first server
// builds into the shared template cache (a server is started here to
// build it should no test have yet).
func nodeBase(t *testing.T) string {
	t.Helper()
	find := func() string {
		found, _ := filepath.Glob(filepath.Join(templateCache, "base-*", "rootfs", "etc", "os-release"))
		for _, f := range found {
			// A build in progress is base-<key>.partial.
			if dir := filepath.Dir(filepath.Dir(f)); !strings.Contains(filepath.Base(filepath.Dir(dir)), ".") {
				return dir
			}
		}
		return ""
	}
	if dir := find(); dir != "" {
		return dir
	}
	s := newServer(t)
	s.start()
	s.stop(syscall.SIGTERM)
	dir := find()
	if dir == "" {
		t.Fatalf("no base root filesystem in %s after a server started", templateCache)
	}
	return dir
}

// sharedNetnsDir makes /run/netns a shared mount, as `ip netns` does and
// as a server on the host makes it: the namespaces a container's node
// pins there then stay on the host.
func sharedNetnsDir(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		t.Fatal(err)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounted := false
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == "/run/netns" {
			mounted = true
		}
	}
	if !mounted {
		if out, err := exec.Command("mount", "--bind", "/run/netns", "/run/netns").CombinedOutput(); err != nil {
			t.Fatalf("mount --bind /run/netns: %v: %s", err, out)
		}
	}
	if out, err := exec.Command("mount", "--make-shared", "/run/netns").CombinedOutput(); err != nil {
		t.Fatalf("mount --make-shared /run/netns: %v: %s", err, out)
	}
}
