package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/envd/client"
)

// requireFile returns path when it exists; a missing prerequisite skips the
// test, or fails it when root tests are required.
func requireFile(t *testing.T, path, what string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
			t.Fatalf("%s %s: %v", what, path, err)
		}
		t.Skipf("%s %s: %v", what, path, err)
	}
	return path
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// sandboxNet is a network namespace with a veth pair: the host end has
// .1/30 and the namespace end .2/30, which runsc takes over.
type sandboxNet struct {
	netns     string
	sandboxIP string
}

func newSandboxNet(t *testing.T) sandboxNet {
	t.Helper()
	var raw [3]byte
	_, _ = rand.Read(raw[:])
	suffix := hex.EncodeToString(raw[:])
	netns, hostIf, sbxIf := "aenvt-"+suffix, "aeh"+suffix, "aes"+suffix
	var subnet int
	for {
		subnet = 1 + mrand.IntN(254)
		out, _ := exec.Command("ip", "-o", "addr", "show", "to", fmt.Sprintf("10.250.%d.0/30", subnet)).Output()
		if len(strings.TrimSpace(string(out))) == 0 {
			break
		}
	}
	mustRun(t, "ip", "netns", "add", netns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
	mustRun(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", sbxIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	mustRun(t, "ip", "link", "set", sbxIf, "netns", netns)
	mustRun(t, "ip", "addr", "add", fmt.Sprintf("10.250.%d.1/30", subnet), "dev", hostIf)
	mustRun(t, "ip", "link", "set", hostIf, "up")
	mustRun(t, "ip", "netns", "exec", netns, "ip", "addr", "add", fmt.Sprintf("10.250.%d.2/30", subnet), "dev", sbxIf)
	mustRun(t, "ip", "netns", "exec", netns, "ip", "link", "set", sbxIf, "up")
	mustRun(t, "ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
	return sandboxNet{netns: netns, sandboxIP: fmt.Sprintf("10.250.%d.2", subnet)}
}

// sandboxCaps are what envd needs as init: switching users, chowning what
// it creates for them, and signalling their processes.
var sandboxCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
}

// ociSpec is the bundle config: the shared rootfs kept pristine by runsc's
// memory overlay, and envd bind-mounted read-only as the init.
func ociSpec(rootfs, envdBin, netnsPath string) map[string]any {
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0},
			"args": []string{"/usr/local/bin/aenv-envd"},
			"env":  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"cwd":  "/",
			"capabilities": map[string]any{
				"bounding":  sandboxCaps,
				"effective": sandboxCaps,
				"permitted": sandboxCaps,
			},
		},
		"root":     map[string]any{"path": rootfs, "readonly": false},
		"hostname": "sbx",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"ro"}},
			{"destination": "/usr/local/bin/aenv-envd", "type": "bind", "source": envdBin, "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]any{
				{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
				{"type": "network", "path": netnsPath},
			},
		},
	}
}

// TestEnvdInGVisor boots the static envd as PID 1 of a gVisor sandbox and
// drives it over the sandbox's own network.
func TestEnvdInGVisor(t *testing.T) {
	requireRoot(t)
	runsc := os.Getenv("AENV_RUNSC")
	if runsc == "" {
		runsc, _ = filepath.Abs("../../bin/runsc")
	}
	requireFile(t, runsc, "runsc")
	rootfs := os.Getenv("AENV_TEST_ROOTFS")
	if rootfs == "" {
		// The base template's rootfs, built by `make test` before the tests.
		matches, _ := filepath.Glob("/var/cache/aenv-test/base-*/rootfs")
		if len(matches) > 0 {
			rootfs = matches[0]
		}
	}
	requireFile(t, filepath.Join(rootfs, "bin/bash"), "test rootfs")

	bin := buildEnvd(t)
	net := newSandboxNet(t)
	work := t.TempDir()
	bundle, state := filepath.Join(work, "bundle"), filepath.Join(work, "state")
	for _, d := range []string{bundle, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	spec, _ := json.Marshal(ociSpec(rootfs, bin, "/var/run/netns/"+net.netns))
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	id := "envdtest-" + net.netns[len("aenvt-"):]
	runscArgs := func(args ...string) []string {
		return append([]string{"--root", state, "--platform=systrap", "--network=sandbox", "--overlay2=root:memory"}, args...)
	}
	logFile, err := os.Create(filepath.Join(work, "sandbox.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := exec.CommandContext(ctx, runsc, runscArgs("run", "--detach", "--bundle", bundle, id)...)
	start.Stdout, start.Stderr = logFile, logFile
	t.Cleanup(func() {
		_ = exec.Command(runsc, runscArgs("kill", id, "KILL")...).Run()
		if out, err := exec.Command(runsc, runscArgs("delete", "-force", id)...).CombinedOutput(); err != nil {
			t.Logf("runsc delete: %v: %s", err, out)
		}
		// runsc leaves a namespace bind mount in its root dir.
		_ = syscall.Unmount(filepath.Join(state, "null-netns"), syscall.MNT_DETACH)
	})
	if err := start.Run(); err != nil {
		log, _ := os.ReadFile(logFile.Name())
		t.Fatalf("runsc run: %v\n%s", err, log)
	}

	c := client.New("http://"+net.sandboxIP+":49983", &http.Client{}, "")
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("sandbox output:\n%s", log)
		}
	})
	waitHealthy(t, c, 30*time.Second)
	if err := c.Init(ctx, client.InitRequest{AccessToken: "sbx-token", EnvVars: map[string]string{"SBX": "yes"}}); err != nil {
		t.Fatal(err)
	}

	res, err := c.Run(ctx, client.RunRequest{Command: `echo "$SBX $(id -un)"; tr '\0' ' ' < /proc/1/cmdline`})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(res.Stdout), "yes root\n/usr/local/bin/aenv-envd") || res.ExitCode != 0 {
		t.Fatalf("run: %+v stdout %q stderr %q", res, res.Stdout, res.Stderr)
	}

	// An orphan that exits must be reaped by envd as PID 1.
	if _, err := c.Run(ctx, client.RunRequest{Command: "(sleep 0.2 &) ; true"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	res, err = c.Run(ctx, client.RunRequest{Command: `grep -l '^State:.*Z' /proc/[0-9]*/status; true`})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "" {
		t.Fatalf("zombies left: %q (%v)", res.Stdout, err)
	}

	if err := c.WriteFile(ctx, "/tmp/hello.txt", strings.NewReader("from host"), ""); err != nil {
		t.Fatal(err)
	}
	res, err = c.Run(ctx, client.RunRequest{Command: "cat /tmp/hello.txt; exit 7", Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "from host" || res.ExitCode != 7 {
		t.Fatalf("file round trip: %+v %v", res, err)
	}
	res, err = c.Run(ctx, client.RunRequest{Command: "sleep 30", Timeout: time.Second})
	if err != nil || !res.TimedOut {
		t.Fatalf("timeout in sandbox: %+v %v", res, err)
	}

	// gVisor's procfs refuses the seek that learns a file's size: such a
	// file is streamed (the E2B Python SDK reads boot IDs this way).
	res, err = c.Run(ctx, client.RunRequest{Command: "cat /proc/sys/kernel/random/boot_id"})
	if err != nil || len(res.Stdout) == 0 {
		t.Fatalf("cat boot_id: %+v %v", res, err)
	}
	rc, _, err := c.ReadFile(ctx, "/proc/sys/kernel/random/boot_id", "")
	if err != nil {
		t.Fatalf("read boot_id through /files: %v", err)
	}
	bootID, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(bootID) != string(res.Stdout) {
		t.Fatalf("boot_id through /files %q (%v), want %q", bootID, err, res.Stdout)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "tmp/hello.txt")); err == nil {
		t.Fatal("the shared rootfs was written to")
	}

	// Code in the sandbox, as root, kills every process it may: envd, the
	// sandbox's init, is spared (as Linux spares init from kill(-1)), and
	// serves on with the sandbox's token and env vars.
	authed := client.New("http://"+net.sandboxIP+":49983", &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, "sbx-token")
	if _, err := authed.Run(ctx, client.RunRequest{Command: "nohup sleep 1000 > /dev/null 2>&1 &"}); err != nil {
		t.Fatal(err)
	}
	_, _ = authed.Run(ctx, client.RunRequest{Command: "setsid sh -c 'kill -9 -1' < /dev/null > /dev/null 2>&1 &"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err = authed.Run(ctx, client.RunRequest{Command: `pgrep -x sleep; echo "$PPID $SBX"`})
		if err == nil && string(res.Stdout) == "1 yes\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill -9 -1: %+v %v; want envd (PID 1) serving with the env vars, the sleep killed", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	anon := client.New("http://"+net.sandboxIP+":49983", &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, "")
	if _, err := anon.Run(ctx, client.RunRequest{Command: "true"}); err == nil {
		t.Fatal("envd runs commands without the token after kill -9 -1")
	}

	// Killing envd itself ends the sandbox: nothing is left to serve its
	// port without the token.
	_, _ = authed.Run(ctx, client.RunRequest{Command: "kill -9 1"})
	deadline = time.Now().Add(30 * time.Second)
	for {
		out, _ := exec.Command(runsc, runscArgs("state", id)...).Output()
		var st struct{ Status string }
		if json.Unmarshal(out, &st) == nil && st.Status == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox still runs after its envd was killed: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
