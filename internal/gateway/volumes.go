package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
)

// A volume is a directory on the node that made it: the gateway lists
// volumes from the cluster's records and sends every other call about one
// to its node. New volumes go to the readiest node.

// createVolume makes a volume on the readiest node that keeps volumes
// (a node of an older release would answer 404).
func (g *Gateway) createVolume(w http.ResponseWriter, r *http.Request) {
	var ready []*nodeState
	for _, n := range g.nodes.current().list {
		if n.ready() && cluster.SpeaksVolumes(n.Protocol) {
			ready = append(ready, n)
		}
	}
	order := g.nodes.place(ready, 0)
	if len(order) == 0 {
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
			"no ready node of the cluster keeps volumes (cluster protocol %d or later: upgrade the nodes)", cluster.VolumesProtocol))
		return
	}
	g.forwardNode(w, r, order[0].ID, "", true)
}

// byVolume sends a call about the volume its path names to the volume's
// node; another team's volume is not found.
func (g *Gateway) byVolume(w http.ResponseWriter, r *http.Request) {
	p := callerOf(r)
	id := r.PathValue("volumeID")
	v, err := g.db.GetVolume(r.Context(), p.TeamID, id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && !p.Sees(v.TeamID)):
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("volume %q not found", id))
	case err != nil:
		g.databaseDown(w, r, err)
	case r.Method == http.MethodDelete && g.nodeGone(r, v.NodeID):
		// Its node has left the cluster, and its files with it: the
		// record is all there is to delete.
		holders, err := g.db.DeleteVolume(r.Context(), v.ID)
		switch {
		case errors.Is(err, store.ErrConflict):
			api.WriteError(w, r, g.logger, volume.MountedError(v, holders))
			return
		case err != nil && !errors.Is(err, store.ErrNotFound):
			g.databaseDown(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		g.forwardNode(w, r, v.NodeID, "", true)
	}
}

// nodeGone reports whether node id is not part of the cluster (removed,
// not merely unreachable), after a fresh read of the nodes.
func (g *Gateway) nodeGone(r *http.Request, id string) bool {
	if _, ok := g.nodes.current().get(id); ok {
		return false
	}
	_, ok := g.nodes.recheck(r.Context()).get(id)
	return !ok
}

// contentRoutes are the volume content API's routes under a volume.
var contentRoutes = map[string]bool{"file": true, "dir": true, "path": true}

// volumeContent sends a call of the volume content API to the volume's
// node. The gateway checks the volume's token itself, so that failures
// count against the client's address here, not the gateway's at the node.
func (g *Gateway) volumeContent(w http.ResponseWriter, r *http.Request) {
	if retry, blocked := g.authFails.Blocked(r); blocked {
		api.WriteTooManyAuthFailures(w, retry)
		return
	}
	// The path is read as the node's router reads it: an escaped one
	// (%2F in the ID) could name one volume here and another there.
	id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/volumecontent/"), "/")
	if r.URL.RawPath != "" || !contentRoutes[rest] {
		g.refuse(w, r, errdefs.ErrNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	token := api.BearerToken(r)
	refuse := func() {
		if token != "" {
			g.authFails.Failed(r)
		}
		api.WriteError(w, r, g.logger, volume.UnauthorizedError(id))
	}
	if !volume.ValidID(id) || token == "" {
		refuse() // without a database read
		return
	}
	v, err := g.db.GetVolume(r.Context(), "", id)
	switch {
	case err != nil && !errors.Is(err, store.ErrNotFound):
		g.databaseDown(w, r, err)
	case err != nil || !volume.TokenOpens(v, id, token):
		refuse()
	default:
		g.forwardNode(w, r, v.NodeID, "", false)
	}
}
