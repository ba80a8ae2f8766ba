package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestChaosKill9 runs a mixed workload (create, exec, pause in memory and
// to disk, resume, snapshot, fork, delete) and kills the server with
// SIGKILL at random moments. After each restart every acknowledged sandbox
// must be in its acknowledged state with its memory intact (a counter
// process keeps counting with the same PID), no child of an unanswered fork
// may be left, acknowledged snapshots must exist, and no partial image may
// remain. AENV_CHAOS_ROUNDS sets the number of kills (default 10),
// AENV_CHAOS_SEED the seed of the schedule (default: the time).
func TestChaosKill9(t *testing.T) {
	t.Parallel()
	rounds := 10
	if v := os.Getenv("AENV_CHAOS_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("AENV_CHAOS_ROUNDS=%q", v)
		}
		rounds = n
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("AENV_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("AENV_CHAOS_SEED=%q", v)
		}
		seed = n
	}
	t.Logf("seed %d (AENV_CHAOS_SEED=%d repeats the schedule of operations)", seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	s := newServer(t, "--warm-sandboxes", "1")
	s.start()
	c := &chaos{t: t, s: s, sandboxes: map[string]*chaosSandbox{}, snapshots: map[string]bool{}}
	for range 2 {
		c.create()
	}
	var ops, checked, lost int
	for round := range rounds {
		// A burst of concurrent operations, cut by a kill -9 at a random moment.
		var wg sync.WaitGroup
		for range 3 + rng.IntN(3) {
			op := c.pick(rng)
			ops++
			wg.Add(1)
			go func() { defer wg.Done(); op() }()
		}
		time.Sleep(time.Duration(50+rng.IntN(1500)) * time.Millisecond)
		s.stop(syscall.SIGKILL)
		wg.Wait()
		c.history.WriteString(s.logs.String())
		s.start()
		n, l := c.check()
		checked += n
		lost += l
		t.Logf("round %d: %d sandboxes checked", round+1, n)
		for len(c.sandboxes) < 2 {
			c.create()
		}
	}
	t.Logf("chaos: %d kills, %d operations, %d sandbox checks, lost %d", rounds, ops, checked, lost)
	if lost > 0 {
		t.Fatalf("%d acknowledged sandboxes lost or changed", lost)
	}
}

type chaos struct {
	t  *testing.T
	s  *server
	mu sync.Mutex
	// sandboxes holds what was acknowledged; an operation whose answer was
	// lost makes its sandbox uncertain (any of the states before and
	// after is right).
	sandboxes map[string]*chaosSandbox
	snapshots map[string]bool
	// inflightCreates counts creates left unanswered by the kill: each may
	// have made a sandbox nobody was told of.
	inflightCreates int
	// history holds the logs of the servers killed so far.
	history strings.Builder
}

type chaosSandbox struct {
	states []string // acceptable states; one when certain; "gone" allowed after an unanswered delete
	pid    string   // PID of the counter process
	busy   bool     // an operation is running on it
}

// create makes a sandbox with a counter process, outside the chaos.
func (c *chaos) create() {
	sb := c.s.create(nil)
	res := c.s.exec(sb.SandboxID, client.ExecuteRequest{Command: `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done' >/dev/null 2>&1 & echo $!`})
	c.mu.Lock()
	c.sandboxes[sb.SandboxID] = &chaosSandbox{states: []string{"running"}, pid: strings.TrimSpace(res.Stdout)}
	c.mu.Unlock()
}

// pick chooses an operation on a sandbox no other operation is touching.
func (c *chaos) pick(rng *rand.Rand) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var free []string
	for id, sb := range c.sandboxes {
		if !sb.busy && len(sb.states) == 1 {
			free = append(free, id)
		}
	}
	if len(free) == 0 || rng.IntN(8) == 0 {
		c.inflightCreates++
		return c.opCreate
	}
	id := free[rng.IntN(len(free))]
	sb := c.sandboxes[id]
	sb.busy = true
	switch state := sb.states[0]; {
	case state == "paused":
		return func() { c.transition(id, "POST", "/resume", nil, 201, "running") }
	default:
		switch rng.IntN(6) {
		case 0:
			return func() { c.transition(id, "POST", "/pause", nil, 204, "paused") }
		case 1:
			return func() { c.transition(id, "POST", "/pause", map[string]bool{"toDisk": true}, 204, "paused") }
		case 2:
			return func() { c.opFork(id) }
		case 3:
			return func() { c.opSnapshot(id) }
		case 4:
			if len(c.sandboxes) > 2 {
				return func() { c.transition(id, "DELETE", "", nil, 204, "gone") }
			}
			fallthrough
		default:
			return func() {
				c.s.doNoFail("POST", "/sandboxes/"+id+"/execute", map[string]string{"command": "cat /tmp/counter"})
				c.done(id, nil)
			}
		}
	}
}

func (c *chaos) done(id string, states []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandboxes[id]
	sb.busy = false
	if states != nil {
		sb.states = states
	}
}

// transition runs an operation that moves a sandbox from its state to
// after when acknowledged with status ok.
func (c *chaos) transition(id, method, suffix string, body any, ok int, after string) {
	r := c.s.doNoFail(method, "/sandboxes/"+id+suffix, body)
	c.mu.Lock()
	before := c.sandboxes[id].states[0]
	c.mu.Unlock()
	switch {
	case r.status == ok:
		c.done(id, []string{after})
	case r.status == 0: // answer lost: either is right
		c.done(id, []string{before, after})
	default:
		c.t.Errorf("%s %s: %d %s", method, suffix, r.status, truncate(r.body))
		c.done(id, nil)
	}
}

func (c *chaos) opCreate() {
	r := c.s.doNoFail("POST", "/sandboxes", map[string]string{"templateID": "base"})
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.status != 201 {
		return // counted as in flight: it may or may not exist
	}
	c.inflightCreates--
	var sb client.Sandbox
	json.Unmarshal(r.body, &sb)
	// No counter process: its memory is checked through the others.
	c.sandboxes[sb.SandboxID] = &chaosSandbox{states: []string{"running"}}
}

func (c *chaos) opFork(id string) {
	r := c.s.doNoFail("POST", "/sandboxes/"+id+"/fork", map[string]int{"count": 2})
	defer c.done(id, nil)
	if r.status != 201 {
		if r.status != 0 {
			c.t.Errorf("fork: %d %s", r.status, truncate(r.body))
		}
		return
	}
	var items []struct {
		Sandbox *client.Sandbox `json:"sandbox"`
	}
	json.Unmarshal(r.body, &items)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range items {
		if it.Sandbox != nil {
			c.sandboxes[it.Sandbox.SandboxID] = &chaosSandbox{states: []string{"running"}, pid: c.sandboxes[id].pid}
		}
	}
}

func (c *chaos) opSnapshot(id string) {
	r := c.s.doNoFail("POST", "/sandboxes/"+id+"/snapshots", map[string]string{})
	defer c.done(id, nil)
	if r.status != 201 {
		return
	}
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(r.body, &snap)
	c.mu.Lock()
	c.snapshots[snap.SnapshotID] = true
	c.mu.Unlock()
}

// check compares the restarted server with the model and returns how
// many sandboxes it checked and how many were lost or wrong.
func (c *chaos) check() (checked, lost int) {
	t, s := c.t, c.s
	var list []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes?state=running,paused", nil), 200, "list").json(t, &list)
	listed := map[string]string{}
	for _, sb := range list {
		listed[sb.SandboxID] = sb.State
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, want := range c.sandboxes {
		got, ok := listed[id]
		if !ok {
			got = "gone"
		}
		if !contains(want.states, got) {
			t.Errorf("sandbox %s is %s after restart, acknowledged %v", id, got, want.states)
			lost++
			delete(c.sandboxes, id)
			continue
		}
		if got == "gone" {
			delete(c.sandboxes, id)
			continue
		}
		checked++
		if got == "paused" {
			s.expect(s.do("POST", "/sandboxes/"+id+"/resume", nil), 201, "resume "+id)
		}
		want.states = []string{"running"}
		if want.pid != "" {
			if !c.counterAlive(id, want.pid) {
				t.Errorf("sandbox %s lost its memory: counter process %s gone or stopped; its log lines:\n%s",
					id, want.pid, linesWith(c.history.String()+s.logs.String(), id))
				lost++
			}
		}
	}
	// Unknown sandboxes: only an unanswered create may have made one.
	unknown := 0
	for id := range listed {
		if _, ok := c.sandboxes[id]; !ok {
			unknown++
			s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "delete unknown")
		}
	}
	if unknown > c.inflightCreates {
		t.Errorf("%d unknown sandboxes after restart, but only %d creates were unanswered (fork children of an unanswered fork?)", unknown, c.inflightCreates)
	}
	c.inflightCreates = 0
	// Acknowledged snapshots exist; no partial or fork image is left.
	var snaps []struct {
		SnapshotID string `json:"snapshotID"`
	}
	s.expect(s.do("GET", "/snapshots", nil), 200, "snapshots").json(t, &snaps)
	have := map[string]bool{}
	for _, sn := range snaps {
		have[sn.SnapshotID] = true
	}
	for id := range c.snapshots {
		if !have[id] {
			t.Errorf("acknowledged snapshot %s is gone", id)
			lost++
		}
	}
	entries, _ := os.ReadDir(filepath.Join(s.dataDir, "images"))
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".partial") || strings.HasPrefix(e.Name(), "fork-") {
			t.Errorf("debris after restart: images/%s", e.Name())
		}
	}
	return checked, lost
}

// counterAlive reports whether the counter process pid still runs in the
// sandbox and keeps counting. A read may catch the file between its
// truncation and the write: only a gone process or a counter that does not
// move for 10 s count as lost.
func (c *chaos) counterAlive(id, pid string) bool {
	read := func() (n int, alive bool) {
		r := c.s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf("kill -0 %s || exit 3; cat /tmp/counter", pid)})
		n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		if err != nil {
			n = -1
		}
		return n, r.ExitCode != 3
	}
	first := -1
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, alive := read()
		switch {
		case !alive:
			return false
		case n < 0:
		case first < 0:
			first = n
		case n > first:
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// linesWith returns the lines of text that mention needle.
func linesWith(text, needle string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, needle) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
