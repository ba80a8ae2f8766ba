package integration

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/wire"
)

// checkBatchMetrics makes two sandboxes of team A and one of team B on e,
// and asks GET /sandboxes/metrics about all three and an unknown ID with
// A's key: exactly A's two have readings, and plausible ones. place, if
// set, runs before each create (0 and 1: A's, 2: B's). It returns the
// sandboxes' IDs, A's first.
func checkBatchMetrics(t *testing.T, e endpoint, place func(i int)) []string {
	keyA, _ := e.makeTeam("team-a")
	keyB, _ := e.makeTeam("team-b")
	var a1, a2, b client.Sandbox
	for i, made := range []struct {
		key string
		sb  *client.Sandbox
	}{{keyA, &a1}, {keyA, &a2}, {keyB, &b}} {
		if place != nil {
			place(i)
		}
		e.want(201, made.key, "POST", "/sandboxes", map[string]any{"templateID": "base"}).json(t, made.sb)
	}
	asked := time.Now()

	var out wire.SandboxesWithMetrics
	ids := strings.Join([]string{a1.SandboxID, b.SandboxID, "nosuchsandbox0000000", a2.SandboxID, a1.SandboxID}, ",")
	e.want(200, keyA, "GET", "/sandboxes/metrics?sandbox_ids="+ids, nil).json(t, &out)
	want := []string{a1.SandboxID, a2.SandboxID}
	slices.Sort(want)
	if got := slices.Sorted(maps.Keys(out.Sandboxes)); !slices.Equal(got, want) {
		t.Fatalf("team A's batch metrics name %v, want its own %v", got, want)
	}
	for id, m := range out.Sandboxes {
		at := time.Unix(m.TimestampUnix, 0)
		if m.CpuCount < 1 || m.MemTotal <= 0 || m.MemUsed < 0 || m.MemUsed > m.MemTotal ||
			at.Before(asked.Add(-5*time.Minute)) || at.After(time.Now().Add(time.Second)) {
			t.Errorf("%s: implausible reading %+v", id, m)
		}
	}

	// B sees its own only; a request naming none is refused.
	out = wire.SandboxesWithMetrics{}
	e.want(200, keyB, "GET", "/sandboxes/metrics?sandbox_ids="+ids, nil).json(t, &out)
	if got := slices.Collect(maps.Keys(out.Sandboxes)); !slices.Equal(got, []string{b.SandboxID}) {
		t.Errorf("team B's batch metrics name %v, want its own %s", got, b.SandboxID)
	}
	e.want(400, keyA, "GET", "/sandboxes/metrics", nil)
	return []string{a1.SandboxID, a2.SandboxID, b.SandboxID}
}

func TestBatchMetricsSingleServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	checkBatchMetrics(t, newEndpoint(t, s.url), nil)
}

// Through a gateway, over two nodes: the answer merges the nodes'. A's
// two sandboxes are put on one node each by draining the other.
func TestBatchMetricsThroughGateway(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	nodes := map[string]endpoint{}
	for _, id := range []string{"node-a", "node-b"} {
		nodes[id] = newEndpoint(t, c.addNode(id).url)
	}
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	drain := func(node string, on bool) {
		if err := g.api.DrainNode(context.Background(), node, on); err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{true: "draining", false: "ready"}[on]
		waitFor(t, 10*time.Second, node+" "+want, func() bool { return g.nodeStates(t)[node].State == want })
		// The node learns of it with its next heartbeat, maybe after the
		// gateway: a create sent before would be refused.
		waitFor(t, 10*time.Second, node+" "+want+" by its own account", func() bool {
			var info struct {
				State string `json:"state"`
			}
			nodes[node].want(200, apiKey, "GET", "/node", nil).json(t, &info)
			return info.State == want
		})
	}
	ids := checkBatchMetrics(t, newEndpoint(t, g.url), func(i int) {
		switch i {
		case 0:
			drain("node-b", true)
		case 1:
			drain("node-b", false)
			drain("node-a", true)
		case 2:
			drain("node-a", false)
		}
	})
	if a1, _ := g.sandboxNode(t, ids[0]); a1 != "node-a" {
		t.Errorf("team A's first sandbox is on %s, want node-a", a1)
	}
	if a2, _ := g.sandboxNode(t, ids[1]); a2 != "node-b" {
		t.Errorf("team A's second sandbox is on %s, want node-b", a2)
	}
}
