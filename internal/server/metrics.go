package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/sandbox"
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
