package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store/postgres"
)

func testNode(id string, maxSandboxes, sandboxes, memoryMB, usedMB int) *nodeState {
	return &nodeState{reachable: true, Node: postgres.Node{ID: id,
		Capacity: postgres.NodeCapacity{MaxSandboxes: maxSandboxes, MemoryMB: memoryMB},
		Use:      postgres.NodeUse{Sandboxes: sandboxes, MemoryUsedMB: usedMB}}}
}

func TestFree(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    *nodeState
		sent int
		mem  int
		want float64
	}{
		{"empty", testNode("a", 10, 0, 1000, 0), 0, 100, 1},
		{"count bound", testNode("a", 10, 5, 1000, 0), 0, 100, 0.5},
		{"memory bound", testNode("a", 10, 0, 1000, 750), 0, 100, 0.25},
		{"full by count", testNode("a", 2, 2, 1000, 0), 0, 100, 0},
		{"full by memory", testNode("a", 0, 0, 1000, 950), 0, 100, 0},
		{"no count limit", testNode("a", 0, 500, 0, 0), 0, 100, 1},
		{"creates since the heartbeat count", testNode("a", 4, 2, 0, 0), 2, 100, 0},
		{"their memory too", testNode("a", 0, 0, 1000, 500), 4, 100, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNodes(nil, 0, new(atomic.Int64))
			n.noteSent(tc.n.ID, tc.sent)
			if got := n.free(tc.n, tc.mem); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Errorf("free = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlace(t *testing.T) {
	n := newNodes(nil, 0, new(atomic.Int64))
	full := testNode("full", 2, 2, 0, 0)
	busy := testNode("busy", 10, 8, 0, 0)
	idle := testNode("idle", 10, 0, 0, 0)
	if got := n.place([]*nodeState{full}, 100); len(got) != 0 {
		t.Fatalf("a full node was offered: %v", got)
	}
	// Best of two among {busy, idle}: always idle first; busy stays as the
	// fallback; the full node never appears.
	for range 50 {
		got := n.place([]*nodeState{full, busy, idle}, 100)
		if len(got) != 2 || got[0].ID != "idle" || got[1].ID != "busy" {
			t.Fatalf("order %v, want idle then busy", ids(got))
		}
	}
	// Spread: with equal nodes, sent creates tip the balance.
	a, b := testNode("a", 10, 0, 0, 0), testNode("b", 10, 0, 0, 0)
	count := map[string]int{}
	for range 10 {
		first := n.place([]*nodeState{a, b}, 100)[0]
		count[first.ID]++
		n.noteSent(first.ID, 1)
	}
	if count["a"] != 5 || count["b"] != 5 {
		t.Errorf("10 creates over two equal nodes: %v, want 5 each", count)
	}
}

func ids(ns []*nodeState) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}

func TestNodeStateNames(t *testing.T) {
	for _, tc := range []struct {
		reachable, draining bool
		want                string
		ready               bool
	}{
		{true, false, "ready", true},
		{true, true, "draining", false},
		{false, false, "unreachable", false},
		{false, true, "unreachable", false},
	} {
		n := &nodeState{reachable: tc.reachable, Node: postgres.Node{Draining: tc.draining}}
		if n.state() != tc.want || n.ready() != tc.ready {
			t.Errorf("reachable=%v draining=%v: %s ready=%v, want %s %v", tc.reachable, tc.draining, n.state(), n.ready(), tc.want, tc.ready)
		}
	}
}

func TestUntagged(t *testing.T) {
	for in, want := range map[string]string{"name": "name", "name:v2": "name", ":x": ":x", "x:": "x:", "a:b:c": "a:b"} {
		if got := untagged(in); got != want {
			t.Errorf("untagged(%q) = %q, want %q", in, got, want)
		}
	}
}

// A fork's children go where the room is: evenly over equal nodes, by
// room over unequal ones, none to a full node, and no more than fit.
func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*nodeState
		count int
		want  map[string]int
	}{
		{"equal nodes share evenly", []*nodeState{testNode("a", 10, 0, 0, 0), testNode("b", 10, 0, 0, 0),
			testNode("c", 10, 0, 0, 0)}, 12, map[string]int{"a": 4, "b": 4, "c": 4}},
		{"no limits still spread", []*nodeState{testNode("a", 0, 0, 0, 0), testNode("b", 0, 0, 0, 0)},
			5, map[string]int{"a": 3, "b": 2}},
		{"by room", []*nodeState{testNode("a", 10, 6, 0, 0), testNode("b", 10, 0, 0, 0)},
			8, map[string]int{"a": 1, "b": 7}}, // both end with 3 left
		{"a full node gets none", []*nodeState{testNode("a", 2, 2, 0, 0), testNode("b", 10, 0, 0, 0)},
			3, map[string]int{"b": 3}},
		{"no more than fit", []*nodeState{testNode("a", 2, 0, 0, 0), testNode("b", 0, 0, 1000, 800)},
			10, map[string]int{"a": 2, "b": 2}},
		{"nothing fits", []*nodeState{testNode("a", 1, 1, 0, 0)}, 4, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNodes(nil, 0, new(atomic.Int64))
			got := map[string]int{}
			for _, sh := range n.split(tc.nodes, 100, tc.count) {
				if sh.count <= 0 {
					t.Errorf("empty share for %s", sh.node.ID)
				}
				got[sh.node.ID] = sh.count
			}
			if len(got) != len(tc.want) {
				t.Fatalf("split = %v, want %v", got, tc.want)
			}
			for id, c := range tc.want {
				if got[id] != c {
					t.Fatalf("split = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// heartbeats is a nodeStore whose one node's heartbeat age the test sets;
// fail makes its reads fail, hang makes them wait for their context.
type heartbeats struct {
	mu    sync.Mutex
	age   time.Duration
	reads int
	fail  bool
	hang  bool
}

func (h *heartbeats) ListNodes(ctx context.Context) ([]postgres.Node, error) {
	h.mu.Lock()
	h.reads++
	age, fail, hang := h.age, h.fail, h.hang
	h.mu.Unlock()
	switch {
	case hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case fail:
		return nil, errors.New("database away")
	}
	return []postgres.Node{{ID: "node-a", HeartbeatAge: age}}, nil
}

func (h *heartbeats) set(age time.Duration) {
	h.mu.Lock()
	h.age = age
	h.mu.Unlock()
}

func (h *heartbeats) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reads
}

// newTestNodes reads db once and closes the nodes (waiting for their
// reads) when the test ends.
func newTestNodes(t *testing.T, db nodeStore) *nodes {
	t.Helper()
	var queries atomic.Int64
	n := newNodes(db, 1500*time.Millisecond, &queries)
	if err := n.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.close)
	return n
}

// A node refused as unreachable by a view read just before its heartbeat
// resumed is looked up again, in a read begun after the refusal's request
// came, rather than refused until the next periodic refresh.
func TestRecheckBeforeRefusing(t *testing.T) {
	ctx := context.Background()
	db := &heartbeats{age: 5 * time.Second}
	n := newTestNodes(t, db)
	if s, _ := n.current().get("node-a"); s.reachable {
		t.Fatal("a node with a 5 s old heartbeat is reachable")
	}
	db.set(100 * time.Millisecond) // its heartbeat resumed
	if s, _ := n.recheck(ctx).get("node-a"); !s.reachable {
		t.Fatal("node still unreachable after its heartbeat resumed")
	}
	if got := db.count(); got != 2 {
		t.Fatalf("%d reads, want 2", got)
	}
	// The next recheck's read comes no sooner than recheckAge after.
	db.set(5 * time.Second) // gone again
	start := time.Now()
	if s, _ := n.recheck(ctx).get("node-a"); s.reachable {
		t.Fatal("node reachable after its heartbeat stopped")
	}
	if took := time.Since(start); took < recheckAge/2 {
		t.Errorf("a recheck right after another took %v: the reads' rate bound is %v", took, recheckAge)
	}
	if got := db.count(); got != 3 {
		t.Fatalf("%d reads, want 3", got)
	}
}

// Rechecks at once share a read, each sees a view read after it asked,
// and while a node stays down their reads stay within the rate bound.
func TestRechecksShareReads(t *testing.T) {
	ctx := context.Background()
	db := &heartbeats{age: 5 * time.Second}
	n := newTestNodes(t, db)

	const callers = 50
	var wg sync.WaitGroup
	stale := make(chan time.Time, callers)
	for range callers {
		wg.Go(func() {
			asked := time.Now()
			if v := n.recheck(ctx); v.readAt.Before(asked) {
				stale <- v.readAt
			}
		})
	}
	wg.Wait()
	close(stale)
	for at := range stale {
		t.Errorf("a recheck returned a view read at %v, before it asked", at)
	}
	// One read for the callers that came before it began, one more at
	// most for those that came while it ran.
	if got := db.count() - 1; got < 1 || got > 2 {
		t.Errorf("%d callers at once made %d reads, want 1 or 2", callers, got)
	}
	// A stream of refusals for a node that stays down.
	before, start := db.count(), time.Now()
	for time.Since(start) < 4*recheckAge {
		n.recheck(ctx)
	}
	elapsed := time.Since(start)
	if got, bound := db.count()-before, int(elapsed/recheckAge)+1; got > bound {
		t.Errorf("%d reads in %v of rechecks, want at most %d (one per %v)", got, elapsed, bound, recheckAge)
	}
}

// With the database away, rechecks return the view they have, and still
// read at most once per recheckAge, however many callers loop.
func TestRecheckDatabaseAway(t *testing.T) {
	ctx := context.Background()
	db := &heartbeats{age: 5 * time.Second}
	n := newTestNodes(t, db)
	db.mu.Lock()
	db.fail = true
	db.mu.Unlock()
	before, start := db.count(), time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Since(start) < 4*recheckAge {
				if s, ok := n.recheck(ctx).get("node-a"); !ok || s.reachable {
					t.Error("the view changed while the database was away")
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if got, bound := db.count()-before, int(elapsed/recheckAge)+1; got > bound {
		t.Errorf("%d failing reads in %v, want at most %d (one per %v)", got, elapsed, bound, recheckAge)
	}

	// A database that does not answer: a recheck gives up after its read's
	// bound, with the view it has.
	n.rereads.timeout = 100 * time.Millisecond
	db.mu.Lock()
	db.fail, db.hang = false, true
	db.mu.Unlock()
	start = time.Now()
	if _, ok := n.recheck(ctx).get("node-a"); !ok {
		t.Error("the view lost node-a while the database hung")
	}
	if took := time.Since(start); took > 2*recheckAge+n.rereads.timeout+5*time.Second {
		t.Errorf("a recheck with the database hung took %v", took)
	}
}

// A recheck whose caller has gone returns at once, with the view as it is,
// and reads nothing.
func TestRecheckCallerGone(t *testing.T) {
	db := &heartbeats{age: 5 * time.Second}
	n := newTestNodes(t, db)
	before := n.current()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v := n.recheck(ctx); v != before {
		t.Error("a recheck with its context ended did not return the view as it was")
	}
	if got := db.count(); got != 1 {
		t.Errorf("%d reads, want 1 (the first refresh)", got)
	}
}

// gatedNodes answers its first read only once gate closes, with node-a
// unreachable; later reads at once, with it reachable.
type gatedNodes struct {
	gate  chan struct{}
	began chan struct{}
	first atomic.Bool
}

func (g *gatedNodes) ListNodes(context.Context) ([]postgres.Node, error) {
	if g.first.CompareAndSwap(false, true) {
		close(g.began)
		<-g.gate
		return []postgres.Node{{ID: "node-a", HeartbeatAge: time.Hour}}, nil
	}
	return []postgres.Node{{ID: "node-a"}}, nil
}

// A read that began first but ended last does not replace the view of a
// read begun after it.
func TestRefreshKeepsTheNewerRead(t *testing.T) {
	db := &gatedNodes{gate: make(chan struct{}), began: make(chan struct{})}
	var queries atomic.Int64
	n := newNodes(db, 1500*time.Millisecond, &queries)
	older := make(chan error, 1)
	go func() { older <- n.refresh(context.Background()) }()
	<-db.began
	if err := n.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(db.gate)
	if err := <-older; err != nil {
		t.Fatal(err)
	}
	if s, ok := n.current().get("node-a"); !ok || !s.reachable {
		t.Error("the older read's view (node-a unreachable) replaced the newer one")
	}
}
