package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// buildRelease builds aenv as another release, version, for a test that
// replaces a running binary: static, as users run it.
func buildRelease(t *testing.T, version string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aenv")
	cmd := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/aenv-dev/aenv/internal/cli.Version="+version, "./cmd/aenv")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build aenv %s: %v\n%s", version, err, out)
	}
	// Its helpers, next to it as make build puts them.
	for _, helper := range []string{"envd", "runsc"} {
		if err := os.Symlink(filepath.Join(binDir, helper), filepath.Join(filepath.Dir(bin), helper)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// A node's binary is replaced under load the way docs/cluster.md says
// (drain, stop with its sandboxes kept, start the new release on the same
// data dir, undrain): no sandbox is lost, their processes and files live
// on, calls into them fail only while the node restarts, the cluster runs
// the two releases side by side, and new sandboxes land on the upgraded
// node once it is undrained.
func TestClusterRollingUpgrade(t *testing.T) {
	t.Parallel()
	next := buildRelease(t, "v-next")
	c := newCluster(t)
	// The node keeps its sandboxes when it stops: that is the upgrade.
	a := c.addNode("node-a", "--kill-on-exit=false")
	c.addNode("node-b")
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	ctx := context.Background()

	// Sandboxes on node-a, each with a file and a process of its own.
	var onA []string
	t.Cleanup(func() {
		// Stopped as it is, node-a would leave its sandboxes and network
		// behind: back to the harness's way, which takes all down.
		for _, id := range onA {
			a.api.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
		if a.cmd == nil {
			return
		}
		a.stop(syscall.SIGTERM)
		a.extra = slices.DeleteFunc(a.extra, func(f string) bool { return f == "--kill-on-exit=false" })
		a.start()
	})
	if err := g.api.DrainNode(ctx, "node-b", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-b drained", func() bool { return g.nodeStates(t)["node-b"].State == "draining" })
	for i := range 3 {
		id := g.create(t)
		onA = append(onA, id)
		if node, _ := g.sandboxNode(t, id); node != "node-a" {
			t.Fatalf("sandbox %d landed on %s", i, node)
		}
		res, err := g.api.Execute(ctx, id, client.ExecuteRequest{
			Command: fmt.Sprintf("echo kept-%d > /home/user/kept && (nohup sleep 3600 >/dev/null 2>&1 & echo $! > /home/user/pid)", i)})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("prepare %s: %+v %v", id, res, err)
		}
	}
	if err := g.api.DrainNode(ctx, "node-b", false); err != nil {
		t.Fatal(err)
	}

	// Load: calls into node-a's sandboxes through the gateway, all along.
	// A call is judged by when it began: one begun during the restart
	// may end (fail) after it.
	type failure struct {
		began, at time.Time
		err       error
	}
	var (
		mu       sync.Mutex
		failures []failure
		calls    int
		lastOK   time.Time
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range onA {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				began := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				res, err := g.api.Execute(cctx, id, client.ExecuteRequest{Command: "cat /home/user/kept"})
				cancel()
				if err == nil && !strings.HasPrefix(res.Stdout, "kept-") {
					err = fmt.Errorf("read %q", res.Stdout)
				}
				mu.Lock()
				calls++
				if err != nil {
					failures = append(failures, failure{began, time.Now(), fmt.Errorf("%s: %w", id, err)})
				} else {
					lastOK = time.Now()
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	waitFor(t, 30*time.Second, "load running", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 10 })

	// The roll.
	if err := g.api.DrainNode(ctx, "node-a", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-a drained", func() bool { return g.nodeStates(t)["node-a"].State == "draining" })
	down := time.Now()
	a.stop(syscall.SIGTERM)
	a.bin = next
	a.start()
	up := time.Now()
	waitFor(t, time.Minute, "node-a back, drained, on the new release", func() bool {
		n := g.nodeStates(t)["node-a"]
		return n.State == "draining" && n.Version == "v-next"
	})
	if v := g.nodeStates(t)["node-b"].Version; v == "v-next" {
		t.Fatalf("node-b runs %s: the test's two releases are not different", v)
	}
	if err := g.api.DrainNode(ctx, "node-a", false); err != nil {
		t.Fatal(err)
	}
	g.waitReady(t, "node-a", "node-b")
	// Calls work again, and go on working.
	settled := time.Now()
	waitFor(t, time.Minute, "calls answered after the roll", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lastOK.After(settled.Add(time.Second)) // a second of load after the roll, checked below
	})
	close(stop)
	wg.Wait()

	mu.Lock()
	for _, f := range failures {
		// Only while node-a was away (its stop, restart and the gateway
		// seeing it back), and never a sandbox the node lost.
		if f.at.Before(down) || f.began.After(settled) {
			t.Errorf("call failed outside the restart (%s .. %s): at %s: %v", down.Format(time.TimeOnly),
				settled.Format(time.TimeOnly), f.at.Format(time.TimeOnly), f.err)
		}
		var apiErr *client.APIError
		if errors.As(f.err, &apiErr) && apiErr.Status == http.StatusNotFound {
			t.Errorf("a sandbox was not found during the roll: %v", f.err)
		}
	}
	t.Logf("%d calls, %d failed while node-a restarted (stopped and started in %s)", calls, len(failures),
		up.Sub(down).Round(time.Millisecond))
	mu.Unlock()

	// Every sandbox survived whole: its file and its process.
	for _, id := range onA {
		if node, state := g.sandboxNode(t, id); node != "node-a" || state != "running" {
			t.Errorf("%s after the roll: on %s, %s", id, node, state)
		}
		res, err := g.api.Execute(ctx, id, client.ExecuteRequest{Command: "kill -0 $(cat /home/user/pid) && cat /home/user/kept"})
		if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "kept-") {
			t.Errorf("%s after the roll: its process or file is gone: %+v %v", id, res, err)
		}
	}
	// The upgraded node takes new sandboxes again from the gateway of the
	// old release (node-b, the emptier, drained so that it must).
	if err := g.api.DrainNode(ctx, "node-b", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-b drained", func() bool { return g.nodeStates(t)["node-b"].State == "draining" })
	id := g.create(t)
	onA = append(onA, id)
	if node, _ := g.sandboxNode(t, id); node != "node-a" {
		t.Errorf("a create after the roll landed on %s", node)
	}
	g.echo(t, id, "upgraded")
}
