package systemd_test

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

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/roottest"
)

// The server the unit starts: its own port, sandbox range and names, as
// every server of the tests has.
const (
	bootNetPrefix   = "aenvunit"
	bootSandboxCIDR = "10.231.240.0/24"
	testCache       = "/var/cache/aenv-test"
	bootAPIKey      = "aenv-unit-test-key"
)

// TestAenvServiceUnderSystemd installs aenv with scripts/install.sh, for
// real (no --destdir), into a container booted by systemd-nspawn whose root
// is this machine's own (an overlay on a tmpfs, thrown away after), starts
// aenv.service with systemctl and waits for /health and for its log in the
// journal. A sandbox is made, and `systemctl restart aenv` must keep it:
// the next server adopts it with its files and processes. The machines the
// tests run on have no systemd as PID 1; systemd as the container's PID 1
// is the real one.
func TestAenvServiceUnderSystemd(t *testing.T) {
	roottest.Require(t)
	for _, tool := range []string{"systemd-nspawn", "nsenter", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			roottest.SkipOrFail(t, tool+" is missing (scripts/install-deps.sh installs it)")
		}
	}
	if _, err := os.Stat("/lib/systemd/systemd"); err != nil {
		roottest.SkipOrFail(t, "this machine has no systemd to boot a container with")
	}
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		roottest.SkipOrFail(t, "AENV_BIN_DIR (aenv, envd and runsc, as make build leaves them) is not set")
	}
	binDir, _ = filepath.Abs(binDir)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	// The container's root: this machine's, with writes kept in a tmpfs.
	dir := t.TempDir()
	layers, merged := filepath.Join(dir, "layers"), filepath.Join(dir, "root")
	for _, d := range []string{layers, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", layers, "tmpfs", 0, "size=1g"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(layers, unix.MNT_DETACH) })
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(layers, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=/,upperdir=" + layers + "/upper,workdir=" + layers + "/work"
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })

	args := []string{"-D", merged, "--boot", "--machine=aenv-unit-" + strconv.Itoa(os.Getpid()),
		"--register=no", "--keep-unit", "--capability=all", "--tmpfs=/var/lib/aenv",
		"--bind-ro=" + repo + ":/opt/aenv-src", "--bind-ro=" + binDir + ":/opt/aenv-bin"}
	if _, err := os.Stat(testCache); err == nil {
		args = append(args, "--bind="+testCache) // the base template, built once per machine
	}
	// nspawn mounts a cgroup v1 hierarchy read-only; runsc writes to each.
	// They come in beside, and are mounted over the read-only ones once
	// the container runs. Each is the container's own cgroup, which is
	// this process's (nspawn --keep-unit moves no v1 controller): the
	// root of the container's cgroup namespace, as runsc reads its own
	// cgroup's path relative to it.
	controllers := cgroupV1Controllers(t)
	own := ownCgroups(t)
	for _, c := range controllers {
		args = append(args, "--bind=/sys/fs/cgroup/"+c+own[c]+":/opt/aenv-host-cgroup/"+c)
	}
	// basic.target: none of this machine's own services (a database, ...).
	args = append(args, "--", "--unit=basic.target")
	// The console goes to a file, which nspawn writes itself: read at
	// any time for a failure's message.
	consolePath := filepath.Join(dir, "console")
	console, err := os.Create(consolePath)
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	nspawn := exec.Command("systemd-nspawn", args...)
	// The server enables forwarding in /proc/sys, read-only in a container.
	nspawn.Env = append(os.Environ(), "SYSTEMD_NSPAWN_API_VFS_WRITABLE=1")
	nspawn.Stdout, nspawn.Stderr = console, console
	nspawn.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := nspawn.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = nspawn.Wait(); close(exited) }()
	t.Cleanup(func() {
		// SIGTERM: the container shuts down (the server with it).
		_ = nspawn.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-nspawn.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		// Left only by a server that did not stop cleanly.
		_ = exec.Command("nft", "delete", "table", "inet", bootNetPrefix).Run()
	})

	initPID := waitContainerInit(t, nspawn.Process.Pid, exited, consolePath)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	in := func(script string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(initPID), "-a", "bash", "-ec", script).CombinedOutput()
		if err != nil {
			ps, _ := exec.Command("ps", "-ef", "--forest").Output()
			t.Fatalf("in the container (init %d): %s: %v\n%s\nconsole:\n%s\n%s", initPID, script, err, out, readConsole(consolePath), ps)
		}
		return string(out)
	}
	// Booted: "running", or "degraded" for a unit of this machine's that
	// fails in a container; either way systemd serves. Until systemd has
	// made /run/systemd/system, systemctl says "offline" (not booted with
	// systemd), and until its socket is up it cannot connect: then again.
	for {
		out, _ := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(initPID), "-a",
			"systemctl", "is-system-running", "--wait").CombinedOutput()
		s := strings.TrimSpace(string(out))
		if s == "running" || s == "degraded" {
			break
		}
		early := s == "offline" || strings.Contains(s, "Failed to connect to bus")
		if !early || ctx.Err() != nil {
			t.Fatalf("container's systemd: %q\n%s", s, readConsole(consolePath))
		}
		time.Sleep(100 * time.Millisecond) // its socket has no event to wait on from here
	}

	for _, c := range controllers {
		in("mount --bind /opt/aenv-host-cgroup/" + c + " /sys/fs/cgroup/" + c)
	}
	port := freePort(t)
	t.Log(in("/opt/aenv-src/scripts/install.sh --bin-dir /opt/aenv-bin"))
	in(fmt.Sprintf(`cat >/etc/aenv/server.env <<EOF
AENV_LISTEN=127.0.0.1:%d
AENV_SANDBOX_CIDR=%s
AENV_NET_PREFIX=%s
AENV_TEMPLATE_CACHE_DIR=%s
AENV_API_KEY=%s
AENV_WARM_SANDBOXES=0
AENV_PREPARED_SANDBOXES=0
AENV_WARM_SNAPSHOTS=0
EOF`, port, bootSandboxCIDR, bootNetPrefix, testCache, bootAPIKey))
	in("systemctl start aenv")

	health := fmt.Sprintf("http://127.0.0.1:%d/health", port)
	waitHealthy := func() {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			resp, err := http.Get(health)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not answer 200: %v\n%s", health, err, in("systemctl status aenv --no-pager || true; journalctl -u aenv --no-pager | tail -50"))
			}
			time.Sleep(200 * time.Millisecond) // polling a port: nothing to wait on
		}
	}
	waitHealthy()
	if got := in("systemctl is-active aenv"); strings.TrimSpace(got) != "active" {
		t.Errorf("aenv.service is %q", got)
	}
	if log := in("journalctl -u aenv --no-pager"); !strings.Contains(log, "aenv server listening") {
		t.Errorf("journalctl -u aenv does not show the server's log:\n%s", log)
	}

	// A sandbox outlives `systemctl restart aenv` (KillMode=process), and
	// the next server adopts it.
	api := client.New(client.Config{URL: fmt.Sprintf("http://127.0.0.1:%d", port), APIKey: bootAPIKey})
	sb, err := api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, in("journalctl -u aenv --no-pager | tail -50"))
	}
	defer func() {
		// Deleted, whatever happened: the sandbox's cgroups are the host's.
		_ = api.DeleteSandbox(context.Background(), sb.SandboxID)
	}()
	// The server's cgroup parents, in the host's hierarchies, are those
	// holding this sandbox's cgroup. Other tests' servers on this machine
	// make aenv-* parents beside them, so only these are checked at the end.
	var parents []string
	for _, c := range controllers {
		found, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", c, own[c], "aenv-*", sb.SandboxID))
		for _, f := range found {
			parents = append(parents, filepath.Dir(f))
		}
	}
	if len(controllers) > 0 && len(parents) == 0 {
		t.Fatalf("the sandbox's cgroup is in none of the cgroup v1 hierarchies %v", controllers)
	}
	state := "echo kept > /tmp/state; nohup sleep 1000 >/dev/null 2>&1 &"
	if _, err := api.Execute(ctx, sb.SandboxID, client.ExecuteRequest{Command: state}); err != nil {
		t.Fatal(err)
	}
	before := strings.TrimSpace(in("systemctl show --property MainPID --value aenv"))
	in("systemctl restart aenv")
	if after := strings.TrimSpace(in("systemctl show --property MainPID --value aenv")); after == before {
		t.Fatalf("aenv.service's process is %s before and after the restart", after)
	}
	waitHealthy()
	res, err := api.Execute(ctx, sb.SandboxID, client.ExecuteRequest{Command: "cat /tmp/state; pgrep -x sleep >/dev/null && echo sleeper"})
	if err != nil || res.Stdout != "kept\nsleeper\n" {
		t.Fatalf("after systemctl restart, the sandbox: %+v, %v\n%s", res, err, in("journalctl -u aenv --no-pager | tail -50"))
	}
	if err := api.DeleteSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	// A server told to kill its sandboxes on exit stops with nothing left
	// in the host's cgroup hierarchies (runsc's, and the server's parent
	// of them, which a server that keeps its sandboxes keeps too).
	in("echo AENV_KILL_ON_EXIT=true >>/etc/aenv/server.env && systemctl restart aenv")
	waitHealthy()
	in("systemctl stop aenv")
	for _, p := range parents {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("cgroup left behind: %s", p)
			_ = os.Remove(p)
		}
	}
}

// cgroupV1Controllers lists the cgroup v1 controller hierarchies mounted
// under /sys/fs/cgroup (none on a cgroup v2 machine).
func cgroupV1Controllers(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var cs []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		i := strings.Index(line, " - cgroup ")
		if len(fields) < 5 || i < 0 || !strings.HasPrefix(fields[4], "/sys/fs/cgroup/") {
			continue
		}
		name := strings.TrimPrefix(fields[4], "/sys/fs/cgroup/")
		if name != "systemd" && !strings.Contains(name, "/") {
			cs = append(cs, name)
		}
	}
	return cs
}

// ownCgroups maps each cgroup v1 hierarchy, by its mount name
// ("cpu,cpuacct") and by each of its controllers, to this process's cgroup
// in it ("" at the root). The paths are from the root of this process's
// cgroup namespace: a test run in a container of its own would need them
// made relative to the hierarchies' mount roots too.
func ownCgroups(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controller,controller:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		// Under the hierarchy's name ("cpu,cpuacct", as mounted) and
		// under each of its controllers.
		out[parts[1]] = strings.TrimSuffix(parts[2], "/")
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = strings.TrimSuffix(parts[2], "/")
		}
	}
	return out
}

// waitContainerInit returns the PID of the container's systemd.
func waitContainerInit(t *testing.T, nspawnPID int, exited <-chan struct{}, consolePath string) int {
	t.Helper()
	children := func(pid int) []int {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return pids
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			t.Fatalf("systemd-nspawn exited:\n%s", readConsole(consolePath))
		default:
		}
		// nspawn's child, or its grandchild while an intermediate one
		// lives: the process that is PID 1 in its own namespace.
		for _, c := range children(nspawnPID) {
			for _, p := range append([]int{c}, children(c)...) {
				if isContainerInit(p) {
					return p
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // process creation: nothing to wait on
	}
	t.Fatalf("no systemd in the container after a minute:\n%s", readConsole(consolePath))
	return 0
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

// readConsole returns the container's console output so far.
func readConsole(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// isContainerInit tells whether pid is systemd running as PID 1 of a PID
// namespace of its own.
func isContainerInit(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	var name, nspid string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Name:"); ok {
			name = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			nspid = strings.TrimSpace(v)
		}
	}
	f := strings.Fields(nspid)
	return name == "systemd" && len(f) > 1 && f[len(f)-1] == "1"
}
