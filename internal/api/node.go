package api

import (
	"net/http"

	"github.com/aenv-dev/aenv/internal/wire"
)

// NodeInfo is what GET /node reports: the serving node's own capacity and
// use, in the shape of one entry of a gateway's GET /cluster/nodes (one
// type, wire.ClusterNode), so that `aenv cluster status` shows a single
// server as a cluster of one.
type NodeInfo = wire.ClusterNode

// NodeCapacity is what a node may hold; 0 means no bound.
type NodeCapacity = wire.NodeCapacity

// NodeUse is what a node holds now.
type NodeUse = wire.NodeUse

// getNode is GET /node.
func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin {
		return errAdminOnly
	}
	writeJSON(w, http.StatusOK, s.cfg.NodeInfo())
	return nil
}
