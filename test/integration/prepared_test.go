package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// runtimeDirs lists the sandbox directories the gVisor driver holds: live
// sandboxes and prepared ones.
func (s *server) runtimeDirs() []string {
	entries, _ := os.ReadDir(filepath.Join(s.dataDir, "runtime", "sandboxes"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestPreparedSandboxes: a fork makes the server prepare as many sandboxes
// of the parent's shape (runsc create, ahead of demand); the next fork's
// children are restored into them and are whole, separate sandboxes. A
// restart removes the prepared ones, which have no record, and nothing
// leaks.
func TestPreparedSandboxes(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--warm-sandboxes", "0", "--prepared-sandboxes", "4", "--max-fork-count", "4")
	s.start()
	parent := s.create(nil).SandboxID
	s.expect(s.do("POST", "/sandboxes/"+parent+"/files/write", map[string]string{"path": "/home/user/task", "content": "shared"}), 200, "write")
	first := s.fork("/sandboxes/"+parent+"/fork", 3)
	live := append([]string{parent}, first...)
	// Ready in the server's own view, not only present on disk: a
	// sandbox whose runsc create is still running has its directory but
	// cannot be claimed yet (on a slow machine that window is wide).
	prepared := s.waitPooled(live, 3, 0)

	children := s.fork("/sandboxes/"+parent+"/fork", 3)
	addrs := map[string]bool{}
	for i, c := range children {
		if !slices.Contains(prepared, c) {
			t.Errorf("child %d (%s) was not restored into a prepared sandbox %v", i, c, prepared)
		}
		res := s.exec(c, client.ExecuteRequest{Command: "cat /home/user/task; echo; hostname -I"})
		lines := strings.Fields(res.Stdout)
		if len(lines) < 2 || lines[0] != "shared" {
			t.Fatalf("child %d sees %q", i, res.Stdout)
		}
		addrs[lines[1]] = true
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+c, nil), 200, "get child").json(t, &info)
		if info.State != "running" || info.EndAt.IsZero() {
			t.Errorf("child %d: state %q, end %v", i, info.State, info.EndAt)
		}
	}
	if len(addrs) != len(children) {
		t.Errorf("children share addresses: %v", addrs)
	}

	// The pool refills; a crash leaves those sandboxes without a record,
	// and the next start removes them.
	live = append(live, children...)
	waitFor(t, 2*time.Minute, "the pool to refill", func() bool { return len(s.runtimeDirs()) > len(live) })
	var left []string
	for _, id := range s.runtimeDirs() {
		if !slices.Contains(live, id) {
			left = append(left, id)
		}
	}
	s.stop(syscall.SIGKILL)
	s.start()
	for _, id := range left {
		if runscProcesses(id) != 0 || slices.Contains(s.runtimeDirs(), id) {
			t.Errorf("prepared sandbox %s survived a restart", id)
		}
	}
	for _, c := range children {
		if res := s.exec(c, client.ExecuteRequest{Command: "cat /home/user/task"}); res.Stdout != "shared" {
			t.Errorf("child %s after the restart: %+v", c, res)
		}
	}
}

// TestWarmSnapshots: once a snapshot is used, the server keeps a sandbox
// restored from it and paused; the next create from the snapshot resumes
// that one. It has the snapshot's files and processes, its own address,
// token and deadline, and deleting the snapshot removes what was kept.
func TestWarmSnapshots(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--warm-sandboxes", "0", "--prepared-sandboxes", "4", "--warm-snapshots", "1")
	s.start()
	src := s.create(nil).SandboxID
	s.expect(s.do("POST", "/sandboxes/"+src+"/files/write", map[string]string{"path": "/home/user/task", "content": "shared"}), 200, "write")
	s.startCounter(src)
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+src+"/snapshots", map[string]string{"name": "warm"}), 201, "snapshot").json(t, &snap)
	atSnap := s.count(src)
	first := s.create(map[string]any{"templateID": "warm"})
	live := []string{src, first.SandboxID}
	var pooled []string
	// Paused on disk and ready in the server's own view: one restored and
	// paused but not yet handed to the pool cannot be claimed (on a busy
	// machine a create came in that window and restored anew).
	waitFor(t, 2*time.Minute, "a sandbox restored from the snapshot, ready in the pool", func() bool {
		pooled = nil
		others := 0
		for _, id := range s.runtimeDirs() {
			if slices.Contains(live, id) {
				continue
			}
			others++
			state, _ := os.ReadFile(filepath.Join(s.dataDir, "runtime", "runsc", id+"_sandbox:"+id+".state"))
			if strings.Contains(string(state), `"status":"paused"`) {
				pooled = append(pooled, id)
			}
		}
		m, err := s.api.ServerMetrics(t.Context())
		return err == nil && len(pooled) == 1 && m["aenv_prepared_pool_ready"] == float64(others) &&
			others == len(s.runtimeDirs())-len(live)
	})
	second := s.create(map[string]any{"templateID": "warm"})
	if second.SandboxID != pooled[0] {
		t.Errorf("create from the snapshot made %s, not the kept %s", second.SandboxID, pooled[0])
	}
	if second.EnvdAccessToken == first.EnvdAccessToken {
		t.Error("two creates share an envd token")
	}
	addrs := map[string]bool{}
	for _, id := range []string{first.SandboxID, second.SandboxID} {
		res := s.exec(id, client.ExecuteRequest{Command: "cat /home/user/task; echo; hostname -I"})
		lines := strings.Fields(res.Stdout)
		if len(lines) < 2 || lines[0] != "shared" {
			t.Fatalf("%s sees %q", id, res.Stdout)
		}
		addrs[lines[1]] = true
		if n := s.count(id); n < atSnap {
			t.Errorf("%s counter %d is behind the snapshot's %d", id, n, atSnap)
		}
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get").json(t, &info)
		if info.State != "running" || info.EndAt.IsZero() {
			t.Errorf("%s: state %q, end %v", id, info.State, info.EndAt)
		}
	}
	if len(addrs) != 2 {
		t.Errorf("sandboxes share an address: %v", addrs)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+second.SandboxID, nil), 204, "delete")
	s.expect(s.do("DELETE", "/sandboxes/"+first.SandboxID, nil), 204, "delete")
	s.expect(s.do("DELETE", "/templates/"+snap.SnapshotID, nil), 204, "delete snapshot")
	waitFor(t, time.Minute, "the kept sandboxes of the deleted snapshot to go", func() bool {
		for _, id := range s.runtimeDirs() {
			state, _ := os.ReadFile(filepath.Join(s.dataDir, "runtime", "runsc", id+"_sandbox:"+id+".state"))
			if strings.Contains(string(state), `"status":"paused"`) {
				return false
			}
		}
		return true
	})
}

// waitPooled waits until the server's pools hold exactly the given
// numbers of ready sandboxes (its metrics) and the runtime holds exactly
// those beside live (its directories), the same before and after the
// metrics were read, and returns the pooled ones. A sandbox still being
// made, or being discarded, shows on disk but not among the ready, so the
// two agreeing twice in a row means every listed one is a whole, idle
// pooled sandbox.
func (s *server) waitPooled(live []string, prepared, warm int) []string {
	s.t.Helper()
	others := func() []string {
		var out []string
		for _, id := range s.runtimeDirs() {
			if !slices.Contains(live, id) {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	var pooled []string
	var last map[string]float64
	settled := func() bool {
		before := others()
		m, err := s.api.ServerMetrics(s.t.Context())
		if err != nil {
			return false
		}
		last = m
		pooled = others()
		return slices.Equal(before, pooled) && len(pooled) == prepared+warm &&
			m["aenv_prepared_pool_ready"] == float64(prepared) && m["aenv_warm_pool_ready"] == float64(warm)
	}
	for deadline := time.Now().Add(2 * time.Minute); !settled(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("pools did not settle at %d prepared and %d warm: runtime holds %v beside %v; prepared ready %v, warm ready %v",
				prepared, warm, pooled, live, last["aenv_prepared_pool_ready"], last["aenv_warm_pool_ready"])
		}
	}
	return pooled
}

// cpuWeight reads the CPU weight of a sandbox's cgroup and says whether it
// is the background one (the least there is) or the default.
func (s *server) cpuWeight(id string) (weight string, background, foreground bool) {
	s.t.Helper()
	sum := sha256.Sum256([]byte(filepath.Join(s.dataDir, "runtime")))
	parent := "aenv-" + hex.EncodeToString(sum[:])[:12]
	file, bg, fg := filepath.Join("/sys/fs/cgroup/cpu", parent, id, "cpu.shares"), "2", "1024"
	if _, err := os.Stat("/sys/fs/cgroup/cpu"); err != nil {
		file, bg, fg = filepath.Join("/sys/fs/cgroup", parent, id, "cpu.weight"), "1", "100"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		s.t.Fatalf("cgroup of %s: %v", id, err)
	}
	weight = strings.TrimSpace(string(b))
	return weight, weight == bg, weight == fg
}

// TestPoolsRunInTheBackground: the sandboxes the warm, prepared and
// restored pools hold wait at background CPU weight; the ones handed to
// creates and forks run at the default weight, and came from the pools.
func TestPoolsRunInTheBackground(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--warm-sandboxes", "2", "--prepared-sandboxes", "4", "--max-fork-count", "2")
	s.start()
	warm := s.waitPooled(nil, 0, 2)

	sb := s.create(nil)
	if !slices.Contains(warm, sb.SandboxID) {
		t.Errorf("create made %s, not one of the warm pool's %v", sb.SandboxID, warm)
	}
	parent := sb.SandboxID
	live := append([]string{parent}, s.fork("/sandboxes/"+parent+"/fork", 2)...)
	prepared := s.waitPooled(live, 2, 2)
	for _, id := range prepared {
		if w, bg, _ := s.cpuWeight(id); !bg {
			t.Errorf("pooled sandbox %s has CPU weight %s, want the background one", id, w)
		}
	}
	children := s.fork("/sandboxes/"+parent+"/fork", 2)
	for _, id := range append(children, parent) {
		if w, _, fg := s.cpuWeight(id); !fg {
			t.Errorf("sandbox %s has CPU weight %s, want the default", id, w)
		}
	}
	for _, c := range children {
		if !slices.Contains(prepared, c) {
			t.Errorf("child %s was not restored into one of the pool's sandboxes %v", c, prepared)
		}
		if res := s.exec(c, client.ExecuteRequest{Command: "true"}); res.ExitCode != 0 {
			t.Errorf("child %s: %+v", c, res)
		}
	}
}
