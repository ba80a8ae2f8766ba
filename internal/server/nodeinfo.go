package server

import (
	goruntime "runtime"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/meminfo"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/wire"
)

// nodeInfo reports the node's capacity and use for GET /node. A single
// server has no limits of its own: its capacity is the machine's memory
// and CPUs, with no bound on the count.
func nodeInfo(cfg config.Server, member *clusterMember, sandboxes *sandbox.Manager, served node.Node) func() api.NodeInfo {
	started := time.Now().UTC()
	memMB := 0
	if total, err := meminfo.Read("MemTotal"); err == nil {
		memMB = int(total >> 20)
	}
	info := api.NodeInfo{ID: member.nodeID(), Address: cfg.Listen, StartedAt: started, Protocol: cluster.Protocol,
		Capacity: api.NodeCapacity{MemoryMB: memMB, VCPUs: goruntime.NumCPU()}}
	if member != nil {
		info.Cluster = true
		info.Version = member.cfg.Version
		info.Capacity.MaxSandboxes = member.cfg.MaxSandboxes
		info.Capacity.MemoryMB = member.cfg.SandboxMemoryMB(memMB)
		if addr, err := advertiseAddress(member.cfg.Advertise, cfg.Listen); err == nil {
			info.Address = addr
		}
	}
	return func() api.NodeInfo {
		out := info
		out.State = wire.ClusterNodeStateReady
		if a, ok := served.(*cluster.Admission); ok && a.Draining() {
			out.State = wire.ClusterNodeStateDraining
		}
		u := sandboxes.Use()
		out.Use = api.NodeUse{Sandboxes: u.Sandboxes, Starting: u.Starting, MemoryMB: u.MemoryMB}
		return out
	}
}
