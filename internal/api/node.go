package api

import (
	"net/http"
	"time"
)

// NodeInfo is what GET /node reports: the serving node's own capacity and
// use, in the shape of one entry of a gateway's GET /cluster/nodes, so that
// `aenv cluster status` shows a single server as a cluster of one.
type NodeInfo struct {
	ID             string       `json:"id"`
	Address        string       `json:"address"`
	State          string       `json:"state"` // ready or draining
	Version        string       `json:"version"`
	StartedAt      time.Time    `json:"startedAt"`
	HeartbeatAgeMS int64        `json:"heartbeatAgeMs"` // 0: it answers itself
	Capacity       NodeCapacity `json:"capacity"`
	Use            NodeUse      `json:"use"`
	// Cluster is false on a single server, true on a node of a cluster.
	Cluster bool `json:"cluster"`
}

// NodeCapacity is what a node may hold; 0 means no bound.
type NodeCapacity struct {
	MaxSandboxes int `json:"maxSandboxes"`
	MemoryMB     int `json:"memoryMB"`
	VCPUs        int `json:"vcpus"`
}

// NodeUse is what a node holds now.
type NodeUse struct {
	Sandboxes int `json:"sandboxes"`
	Starting  int `json:"starting"`
	MemoryMB  int `json:"memoryMB"`
}

// getNode is GET /node.
func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, s.cfg.NodeInfo())
	return nil
}
