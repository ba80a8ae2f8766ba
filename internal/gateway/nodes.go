package gateway

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// nodeState is one node as the gateway last read it.
type nodeState struct {
	postgres.Node
	reachable bool
	// incompatible says why this gateway cannot work with the node (its
	// cluster protocol, see internal/cluster), or is "".
	incompatible string
}

// ready reports whether the node takes new sandboxes.
func (n *nodeState) ready() bool { return n.reachable && !n.Draining && n.incompatible == "" }

// state is the node's state as /cluster/nodes reports it.
func (n *nodeState) state() string {
	switch {
	case n.incompatible != "":
		return "incompatible"
	case !n.reachable:
		return "unreachable"
	case n.Draining:
		return "draining"
	}
	return "ready"
}

// nodeView is the cluster's nodes as of one read of the database,
// published whole (readers never lock).
type nodeView struct {
	byID   map[string]*nodeState
	list   []*nodeState // by ID
	readAt time.Time    // when the read that gave it began
}

func (v *nodeView) get(id string) (*nodeState, bool) {
	n, ok := v.byID[id]
	return n, ok
}

// nodes keeps the gateway's view of the cluster's nodes fresh: one query
// every interval, whatever the traffic, so that routing reads no database.
type nodes struct {
	db      nodeStore
	timeout time.Duration // a heartbeat older than this: unreachable
	// version is the gateway's release, for the reason a node is
	// incompatible; logger, when set, tells of each such node once.
	version string
	logger  *slog.Logger
	warned  map[string]int // node ID → the protocol it was logged with; guarded by mu
	view    atomic.Pointer[nodeView]
	queries *atomic.Int64 // database round trips, for metrics

	// sent counts creates per node since the view was read: a node's use
	// in the view lags by up to a heartbeat, and a burst must not all land
	// on the node that looked emptiest.
	mu   sync.Mutex
	sent map[string]int

	// rereads are the reads of the nodes that rechecks wait for.
	rereads *sharedRead
}

func newNodes(db nodeStore, timeout time.Duration, queries *atomic.Int64) *nodes {
	n := &nodes{db: db, timeout: timeout, queries: queries, sent: map[string]int{}, warned: map[string]int{}}
	n.view.Store(&nodeView{byID: map[string]*nodeState{}})
	n.rereads = newSharedRead(n.refresh, func() time.Time { return n.current().readAt }, recheckAge, recheckTimeout)
	return n
}

// refresh reads the nodes once. On failure the previous view stays: while
// the database is away, nodes keep being reached where they were.
func (n *nodes) refresh(ctx context.Context) error {
	n.queries.Add(1)
	began := time.Now()
	list, err := n.db.ListNodes(ctx)
	if err != nil {
		return err
	}
	v := &nodeView{byID: make(map[string]*nodeState, len(list)), readAt: began}
	for _, rec := range list {
		s := &nodeState{Node: rec, reachable: rec.HeartbeatAge <= n.timeout,
			incompatible: cluster.IncompatibleReason(rec.Protocol, rec.Version, n.version)}
		v.byID[rec.ID] = s
		v.list = append(v.list, s)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	// Reads overlap (the periodic refresh, a recheck's): one begun later
	// that ended first is the newer view.
	if began.Before(n.current().readAt) {
		return nil
	}
	n.view.Store(v)
	clear(n.sent)
	n.warnIncompatible(v)
	return nil
}

// warnIncompatible logs each node this gateway cannot work with, once per
// protocol it shows: during a rolling upgrade the operator sees at once
// which side to upgrade. n.mu is held.
func (n *nodes) warnIncompatible(v *nodeView) {
	for id := range n.warned {
		if _, ok := v.byID[id]; !ok {
			delete(n.warned, id) // removed from the cluster
		}
	}
	for _, s := range v.list {
		if s.incompatible == "" {
			delete(n.warned, s.ID)
			continue
		}
		if p, ok := n.warned[s.ID]; ok && p == s.Protocol {
			continue
		}
		n.warned[s.ID] = s.Protocol
		if n.logger != nil {
			n.logger.Warn("node not used", "node", s.ID, "reason", s.incompatible)
		}
	}
}

func (n *nodes) current() *nodeView { return n.view.Load() }

// building is the template builds under way on the reachable nodes, as
// their last heartbeats published them.
func (n *nodes) building() []store.BuildProgress {
	var out []store.BuildProgress
	for _, s := range n.current().list {
		if s.reachable && cluster.PublishesBuilds(s.Protocol) {
			out = append(out, s.Use.Builds...)
		}
	}
	return out
}

// recheckAge is the least time between two reads of the nodes made for
// rechecks, whether they succeed or not: while a node really is down, the
// calls refused for it cost the database a few reads a second, however
// many they are.
const recheckAge = 250 * time.Millisecond

// recheckTimeout bounds one such read.
const recheckTimeout = 2 * time.Second

// recheck returns the nodes as read after it was called, for a refusal (a
// node unknown or unreachable) to rest on what the database says now, not
// on a view read a moment before the node's heartbeat resumed. Rechecks
// share reads (sharedRead), at most one per recheckAge. It returns the
// view as it is if ctx ends first, if the read it waited for failed, or
// after twice recheckAge plus the read's bound (a database that does not
// answer).
func (n *nodes) recheck(ctx context.Context) *nodeView {
	asked := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 2*recheckAge+n.rereads.timeout)
	defer cancel()
	n.rereads.since(ctx, asked) // on failure the view stays as it was
	return n.current()
}

// close stops the reads for rechecks (their base has ended or is about
// to) and waits for those running.
func (n *nodes) close() { n.rereads.close() }

// noteSent counts a sandbox placed on node id since the last refresh.
func (n *nodes) noteSent(id string, count int) {
	n.mu.Lock()
	n.sent[id] += count
	n.mu.Unlock()
}

// free is the share of node s's room left for a sandbox of memoryMB, by
// count and by memory, whichever is tighter; <= 0 means full.
func (n *nodes) free(s *nodeState, memoryMB int) float64 {
	n.mu.Lock()
	sent := n.sent[s.ID]
	n.mu.Unlock()
	share := 1.0
	if max := s.Capacity.MaxSandboxes; max > 0 {
		left := max - s.Use.Sandboxes - sent
		if left < 1 {
			return 0
		}
		share = min(share, float64(left)/float64(max))
	}
	if limit := s.Capacity.MemoryMB; limit > 0 {
		left := limit - s.Use.MemoryUsedMB - sent*memoryMB
		if left < memoryMB {
			return 0
		}
		share = min(share, float64(left)/float64(limit))
	}
	return share
}

// place orders the candidates for a new sandbox: the better of two picked
// at random first (E2B's best-of-K, K=2: it spreads load without every
// gateway piling onto the one node that looks emptiest), then the others,
// freest first, as fallbacks should the first refuse.
func (n *nodes) place(candidates []*nodeState, memoryMB int) []*nodeState {
	type scored struct {
		node *nodeState
		free float64
	}
	var room []scored
	for _, c := range candidates {
		if f := n.free(c, memoryMB); f > 0 {
			room = append(room, scored{c, f})
		}
	}
	if len(room) == 0 {
		return nil
	}
	first := rand.IntN(len(room))
	if len(room) > 1 {
		second := rand.IntN(len(room) - 1)
		if second >= first {
			second++
		}
		if room[second].free > room[first].free {
			first = second
		}
	}
	out := []*nodeState{room[first].node}
	room = slices.Delete(room, first, first+1)
	slices.SortFunc(room, func(a, b scored) int {
		switch {
		case a.free > b.free:
			return -1
		case a.free < b.free:
			return 1
		}
		return 0
	})
	for _, r := range room {
		out = append(out, r.node)
	}
	return out
}

// forkShare is the part of a fork one node makes.
type forkShare struct {
	node  *nodeState
	count int
}

// split divides count new sandboxes of memoryMB over the candidates, each
// to the node with the most room left at that point (ties to the one given
// fewer so far, so equal nodes get equal shares). It stops when every node
// is full and counts what it placed as sent.
func (n *nodes) split(candidates []*nodeState, memoryMB, count int) []forkShare {
	at := map[string]int{}
	var out []forkShare
	for range count {
		var best *nodeState
		bestFree, bestGiven := 0.0, 0
		for _, c := range candidates {
			f := n.free(c, memoryMB)
			given := 0
			if i, ok := at[c.ID]; ok {
				given = out[i].count
			}
			if f > bestFree || f == bestFree && f > 0 && given < bestGiven {
				best, bestFree, bestGiven = c, f, given
			}
		}
		if best == nil {
			break
		}
		n.noteSent(best.ID, 1)
		i, ok := at[best.ID]
		if !ok {
			i = len(out)
			at[best.ID] = i
			out = append(out, forkShare{node: best})
		}
		out[i].count++
	}
	return out
}
