package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/wire"
)

// The node's capacity and use, as GET /node reports them, are in /metrics.
func TestCapacityCollector(t *testing.T) {
	for _, tc := range []struct {
		state    wire.ClusterNodeState
		draining float64
	}{
		{wire.ClusterNodeStateReady, 0},
		{wire.ClusterNodeStateDraining, 1},
	} {
		t.Run(string(tc.state), func(t *testing.T) {
			info := api.NodeInfo{State: tc.state,
				Capacity: api.NodeCapacity{MemoryMB: 2048, VCPUs: 4, MaxSandboxes: 10},
				Use:      api.NodeUse{Sandboxes: 3, Starting: 1, MemoryMB: 512}}
			reg := prometheus.NewRegistry()
			reg.MustRegister(newCapacityCollector(func() api.NodeInfo { return info }))
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range families {
				got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
			want := map[string]float64{
				"aenv_node_capacity_memory_bytes": 2 << 30, "aenv_node_capacity_vcpus": 4, "aenv_node_capacity_sandboxes": 10,
				"aenv_node_sandboxes": 3, "aenv_node_sandboxes_starting": 1, "aenv_node_memory_assigned_bytes": 512 << 20,
				"aenv_node_draining": tc.draining,
			}
			if len(got) != len(want) {
				t.Errorf("got %d metrics, want %d: %v", len(got), len(want), got)
			}
			for name, v := range want {
				if got[name] != v {
					t.Errorf("%s = %v, want %v", name, got[name], v)
				}
			}
		})
	}
}
