package gateway

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// A volume is a directory on the node that made it: the gateway lists
// volumes from the cluster's records and sends every other call about one
// to its node. New volumes go to the readiest node.

// listVolumes answers GET /volumes from the cluster's records.
func (g *Gateway) listVolumes(w http.ResponseWriter, r *http.Request) {
	p := callerOf(r)
	team := p.TeamID
	if p.Admin {
		team = ""
	}
	vs, err := g.db.ListVolumes(r.Context(), team)
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	out := make([]wire.Volume, 0, len(vs))
	for _, v := range vs {
		out = append(out, wire.Volume{VolumeID: v.ID, Name: v.Name})
	}
	api.WriteJSON(w, http.StatusOK, out)
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
	default:
		g.forwardNode(w, r, v.NodeID, "", true)
	}
}

// volumeContent sends a call of the volume content API to the volume's
// node. The gateway checks the volume's token itself, so that failures
// count against the client's address here, not the gateway's at the node.
func (g *Gateway) volumeContent(w http.ResponseWriter, r *http.Request) {
	if retry, blocked := g.authFails.Blocked(r); blocked {
		api.WriteTooManyAuthFailures(w, retry)
		return
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/volumecontent/"), "/")
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token = strings.TrimSpace(token)
	v, err := g.db.GetVolume(r.Context(), "", id)
	switch {
	case err != nil && !errors.Is(err, store.ErrNotFound):
		g.databaseDown(w, r, err)
	case err != nil || v.ID != id || token == "" || subtle.ConstantTimeCompare([]byte(v.Token), []byte(token)) != 1:
		if token != "" {
			g.authFails.Failed(r)
		}
		g.refuse(w, r, errdefs.ErrUnauthenticated,
			fmt.Sprintf("invalid token for volume %q (Authorization: Bearer <the volume's token>)", id))
	default:
		g.forwardNode(w, r, v.NodeID, "", false)
	}
}
