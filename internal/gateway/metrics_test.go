package gateway

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// The gateway exports its view of the nodes: counts by state (zeros
// included) and each node's heartbeat and use.
func TestNodesMetrics(t *testing.T) {
	up, draining, down := newFakeNode(t, "up", nil), newFakeNode(t, "drained", nil), newFakeNode(t, "down", nil)
	db := newFakeStore()
	drained := nodeRecord(draining, 10, 1, false)
	drained.Draining = true
	db.nodes = []postgres.Node{nodeRecord(up, 10, 3, false), drained, nodeRecord(down, 10, 0, true)}
	for i := range db.nodes {
		db.nodes[i].Protocol = cluster.Protocol
	}
	reg := prometheus.NewRegistry()
	g, err := New(context.Background(), Config{NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20, ClusterSecret: "secret",
		APIKey: testKey}, db, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	got := map[string]float64{} // "name{label}" -> value
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetValue() + "}"
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"aenv_gateway_nodes{ready}": 1, "aenv_gateway_nodes{draining}": 1, "aenv_gateway_nodes{unreachable}": 1, "aenv_gateway_nodes{incompatible}": 0,
		"aenv_gateway_node_sandboxes{up}": 3, "aenv_gateway_node_sandboxes{drained}": 1,
		"aenv_gateway_node_heartbeat_age_seconds{down}": 3600, "aenv_gateway_node_capacity_sandboxes{up}": 10,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	if _, ok := got["aenv_gateway_node_view_age_seconds"]; !ok {
		t.Error("no aenv_gateway_node_view_age_seconds")
	}
}
