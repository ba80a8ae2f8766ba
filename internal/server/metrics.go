package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/wire"
)

// networkCollector exports each sandbox's egress byte counters, read from
// the firewall once per scrape.
type networkCollector struct {
	sandboxes *sandbox.Manager
	rx, tx    *prometheus.Desc
}

func newNetworkCollector(sandboxes *sandbox.Manager) *networkCollector {
	return &networkCollector{
		sandboxes: sandboxes,
		rx: prometheus.NewDesc("aenv_sandbox_network_receive_bytes_total",
			"Bytes a sandbox received from outside the node.", []string{"sandbox_id"}, nil),
		tx: prometheus.NewDesc("aenv_sandbox_network_transmit_bytes_total",
			"Bytes a sandbox sent outside the node.", []string{"sandbox_id"}, nil),
	}
}

func (c *networkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rx
	ch <- c.tx
}

func (c *networkCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counters, err := c.sandboxes.NetworkCounters(ctx)
	if err != nil {
		return
	}
	for id, tr := range counters {
		ch <- prometheus.MustNewConstMetric(c.rx, prometheus.CounterValue, float64(tr.RxBytes), id)
		ch <- prometheus.MustNewConstMetric(c.tx, prometheus.CounterValue, float64(tr.TxBytes), id)
	}
}

// capacityCollector exports what GET /node reports: the node's capacity,
// what its sandboxes take of it, and whether it is draining.
type capacityCollector struct {
	info func() api.NodeInfo

	memory, vcpus, maxSandboxes     *prometheus.Desc
	sandboxes, starting, memoryUsed *prometheus.Desc
	draining                        *prometheus.Desc
}

func newCapacityCollector(info func() api.NodeInfo) *capacityCollector {
	return &capacityCollector{
		info: info,
		memory: prometheus.NewDesc("aenv_node_capacity_memory_bytes",
			"Memory this node's sandboxes may be given in all.", nil, nil),
		vcpus: prometheus.NewDesc("aenv_node_capacity_vcpus",
			"CPUs of this node.", nil, nil),
		maxSandboxes: prometheus.NewDesc("aenv_node_capacity_sandboxes",
			"Sandboxes this node may hold (0: no bound on the count).", nil, nil),
		sandboxes: prometheus.NewDesc("aenv_node_sandboxes",
			"Sandboxes on this node: running, paused in memory or starting.", nil, nil),
		starting: prometheus.NewDesc("aenv_node_sandboxes_starting",
			"Sandboxes on this node still starting (creates, restores).", nil, nil),
		memoryUsed: prometheus.NewDesc("aenv_node_memory_assigned_bytes",
			"Memory given to this node's sandboxes.", nil, nil),
		draining: prometheus.NewDesc("aenv_node_draining",
			"1 while this node takes no new sandboxes (drained), else 0.", nil, nil),
	}
}

func (c *capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.memory, c.vcpus, c.maxSandboxes, c.sandboxes, c.starting, c.memoryUsed, c.draining} {
		ch <- d
	}
}

func (c *capacityCollector) Collect(ch chan<- prometheus.Metric) {
	info := c.info()
	draining := 0.0
	if info.State == wire.ClusterNodeStateDraining {
		draining = 1
	}
	for _, m := range []struct {
		d *prometheus.Desc
		v float64
	}{
		{c.memory, float64(info.Capacity.MemoryMB) * (1 << 20)},
		{c.vcpus, float64(info.Capacity.VCPUs)},
		{c.maxSandboxes, float64(info.Capacity.MaxSandboxes)},
		{c.sandboxes, float64(info.Use.Sandboxes)},
		{c.starting, float64(info.Use.Starting)},
		{c.memoryUsed, float64(info.Use.MemoryMB) * (1 << 20)},
		{c.draining, draining},
	} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, m.v)
	}
}
