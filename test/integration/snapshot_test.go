package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// counterScript counts in memory and publishes the count to /tmp/count;
// its in-memory value is what pause, snapshot and fork must keep.
const counterScript = `import time
i = 0
while True:
    i += 1
    with open('/tmp/count.tmp', 'w') as f:
        f.write(str(i))
    import os
    os.replace('/tmp/count.tmp', '/tmp/count')
    time.sleep(0.02)
`

func (s *server) startCounter(id string) {
	s.t.Helper()
	s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{"path": "/tmp/counter.py", "content": counterScript}), 200, "write counter")
	s.exec(id, client.ExecuteRequest{Command: "nohup python3 /tmp/counter.py >/dev/null 2>&1 &"})
	waitFor(s.t, 10*time.Second, "counter running", func() bool { return s.count(id) > 0 })
}

// count reads the counter of a running sandbox.
func (s *server) count(id string) int {
	s.t.Helper()
	res := s.exec(id, client.ExecuteRequest{Command: "cat /tmp/count 2>/dev/null || echo 0"})
	n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	return n
}

// cgroupCPU is the CPU time a sandbox's cgroup has used.
func (s *server) cgroupCPU(id string) int64 {
	sum := sha256.Sum256([]byte(filepath.Join(s.dataDir, "runtime")))
	p := filepath.Join("/sys/fs/cgroup/cpuacct", "aenv-"+hex.EncodeToString(sum[:])[:12], id, "cpuacct.usage")
	b, err := os.ReadFile(p)
	if err != nil {
		s.t.Fatalf("read cgroup cpu usage: %v", err)
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func (s *server) state(id string) string {
	s.t.Helper()
	info, err := s.api.GetSandbox(s.t.Context(), id)
	if err != nil {
		s.t.Fatalf("get %s: %v", id, err)
	}
	return info.State
}

// TestPauseResume: a paused sandbox is frozen (no CPU, counter stopped,
// envd unreachable) and continues where it stopped.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	sb := s.create(nil)
	id := sb.SandboxID
	s.startCounter(id)

	s.expect(s.do("POST", "/sandboxes/"+id+"/pause", nil), 204, "pause")
	s.expect(s.do("POST", "/sandboxes/"+id+"/pause", nil), 409, "pause again")
	if st := s.state(id); st != "paused" {
		t.Fatalf("state %q after pause", st)
	}
	var paused []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes?state=paused", nil), 200, "list").json(t, &paused)
	if len(paused) != 1 || paused[0].State != "paused" {
		t.Fatalf("paused list: %+v", paused)
	}
	if r := s.do("GET", "/health", nil, "E2b-Sandbox-Id", id); r.status != 502 {
		t.Fatalf("envd traffic to a paused sandbox: %d", r.status)
	}
	s.expect(s.do("POST", "/sandboxes/"+id+"/execute", map[string]string{"command": "true"}), 409, "exec while paused")
	cpu := s.cgroupCPU(id)
	time.Sleep(time.Second)
	if used := s.cgroupCPU(id) - cpu; used > int64(50*time.Millisecond) {
		t.Fatalf("paused sandbox used %s of CPU in 1s", time.Duration(used))
	}

	s.expect(s.do("POST", "/sandboxes/"+id+"/resume", nil), 201, "resume")
	s.expect(s.do("POST", "/sandboxes/"+id+"/resume", nil), 409, "resume running")
	first := s.count(id)
	time.Sleep(300 * time.Millisecond)
	if later := s.count(id); later <= first {
		t.Fatalf("counter stopped after resume: %d then %d", first, later)
	}
	// E2B's connect on a running sandbox: 200.
	s.expect(s.do("POST", "/v2/sandboxes/"+id+"/connect", map[string]int{"timeout": 60}), 200, "connect running")
}

// TestPauseToDisk: a sandbox paused past the idle time is written to disk
// (no process left), and resumes from disk with memory intact.
func TestPauseToDisk(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--pause-to-disk-after-secs", "1")
	s.start()
	sb := s.create(nil)
	id := sb.SandboxID
	s.startCounter(id)
	s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{"path": "/home/user/note", "content": "kept"}), 200, "write")
	s.expect(s.do("POST", "/sandboxes/"+id+"/pause", nil), 204, "pause")
	waitFor(t, 30*time.Second, "paused sandbox written to disk", func() bool {
		_, err := os.Stat(filepath.Join(s.dataDir, "images", "pause-"+id, "aenv-complete"))
		return err == nil && runscProcesses(id) == 0
	})
	if st := s.state(id); st != "paused" {
		t.Fatalf("state %q", st)
	}
	// Connect resumes it (E2B's path), 201.
	s.expect(s.do("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{}), 201, "connect paused")
	if res := s.exec(id, client.ExecuteRequest{Command: "cat /home/user/note; pgrep -f '^python3 /tmp/counter.py' >/dev/null && echo alive"}); res.Stdout != "keptalive\n" {
		t.Fatalf("after resume from disk: %+v", res)
	}
	first := s.count(id)
	time.Sleep(300 * time.Millisecond)
	if later := s.count(id); later <= first {
		t.Fatalf("counter does not run after resume from disk: %d then %d", first, later)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "images", "pause-"+id)); !os.IsNotExist(err) {
		t.Fatalf("image of a resumed sandbox kept: %v", err)
	}
}

// TestAutoPause: autoPause makes the deadline pause instead of kill.
func TestAutoPause(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	// Long enough to start the counter on a loaded machine before the
	// deadline, which counts from the create request.
	sb := s.create(map[string]any{"templateID": "base", "timeout": 10, "autoPause": true})
	s.startCounter(sb.SandboxID)
	waitFor(t, 40*time.Second, "auto-pause at the deadline", func() bool { return s.state(sb.SandboxID) == "paused" })
	s.expect(s.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]int{"timeout": 120}), 201, "connect")
	if n := s.count(sb.SandboxID); n == 0 {
		t.Fatal("counter lost")
	}
}

// TestPausedSurviveRestart: sandboxes paused in memory and on disk are
// still paused after a kill -9 of the server, and resume intact.
func TestPausedSurviveRestart(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--pause-to-disk-after-secs", "2")
	s.start()
	inMemory := s.create(nil).SandboxID
	onDisk := s.create(nil).SandboxID
	for _, id := range []string{inMemory, onDisk} {
		s.startCounter(id)
	}
	s.expect(s.do("POST", "/sandboxes/"+onDisk+"/pause", nil), 204, "pause")
	waitFor(t, 30*time.Second, "spill to disk", func() bool { return runscProcesses(onDisk) == 0 })
	s.expect(s.do("POST", "/sandboxes/"+inMemory+"/pause", nil), 204, "pause")
	s.stop(syscall.SIGKILL)
	s.start()
	for _, id := range []string{inMemory, onDisk} {
		if st := s.state(id); st != "paused" {
			t.Fatalf("%s: state %q after restart", id, st)
		}
		s.expect(s.do("POST", "/sandboxes/"+id+"/resume", map[string]int{"timeout": 120}), 201, "resume")
		first := s.count(id)
		time.Sleep(300 * time.Millisecond)
		if later := s.count(id); first == 0 || later <= first {
			t.Fatalf("%s: counter %d then %d after restart+resume", id, first, later)
		}
	}
}

// TestSnapshots: a snapshot captures memory and files at its instant; the
// source keeps running; sandboxes start from it; it can be deleted.
func TestSnapshots(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	src := s.create(nil).SandboxID
	s.startCounter(src)
	s.expect(s.do("POST", "/sandboxes/"+src+"/files/write", map[string]string{"path": "/tmp/before", "content": "1"}), 200, "write")
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+src+"/snapshots", map[string]string{"name": "snap-one"}), 201, "snapshot").json(t, &snap)
	if snap.SnapshotID == "" || len(snap.Names) != 1 || snap.Names[0] != "snap-one" {
		t.Fatalf("snapshot body %+v", snap)
	}
	s.expect(s.do("POST", "/sandboxes/"+src+"/files/write", map[string]string{"path": "/tmp/after", "content": "2"}), 200, "write")
	s.expect(s.do("POST", "/sandboxes/"+src+"/snapshots", map[string]string{"name": "snap-one"}), 409, "duplicate name")
	s.expect(s.do("POST", "/sandboxes/"+src+"/snapshots", map[string]string{"name": "bad name!"}), 400, "bad name")
	s.expect(s.do("POST", "/sandboxes/nosuchsandbox0000000/snapshots", nil), 404, "unknown sandbox")

	for _, ref := range []string{snap.SnapshotID, "snap-one"} {
		child := s.create(map[string]any{"templateID": ref})
		res := s.exec(child.SandboxID, client.ExecuteRequest{Command: "ls /tmp/before /tmp/after 2>&1; pgrep -f '^python3 /tmp/counter.py' >/dev/null && echo counting"})
		if !strings.Contains(res.Stdout, "/tmp/before") || !strings.Contains(res.Stdout, "No such file") ||
			!strings.Contains(res.Stdout, "counting") {
			t.Fatalf("sandbox from snapshot %s: %q", ref, res.Stdout)
		}
	}
	if res := s.exec(src, client.ExecuteRequest{Command: "cat /tmp/after"}); res.Stdout != "2" {
		t.Fatalf("source after snapshot: %+v", res)
	}
	var list []client.Snapshot
	s.expect(s.do("GET", "/snapshots?sandboxID="+src, nil), 200, "list snapshots").json(t, &list)
	if len(list) != 1 || list[0].SnapshotID != snap.SnapshotID {
		t.Fatalf("snapshot list %+v", list)
	}
	// Snapshots of a paused sandbox too; it stays paused.
	s.expect(s.do("POST", "/sandboxes/"+src+"/pause", nil), 204, "pause")
	var snap2 client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+src+"/snapshots", nil), 201, "snapshot paused").json(t, &snap2)
	if len(snap2.Names) != 0 {
		t.Fatalf("unnamed snapshot has names %v", snap2.Names)
	}
	if st := s.state(src); st != "paused" {
		t.Fatalf("source state %q after snapshot", st)
	}
	child := s.create(map[string]any{"templateID": snap2.SnapshotID})
	if res := s.exec(child.SandboxID, client.ExecuteRequest{Command: "cat /tmp/after"}); res.Stdout != "2" {
		t.Fatalf("from snapshot of paused: %+v", res)
	}

	s.expect(s.do("DELETE", "/templates/"+snap.SnapshotID, nil), 204, "delete snapshot")
	s.expect(s.do("DELETE", "/templates/"+snap.SnapshotID, nil), 404, "delete again")
	s.expect(s.do("POST", "/sandboxes", map[string]string{"templateID": "snap-one"}), 404, "create from deleted")
	if _, err := os.Stat(filepath.Join(s.dataDir, "images", snap.SnapshotID)); !os.IsNotExist(err) {
		t.Fatalf("deleted snapshot's image kept: %v", err)
	}
	s.expect(s.do("DELETE", "/templates/base", nil), 409, "delete base")
}

// TestTemplateFromSandbox is the seed's POST /templates {sandboxID, name}.
func TestTemplateFromSandbox(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	src := s.create(nil).SandboxID
	s.exec(src, client.ExecuteRequest{Command: "mkdir -p /home/user/project && echo ready > /home/user/project/state"})
	var tpl struct {
		TemplateID string `json:"templateID"`
	}
	s.expect(s.do("POST", "/templates", map[string]string{"sandboxID": src, "name": "prepared"}), 201, "template").json(t, &tpl)
	s.expect(s.do("POST", "/templates", map[string]string{"sandboxID": src}), 400, "template without name")
	s.expect(s.do("POST", "/templates", map[string]string{"sandboxID": src, "name": "prepared"}), 409, "duplicate")
	s.expect(s.do("DELETE", "/sandboxes/"+src, nil), 204, "delete source")
	for _, ref := range []string{tpl.TemplateID, "prepared"} {
		sb := s.create(map[string]any{"templateID": ref})
		if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "cat /home/user/project/state"}); res.Stdout != "ready\n" {
			t.Fatalf("from template %s: %+v", ref, res)
		}
	}
}

func (s *server) fork(path string, count int) []string {
	s.t.Helper()
	var items []client.ForkResult
	s.expect(s.do("POST", path, map[string]int{"count": count}), 201, "fork").json(s.t, &items)
	if len(items) != count {
		s.t.Fatalf("fork answered %d items, want %d", len(items), count)
	}
	var ids []string
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			s.t.Fatalf("fork child failed: %+v", it.Error)
		}
		ids = append(ids, it.Sandbox.SandboxID)
	}
	return ids
}

// TestFork: children have the parent's memory and files, then diverge;
// each has its own identity; the parent keeps running.
func TestFork(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--max-fork-count", "10")
	s.start()
	parent := s.create(map[string]any{"templateID": "base", "envVars": map[string]string{"ROLE": "parent"}}).SandboxID
	s.startCounter(parent)
	s.expect(s.do("POST", "/sandboxes/"+parent+"/files/write", map[string]string{"path": "/home/user/task", "content": "shared"}), 200, "write")
	atFork := s.count(parent)
	children := s.fork("/sandboxes/"+parent+"/fork", 3)

	seen := map[string]bool{}
	for i, c := range children {
		if c == parent || seen[c] {
			t.Fatalf("child ID %s not unique", c)
		}
		seen[c] = true
		res := s.exec(c, client.ExecuteRequest{Command: fmt.Sprintf("cat /home/user/task; echo; echo $ROLE; echo child-%d > /home/user/mine", i)})
		if res.Stdout != "shared\nparent\n" {
			t.Fatalf("child %d: %+v", i, res)
		}
		if n := s.count(c); n < atFork {
			t.Fatalf("child %d counter %d is behind the parent's %d at fork", i, n, atFork)
		}
	}
	addrs := map[string]bool{}
	for i, c := range children {
		res := s.exec(c, client.ExecuteRequest{Command: "cat /home/user/mine; hostname -I"})
		lines := strings.Fields(res.Stdout)
		if len(lines) < 2 || lines[0] != fmt.Sprintf("child-%d", i) {
			t.Fatalf("child %d sees %q", i, res.Stdout)
		}
		addrs[lines[1]] = true
	}
	if len(addrs) != len(children) {
		t.Fatalf("children share addresses: %v", addrs)
	}
	if res := s.exec(parent, client.ExecuteRequest{Command: "ls /home/user/mine 2>/dev/null || echo none"}); res.Stdout != "none\n" {
		t.Fatalf("parent sees a child's file: %+v", res)
	}
	first := s.count(parent)
	time.Sleep(200 * time.Millisecond)
	if s.count(parent) <= first {
		t.Fatal("parent stopped after fork")
	}

	// Bad counts and unknown sources.
	s.expect(s.do("POST", "/sandboxes/"+parent+"/fork", map[string]int{"count": 0}), 400, "count 0")
	s.expect(s.do("POST", "/sandboxes/"+parent+"/fork", map[string]int{"count": 11}), 400, "count over bound")
	s.expect(s.do("POST", "/sandboxes/nosuchsandbox0000000/fork", map[string]int{"count": 1}), 404, "unknown")

	// From a paused parent (it stays paused) and from a snapshot.
	s.expect(s.do("POST", "/sandboxes/"+parent+"/pause", nil), 204, "pause")
	for _, c := range s.fork("/sandboxes/"+parent+"/fork", 2) {
		if res := s.exec(c, client.ExecuteRequest{Command: "cat /home/user/task"}); res.Stdout != "shared" {
			t.Fatalf("child of paused parent: %+v", res)
		}
	}
	if st := s.state(parent); st != "paused" {
		t.Fatalf("paused parent is %q after fork", st)
	}
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+parent+"/snapshots", map[string]string{"name": "forkable"}), 201, "snapshot").json(t, &snap)
	for _, c := range s.fork("/snapshots/forkable/fork", 2) {
		if res := s.exec(c, client.ExecuteRequest{Command: "cat /home/user/task"}); res.Stdout != "shared" {
			t.Fatalf("child of snapshot: %+v", res)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(s.dataDir, "images"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "fork-") || strings.HasSuffix(e.Name(), ".partial") {
			t.Errorf("fork left an image behind: %s", e.Name())
		}
	}
}

// TestForkLargeMemory forks 8 children of a sandbox holding 200 MB.
func TestForkLargeMemory(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	parent := s.create(map[string]any{"templateID": "base", "memoryMB": 1024}).SandboxID
	hog := `import hashlib, os, time
data = bytearray(os.urandom(1 << 20)) * 200
open('/tmp/sum', 'w').write(hashlib.sha256(data).hexdigest())
while True:
    time.sleep(1)
    if os.path.exists('/tmp/check'):
        open('/tmp/recheck', 'w').write(hashlib.sha256(data).hexdigest())
        os.remove('/tmp/check')
`
	s.expect(s.do("POST", "/sandboxes/"+parent+"/files/write", map[string]string{"path": "/tmp/hog.py", "content": hog}), 200, "write")
	s.exec(parent, client.ExecuteRequest{Command: "nohup python3 /tmp/hog.py >/dev/null 2>&1 &"})
	waitFor(t, 60*time.Second, "200 MB allocated", func() bool {
		return s.exec(parent, client.ExecuteRequest{Command: "cat /tmp/sum 2>/dev/null"}).Stdout != ""
	})
	want := s.exec(parent, client.ExecuteRequest{Command: "cat /tmp/sum"}).Stdout
	start := time.Now()
	children := s.fork("/sandboxes/"+parent+"/fork", 8)
	t.Logf("fork of 8 children of a 200 MB sandbox: %s", time.Since(start))
	var wg sync.WaitGroup
	for _, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The child's process recomputes the checksum of its memory.
			s.exec(c, client.ExecuteRequest{Command: "touch /tmp/check"})
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				if got := s.exec(c, client.ExecuteRequest{Command: "cat /tmp/recheck 2>/dev/null"}).Stdout; got != "" {
					if got != want {
						t.Errorf("child %s memory checksum %s, want %s", c, got, want)
					}
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Errorf("child %s never rechecked its memory", c)
		}()
	}
	wg.Wait()
}

// TestPauseWithoutMemory: E2B's keepMemory:false (and connect's
// onResume:'reboot') keep the files and drop the processes; aenv's
// {"toDisk": true} releases the memory but keeps everything.
func TestPauseWithoutMemory(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	alive := func(id string) bool {
		return strings.TrimSpace(s.exec(id, client.ExecuteRequest{Command: "pgrep -f '^python3 /tmp/counter.py' >/dev/null && echo yes || echo no"}).Stdout) == "yes"
	}
	for _, tc := range []struct {
		name      string
		pause     any
		resume    any
		wantAlive bool
	}{
		{"keepMemory false", map[string]bool{"memory": false}, map[string]any{}, false},
		{"onResume reboot", nil, map[string]bool{"memory": false}, false},
		{"toDisk", map[string]bool{"toDisk": true}, map[string]any{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := s.create(nil).SandboxID
			s.startCounter(id)
			s.expect(s.do("POST", "/sandboxes/"+id+"/files/write", map[string]string{"path": "/home/user/kept", "content": "yes"}), 200, "write")
			s.expect(s.do("POST", "/sandboxes/"+id+"/pause", tc.pause), 204, "pause")
			s.expect(s.do("POST", "/v2/sandboxes/"+id+"/connect", tc.resume), 201, "connect")
			if res := s.exec(id, client.ExecuteRequest{Command: "cat /home/user/kept"}); res.Stdout != "yes" {
				t.Fatalf("file lost: %+v", res)
			}
			if got := alive(id); got != tc.wantAlive {
				t.Fatalf("counter alive after resume: %v, want %v", got, tc.wantAlive)
			}
		})
	}
}
