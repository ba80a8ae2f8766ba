package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodesCollector exports the gateway's view of the cluster's nodes, as it
// routes by it: how many are in each state, each one's heartbeat and use,
// and how old the view is (it ages while the database is unreachable).
type nodesCollector struct {
	nodes *nodes

	byState, heartbeat, sandboxes, maxSandboxes, memory, memoryUsed, viewAge *prometheus.Desc
}

// nodeStates are the states aenv_gateway_nodes always reports, zeros
// included, so that an alert on one sees 0 rather than no series.
var nodeStates = []string{"ready", "draining", "unreachable", "incompatible"}

func newNodesCollector(n *nodes) *nodesCollector {
	node := []string{"node"}
	return &nodesCollector{
		nodes: n,
		byState: prometheus.NewDesc("aenv_gateway_nodes",
			"Nodes of the cluster by state: ready, draining, unreachable (no heartbeat within the node timeout), incompatible (a cluster protocol this gateway cannot work with).",
			[]string{"state"}, nil),
		heartbeat: prometheus.NewDesc("aenv_gateway_node_heartbeat_age_seconds",
			"Age of each node's last heartbeat, by the database's clock.", node, nil),
		sandboxes: prometheus.NewDesc("aenv_gateway_node_sandboxes",
			"Sandboxes each node holds, as of its last heartbeat.", node, nil),
		maxSandboxes: prometheus.NewDesc("aenv_gateway_node_capacity_sandboxes",
			"Sandboxes each node may hold (0: no bound on the count).", node, nil),
		memory: prometheus.NewDesc("aenv_gateway_node_capacity_memory_bytes",
			"Memory each node's sandboxes may be given in all.", node, nil),
		memoryUsed: prometheus.NewDesc("aenv_gateway_node_memory_assigned_bytes",
			"Memory given to each node's sandboxes, as of its last heartbeat.", node, nil),
		viewAge: prometheus.NewDesc("aenv_gateway_node_view_age_seconds",
			"Time since the gateway last read the cluster's nodes (grows while the database is unreachable).", nil, nil),
	}
}

func (c *nodesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.byState, c.heartbeat, c.sandboxes, c.maxSandboxes, c.memory, c.memoryUsed, c.viewAge} {
		ch <- d
	}
}

func (c *nodesCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.nodes.current()
	counts := map[string]int{}
	gauge := func(d *prometheus.Desc, value float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, value, labels...)
	}
	for _, n := range v.list {
		counts[n.state()]++
		gauge(c.heartbeat, n.HeartbeatAge.Seconds(), n.ID)
		gauge(c.sandboxes, float64(n.Use.Sandboxes), n.ID)
		gauge(c.maxSandboxes, float64(n.Capacity.MaxSandboxes), n.ID)
		gauge(c.memory, float64(n.Capacity.MemoryMB)*(1<<20), n.ID)
		gauge(c.memoryUsed, float64(n.Use.MemoryUsedMB)*(1<<20), n.ID)
	}
	for _, s := range nodeStates {
		gauge(c.byState, float64(counts[s]), s)
		delete(counts, s)
	}
	for s, count := range counts { // a state added since
		gauge(c.byState, float64(count), s)
	}
	if !v.readAt.IsZero() {
		gauge(c.viewAge, time.Since(v.readAt).Seconds())
	}
}
