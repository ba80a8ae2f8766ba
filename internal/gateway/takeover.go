package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// resumesSandbox reports whether r resumes a sandbox (E2B's resume and
// connect).
func resumesSandbox(r *http.Request) bool {
	return r.Method == http.MethodPost &&
		(strings.HasSuffix(r.URL.Path, "/resume") || strings.HasSuffix(r.URL.Path, "/connect"))
}

// takeOver serves the resume of sandbox id whose node is unreachable. A
// sandbox paused to disk with its image in the object store is resumed on
// another node, which takes its record over (E2B resumes on the origin
// node when it can and falls back elsewhere; so does this). Anything else
// answers that the node is unreachable.
func (g *Gateway) takeOver(w http.ResponseWriter, r *http.Request, id, from string) {
	unreachable := func(why string) {
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
			"sandbox %s is on node %s, which is unreachable%s", id, from, why))
	}
	g.queries.Add(1)
	sb, err := g.db.GetSandbox(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		g.routes.forget(id)
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", id))
		return
	case err != nil:
		g.databaseDown(w, r, err)
		return
	}
	if p := callerOf(r); !p.Sees(sb.TeamID) {
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", id))
		return
	}
	if sb.NodeID != from {
		// Moved already (through another gateway): follow it.
		g.routes.put(id, sb.NodeID)
		g.forwardNode(w, r, sb.NodeID, id, true)
		return
	}
	if sb.State != store.StatePaused || sb.ImageDir == "" || sb.ImageUpload != store.UploadUploaded {
		unreachable("; only a sandbox paused to disk with its image in the object store can be resumed elsewhere")
		return
	}
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	var candidates []*nodeState
	for _, n := range g.nodes.current().list {
		if n.ready() && n.SharedImages && n.ID != from {
			candidates = append(candidates, n)
		}
	}
	order := g.nodes.place(candidates, sb.MemoryMB)
	if len(order) == 0 {
		unreachable(", and no other node with the object store has room for it now")
		return
	}
	// 404: the node may not take it yet (the old node has not been silent
	// for long enough by the database's clock); the next may.
	resp, n, last, err := g.sendFirst(r, order, body, nil,
		http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusNotFound)
	switch {
	case err != nil:
		if r.Context().Err() == nil {
			unreachable(fmt.Sprintf("; node %s failed taking it over: %v", n.ID, err))
		}
	case resp == nil:
		unreachable("; no other node could resume it yet (last: " + last + "); try again")
	default:
		if resp.StatusCode < 300 {
			g.routes.put(id, n.ID)
		}
		g.relay(w, r, resp, n.ID)
	}
}
