package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// runscPath is the runsc the repository builds.
const runscPath = "/work/main/bin/runsc"

// gvisorRootfs finds the Debian test rootfs, which has python3.
func gvisorRootfs(t *testing.T) string {
	t.Helper()
	matches, _ := filepath.Glob("/var/cache/aenv-test/base-*/rootfs")
	for _, m := range matches {
		if _, err := os.Stat(filepath.Join(m, "usr/bin/python3")); err == nil {
			return m
		}
	}
	if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
		t.Fatal("no Debian test rootfs under /var/cache/aenv-test")
	}
	t.Skip("no Debian test rootfs under /var/cache/aenv-test")
	return ""
}

// gvisorSandbox is an idle runsc sandbox in a slot.
type gvisorSandbox struct {
	root, id string
}

func (g *gvisorSandbox) runsc(ctx context.Context, args ...string) *exec.Cmd {
	base := []string{"--root", g.root, "--network=sandbox", "--platform=systrap", "--overlay2=root:memory"}
	return exec.CommandContext(ctx, runscPath, append(base, args...)...)
}

// startGvisor runs `sleep` in a sandbox on s's netns, on the read-only rootfs with an
// in-memory overlay, and removes the sandbox when the test ends.
func startGvisor(t *testing.T, s *Slot) *gvisorSandbox {
	t.Helper()
	if _, err := os.Stat(runscPath); err != nil {
		if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			t.Fatalf("runsc: %v", err)
		}
		t.Skipf("runsc: %v", err)
	}
	rootfs := gvisorRootfs(t)
	bundle := t.TempDir()
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0},
			"args": []string{"/bin/sleep", "600"},
			"env":  []string{"PATH=/usr/bin:/bin"},
			"cwd":  "/",
		},
		"root":     map[string]any{"path": rootfs, "readonly": true},
		"hostname": "sandbox",
		"mounts": []any{
			map[string]any{"destination": "/proc", "type": "proc", "source": "proc"},
			map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{"namespaces": []any{
			map[string]any{"type": "pid"},
			map[string]any{"type": "network", "path": s.NetnsPath},
			map[string]any{"type": "ipc"},
			map[string]any{"type": "uts"},
			map[string]any{"type": "mount"},
		}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	g := &gvisorSandbox{root: t.TempDir(), id: "aenv-net-" + filepath.Base(bundle)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := g.runsc(ctx, "delete", "--force", g.id).CombinedOutput(); err != nil {
			t.Logf("runsc delete: %v: %s", err, out)
		}
		err := unix.Unmount(filepath.Join(g.root, "null-netns"), unix.MNT_DETACH)
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("unmount runsc null-netns: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// The sandbox inherits runsc's output for its whole life: give it a file, not a
	// pipe that would never close.
	consolePath := filepath.Join(bundle, "console.log")
	console, err := os.Create(consolePath)
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	cmd := g.runsc(ctx, "run", "--detach", "--bundle", bundle, g.id)
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(consolePath)
		t.Fatalf("runsc run: %v: %s", err, out)
	}
	return g
}

// python runs a Python snippet inside the sandbox and returns its error, if any.
func (g *gvisorSandbox) python(ctx context.Context, code string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := g.runsc(ctx, "exec", g.id, "/usr/bin/python3", "-c", code).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// TestGvisorSandboxEgress runs a real gVisor sandbox in a slot: its netstack takes
// over the slot's veth and the default route, and the host's policy decides what it
// reaches, changing for the next connection when SetPolicy runs.
func TestGvisorSandboxEgress(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	if err := e.pool.SetPolicy(ctx, e.slot.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	g := startGvisor(t, e.slot)

	web1 := listenInLogged(t, e.inet.netnsPath, e.inet.web1, 0, e.peers).Addr().String()
	web2 := listenInLogged(t, e.inet.netnsPath, e.inet.web2, 0, e.peers).Addr().String()
	tcp := func(addr string) string {
		return fmt.Sprintf(`import socket
h, p = %q.rsplit(":", 1)
s = socket.create_connection((h, int(p)), timeout=2)
assert s.recv(5) == b"hello"`, addr)
	}
	dns := fmt.Sprintf(`import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(b"aenv", (%q, 53))
assert s.recvfrom(16)[0] == b"aenv"`, e.inet.resolver.String())
	host := tcp(listenHost(t, e.slot.HostIP).Addr().String())

	steps := []struct {
		name string
		pol  Policy
		want map[string]bool
	}{
		{"default", DefaultPolicy(), map[string]bool{"web1": true, "web2": true, "dns": true, "host": false}},
		{"internet off", mustPolicy(t, false, nil, nil), map[string]bool{"web1": false, "web2": false, "dns": false}},
		{"allow web1 only", mustPolicy(t, false, []string{e.inet.web1.String()}, nil), map[string]bool{"web1": true, "web2": false}},
	}
	codes := map[string]string{"web1": tcp(web1), "web2": tcp(web2), "dns": dns, "host": host}
	for _, st := range steps {
		if err := e.pool.SetPolicy(ctx, e.slot.Index, st.pol); err != nil {
			t.Fatal(err)
		}
		names := make([]string, 0, len(st.want))
		for name := range st.want {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			err := g.python(ctx, codes[name])
			if st.want[name] && err != nil {
				t.Errorf("%s: sandbox could not reach %s: %v", st.name, name, err)
			}
			if !st.want[name] && err == nil {
				t.Errorf("%s: sandbox reached %s", st.name, name)
			}
		}
	}
	for _, a := range e.peers.all() {
		if a != e.inet.hostAddr {
			t.Errorf("fake internet saw %s, want the host's %s", a, e.inet.hostAddr)
		}
	}
	if len(e.peers.all()) == 0 {
		t.Error("the fake internet saw no connection from the sandbox")
	}
}
