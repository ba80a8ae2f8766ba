package network

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func runHello(t *testing.T, s *Slot, hostTarget string, id string) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "rootfs/tmp"), 0o755)
	b, _ := os.ReadFile("/tmp/hellosrv/hello")
	os.WriteFile(filepath.Join(dir, "rootfs/hello"), b, 0o755)
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process":    map[string]any{"terminal": false, "user": map[string]any{"uid": 0, "gid": 0}, "args": []string{"/hello", hostTarget}, "env": []string{"PATH=/"}, "cwd": "/"},
		"root":       map[string]any{"path": "rootfs"},
		"hostname":   "sb",
		"mounts":     []any{map[string]any{"destination": "/proc", "type": "proc", "source": "proc"}, map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}},
		"linux":      map[string]any{"namespaces": []any{map[string]any{"type": "pid"}, map[string]any{"type": "network", "path": s.NetnsPath}, map[string]any{"type": "ipc"}, map[string]any{"type": "uts"}, map[string]any{"type": "mount"}}},
	}
	js, _ := json.Marshal(spec)
	os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644)
	root := t.TempDir()
	runsc := func(args ...string) {
		out, err := exec.Command("/work/main/bin/runsc", append([]string{"--root", root, "--network=sandbox", "--platform=systrap"}, args...)...).CombinedOutput()
		t.Logf("runsc %v: %v %s", args, err, out)
	}
	start := time.Now()
	runsc("run", "--detach", "--bundle", dir, id)
	t.Logf("run took %v", time.Since(start))
	t.Cleanup(func() { runsc("delete", "--force", id) })

	var got []byte
	for time.Since(start) < 10*time.Second {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(s.SandboxIP.String(), "8080"), time.Second)
		if err == nil {
			time.Sleep(2500 * time.Millisecond) // let the in-sandbox dial time out
			c.Close()
			c, err = net.DialTimeout("tcp", net.JoinHostPort(s.SandboxIP.String(), "8080"), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(c)
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("host -> sandbox: %q", got)
	h := netlinkIn(t, s.NetnsPath)
	eth, _ := h.LinkByName(sandboxIface)
	addrs, _ := h.AddrList(eth, 0)
	t.Logf("kernel view of eth0 addresses while runsc runs: %v", addrs)
	runsc("delete", "--force", id)
}

func TestZZRunsc(t *testing.T) {
	p := newTestPool(t, 24, 0)
	ctx := t.Context()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenHost(t, s.HostIP)
	runHello(t, s, ln.Addr().String(), "zz1")
	if err := p.Release(ctx, s.Index); err != nil {
		t.Fatal(err)
	}
	// WarmPool 0 -> destroyed; acquire again recreates index 0. Use warm path instead:
	s2, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	assertConfigured(t, s2)
	runHello(t, s2, ln.Addr().String(), "zz2")
	if err := p.Release(ctx, s2.Index); err != nil {
		t.Fatal(err)
	}
}

func TestZZRunscWarmReuse(t *testing.T) {
	p := newTestPool(t, 30, 1)
	ctx := t.Context()
	waitWarm(t, p, 1)
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenHost(t, s.HostIP)
	runHello(t, s, ln.Addr().String(), "zz3")
	if err := p.Release(ctx, s.Index); err != nil {
		t.Fatal(err)
	}
	assertConfigured(t, s)
	s2, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reused index %d", s2.Index)
	runHello(t, s2, ln.Addr().String(), "zz4")
}
