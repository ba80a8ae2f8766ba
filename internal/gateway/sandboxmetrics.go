package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// Bounds of GET /sandboxes/metrics over the cluster.
const (
	// metricsTimeout bounds the nodes' answers together: a node that
	// hangs leaves its sandboxes out instead of holding back the others'.
	// The nodes (at most one per sandbox named, api.MaxMetricsSandboxes)
	// are asked all at once, so the whole call takes at most this.
	metricsTimeout = 5 * time.Second
	// maxMetricsAnswerBytes bounds what is read of a node's answer (the
	// 100 samples it may hold are about 25 KB).
	maxMetricsAnswerBytes = 1 << 20
)

// sandboxMetrics serves E2B's GET /sandboxes/metrics over the cluster:
// the named sandboxes grouped by the node holding each, one call to each
// of those nodes (in parallel, bounded), their answers merged. Each node
// answers for the caller's team, so another team's sandboxes are left out
// there if not already here. A sandbox whose node is unreachable, fails
// or does not answer in time is left out too, as one without a reading:
// the answer is still 200.
func (g *Gateway) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	g.count("sandbox-metrics")
	ids, err := api.ParseSandboxIDs(r.URL.Query())
	if err != nil {
		api.WriteError(w, r, g.logger, err)
		return
	}
	byNode, err := g.routesOf(r, ids)
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	out := g.metricsOfNodes(r, byNode)
	// The routes of sandboxes left out are read afresh next time: one
	// resumed on another node while its own was down is found there. A
	// poll naming such sandboxes costs one query; one whose every sandbox
	// has a reading costs none.
	for _, id := range ids {
		if _, ok := out[id]; !ok {
			g.routes.forget(id)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(wire.SandboxesWithMetrics{Sandboxes: out})
}

// routesOf groups ids by the node holding each: from the route cache, and
// for the rest from one read of their records by ID (one query, not one
// per ID, sized by the request). An ID that read leaves out (unknown,
// another team's, dead) is in no group: no node is asked about it.
func (g *Gateway) routesOf(r *http.Request, ids []string) (map[string][]string, error) {
	byNode := map[string][]string{}
	missed := map[string]bool{}
	for _, id := range ids {
		if n, ok := g.routes.get(id); ok {
			byNode[n] = append(byNode[n], id)
		} else {
			missed[id] = true
		}
	}
	if len(missed) == 0 {
		return byNode, nil
	}
	f := store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused},
		IDs: slices.Collect(maps.Keys(missed))}
	if p := callerOf(r); !p.Admin {
		f.TeamID = p.TeamID
	}
	g.queries.Add(1)
	live, err := g.db.ListSandboxes(r.Context(), f)
	if err != nil {
		return nil, fmt.Errorf("list live sandboxes: %w", err)
	}
	for _, sb := range live {
		if missed[sb.ID] {
			g.routes.put(sb.ID, sb.NodeID)
			byNode[sb.NodeID] = append(byNode[sb.NodeID], sb.ID)
		}
	}
	return byNode, nil
}

// metricsOfNodes asks each node of byNode for the readings of its
// sandboxes and merges the answers; a node unreachable, failing or slow
// adds nothing.
func (g *Gateway) metricsOfNodes(r *http.Request, byNode map[string][]string) map[string]wire.SandboxMetric {
	ctx := r.Context()
	view := g.nodes.current()
	for nodeID := range byNode {
		if n, ok := view.get(nodeID); !ok || !n.reachable {
			// Before leaving sandboxes out, as forwardNode before a
			// refusal: the view may be a moment old.
			view = g.nodes.recheck(ctx)
			break
		}
	}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	var mu sync.Mutex
	out := map[string]wire.SandboxMetric{}
	var calls errgroup.Group
	for nodeID, ids := range byNode {
		n, ok := view.get(nodeID)
		if !ok || !n.reachable {
			g.logger.DebugContext(ctx, "batch metrics: node unreachable, its sandboxes left out",
				"node", nodeID, "sandboxes", len(ids))
			continue
		}
		calls.Go(func() error {
			got, err := g.nodeMetrics(ctx, r, n, ids)
			if err != nil {
				if ctx.Err() == nil {
					g.logger.WarnContext(ctx, "batch metrics: node's sandboxes left out", "node", nodeID,
						"sandboxes", len(ids), "err", err)
				}
				return nil // the other nodes' answers stand
			}
			mu.Lock()
			maps.Copy(out, got)
			mu.Unlock()
			return nil
		})
	}
	calls.Wait()
	return out
}

// nodeMetrics asks node n for the latest readings of ids, within ctx, as
// r's caller (the node keeps to the caller's team), and returns those of
// ids it answered.
func (g *Gateway) nodeMetrics(ctx context.Context, r *http.Request, n *nodeState, ids []string) (map[string]wire.SandboxMetric, error) {
	sub := r.WithContext(ctx)
	sub.URL = &url.URL{Path: "/sandboxes/metrics",
		RawQuery: url.Values{api.MetricsSandboxIDs: {strings.Join(ids, ",")}}.Encode()}
	// A client's Accept-Encoding, copied along, would turn off the
	// transport's own decompression of the answer.
	sub.Header = r.Header.Clone()
	sub.Header.Del("Accept-Encoding")
	resp, err := g.send(sub, n, nil)
	if err != nil {
		return nil, fmt.Errorf("ask node %s: %w", n.ID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsAnswerBytes))
	if err != nil {
		return nil, fmt.Errorf("read node %s's answer: %w", n.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("node %s answered %s: %s", n.ID, resp.Status, bytes.TrimSpace(body[:min(len(body), 512)]))
	}
	var answer wire.SandboxesWithMetrics
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, fmt.Errorf("node %s's answer: %w", n.ID, err)
	}
	// Only what was asked: a node speaks for the sandboxes it was sent.
	out := make(map[string]wire.SandboxMetric, len(ids))
	for _, id := range ids {
		if m, ok := answer.Sandboxes[id]; ok {
			out[id] = m
		}
	}
	return out, nil
}
