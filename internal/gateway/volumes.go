package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
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

// moveVolume moves a volume nothing mounts to another node: the one the
// body names ({"nodeID": ...}), else the readiest. The move is begun in
// the database (no sandbox may mount the volume meanwhile), the volume's
// files are streamed from its node's export into the other's import,
// which ends the move in the database, and the node left then drops its
// copy. Any failure before the end leaves the volume where it was.
func (g *Gateway) moveVolume(w http.ResponseWriter, r *http.Request) {
	p := callerOf(r)
	id := r.PathValue("volumeID")
	var req wire.MoveVolume
	if err := api.DecodeOptionalJSON(w, r, 1<<20, &req); err != nil {
		api.WriteError(w, r, g.logger, err)
		return
	}
	v, err := g.db.GetVolume(r.Context(), p.TeamID, id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && !p.Sees(v.TeamID)):
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("volume %q not found", id))
		return
	case err != nil:
		g.databaseDown(w, r, err)
		return
	}
	view := g.nodes.current()
	from, ok := view.get(v.NodeID)
	if !ok || !from.reachable {
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf("volume %s is on node %s, which is unreachable: its files cannot be moved", v.Name, v.NodeID))
		return
	}
	if !cluster.MovesVolumes(from.Protocol) {
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf("node %s is of an older release, which does not move volumes (cluster protocol %d or later)",
			from.ID, cluster.VolumeMovesProtocol))
		return
	}
	var to *nodeState
	if req.NodeID != nil && *req.NodeID != "" && !p.Admin {
		// Where volumes go is the operator's to say.
		g.refuse(w, r, errdefs.ErrPermissionDenied, "only an admin key chooses the node a volume moves to; leave nodeID out for the readiest")
		return
	}
	if req.NodeID != nil && *req.NodeID != "" {
		n, ok := view.get(*req.NodeID)
		switch {
		case !ok:
			g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("node %q is not part of the cluster", *req.NodeID))
			return
		case n.ID == from.ID:
			g.refuse(w, r, errdefs.ErrInvalidArgument, fmt.Sprintf("volume %s is on node %s already", v.Name, n.ID))
			return
		case !n.ready() || !cluster.MovesVolumes(n.Protocol):
			g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf("node %s cannot take volumes now (%s)", n.ID, n.state()))
			return
		}
		to = n
	} else {
		var ready []*nodeState
		for _, n := range view.list {
			if n.ID != from.ID && n.ready() && cluster.MovesVolumes(n.Protocol) {
				ready = append(ready, n)
			}
		}
		if order := g.nodes.place(ready, 0); len(order) > 0 {
			to = order[0]
		}
		if to == nil {
			g.refuse(w, r, errdefs.ErrUnavailable, "no other ready node can take the volume now")
			return
		}
	}
	if req.Wait != nil && !*req.Wait {
		g.moveInBackground(w, r, v, from, to)
		return
	}
	// Carried out whether or not the client waits for the answer: a proxy
	// that cuts a long request does not cut the move (a node that stops
	// making progress does).
	resp, err := g.relocate(r.WithContext(context.WithoutCancel(r.Context())), v, from, to)
	var answered *nodeAnswer
	switch {
	case errors.As(err, &answered):
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(answered.status)
		w.Write(answered.body)
		return
	case err != nil:
		api.WriteError(w, r, g.logger, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(resp)
}

// moveInBackground begins the move of v from node from to node to, answers
// 202 with the volume (movingTo says where), and carries the move out
// after the answer. The gateway's Close cancels it (then it is aborted).
func (g *Gateway) moveInBackground(w http.ResponseWriter, r *http.Request, v *store.Volume, from, to *nodeState) {
	if !g.trackMove() {
		g.refuse(w, r, errdefs.ErrUnavailable, "the gateway is stopping: try another")
		return
	}
	// From here the move is this gateway's to end, whoever leaves.
	ctx, end := g.moveContext(context.WithoutCancel(r.Context()))
	r = r.WithContext(ctx)
	token, err := g.beginMove(r, v, from, to)
	if err != nil {
		end()
		g.moves.Done()
		api.WriteError(w, r, g.logger, err)
		return
	}
	go func() {
		defer g.moves.Done()
		defer end()
		if _, err := g.carryMove(r, v, token, from, to); err != nil {
			g.logger.WarnContext(ctx, "a volume move failed; the volume stays where it was", "volume", v.ID, "from", from.ID, "to", to.ID, "err", err)
			return
		}
		g.logger.InfoContext(ctx, "moved a volume", "volume", v.ID, "from", from.ID, "to", to.ID)
	}()
	moving := *v
	moving.NodeID, moving.MovingTo = from.ID, to.ID
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(api.VolumeAnswer(&moving))
}

// relocate moves volume v, which nothing may mount, from node from to
// node to, and answers the volume as its new node gives it. The move is
// begun in the database (no sandbox may mount the volume meanwhile), the
// volume's files are streamed from its node's export into the other's
// import, which ends the move in the database, and the node left then
// drops its copy. Any failure before the end leaves the volume where it
// was. A node's refusal of a step is a *nodeAnswer; other errors carry
// their errdefs kind.
//
// The move ends with r's context, or when the gateway closes.
func (g *Gateway) relocate(r *http.Request, v *store.Volume, from, to *nodeState) ([]byte, error) {
	if !g.trackMove() {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "the gateway is stopping: try another")
	}
	defer g.moves.Done()
	ctx, end := g.moveContext(r.Context())
	defer end()
	r = r.WithContext(ctx)
	token, err := g.beginMove(r, v, from, to)
	if err != nil {
		return nil, err
	}
	return g.carryMove(r, v, token, from, to)
}

// trackMove counts a move the gateway carries out, which its Close waits
// for (the caller calls g.moves.Done at its end): false once Close began.
func (g *Gateway) trackMove() bool {
	g.closeMu.Lock()
	defer g.closeMu.Unlock()
	if g.closing {
		return false
	}
	g.moves.Add(1)
	return true
}

// moveContext is ctx, ended too when the gateway closes (the move is
// then aborted).
func (g *Gateway) moveContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.runCtx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// beginMove marks volume v as moving from node from to node to in the
// records (no sandbox may mount it from then on), and returns the move's
// token.
func (g *Gateway) beginMove(r *http.Request, v *store.Volume, from, to *nodeState) (int64, error) {
	token, holders, err := g.db.BeginVolumeMove(r.Context(), v.ID, from.ID, to.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return 0, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", v.Name)
	case errors.Is(err, store.ErrConflict) && len(holders) > 0:
		return 0, &mountedError{volume.MountedError(v, holders)}
	case errors.Is(err, store.ErrConflict):
		return 0, errdefs.Errorf(errdefs.ErrConflict, "volume %s is being moved already, or has moved: try again", v.Name)
	case err != nil && r.Context().Err() != nil:
		return 0, errdefs.Errorf(errdefs.ErrUnavailable, "request canceled: %v", r.Context().Err())
	case err != nil:
		g.logger.WarnContext(r.Context(), "cluster database unavailable", "err", err)
		return 0, errdefs.Errorf(errdefs.ErrUnavailable, "the cluster's database is unavailable; try again")
	}
	g.logger.InfoContext(r.Context(), "moving a volume", "volume", v.ID, "from", from.ID, "to", to.ID)
	return token, nil
}

// carryMove carries out the move of token that beginMove began: the
// files are streamed, and the move ends (the import commits it, or it is
// aborted); the node left drops its files.
func (g *Gateway) carryMove(r *http.Request, v *store.Volume, token int64, from, to *nodeState) ([]byte, error) {
	resp, err := g.transferVolume(r, v.ID, token, from, to)
	if err != nil {
		// Ended here, unless the import ended it first (the node commits
		// whether or not its answer arrives): then the abort changes
		// nothing, and the record, read after it, says the volume is the
		// other node's: a success whose answer was lost. Read before the
		// abort, the record could miss a commit made between the two.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
		defer cancel()
		if aerr := g.db.AbortVolumeMove(ctx, v.ID, token); aerr != nil {
			g.logger.WarnContext(r.Context(), "end a failed volume move: ended at the source's next start, or taken over after a while",
				"volume", v.ID, "err", aerr)
		} else if now, gerr := g.db.GetVolume(ctx, "", v.ID); gerr == nil && now.NodeID == to.ID {
			g.logger.WarnContext(r.Context(), "a volume move's answer was lost; the record says it ended", "volume", v.ID, "err", err)
			resp, err = json.Marshal(api.VolumeAnswer(now))
		}
	}
	if err != nil {
		if answered := (*nodeAnswer)(nil); errors.As(err, &answered) {
			return nil, err
		}
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "moving volume %s from node %s to %s: %v", v.Name, from.ID, to.ID, err)
	}
	// The volume is the other node's now: the old copy goes (or goes at
	// that node's next start).
	if err := g.nodeCall(r, from, http.MethodDelete, "/volumes/"+v.ID+"/files", nil, http.StatusNoContent); err != nil {
		g.logger.WarnContext(r.Context(), "a moved volume's old files stay until their node's next start", "volume", v.ID, "node", from.ID, "err", err)
	}
	return resp, nil
}

// nodeAnswer is a node's refusal of a step of a move, relayed as it is.
type nodeAnswer struct {
	status int
	body   []byte
}

func (a *nodeAnswer) Error() string {
	return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body))
}

// message is what the node said: its error's message, else its body.
func (a *nodeAnswer) message() string {
	var e wire.Error
	if json.Unmarshal(a.body, &e) == nil && e.Message != "" {
		return e.Message
	}
	return string(bytes.TrimSpace(a.body))
}

// mountedError is a move refused because something mounts the volume
// (a conflict, naming the holders).
type mountedError struct{ err error }

func (e *mountedError) Error() string { return e.err.Error() }
func (e *mountedError) Unwrap() error { return e.err }

// transferVolume streams volume id's files from node from's export to
// node to's import, and returns the import's answer (the volume).
func (g *Gateway) transferVolume(r *http.Request, id string, token int64, from, to *nodeState) ([]byte, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	// A node that hangs (sends nothing, takes nothing, or never answers
	// once all is sent) ends the move after a while instead of holding
	// the volume.
	idle := time.AfterFunc(g.moveIdle(), func() {
		cancel(fmt.Errorf("no progress for %v", g.moveIdle()))
	})
	defer idle.Stop()
	path := "/volumes/" + id + "/export"
	if cluster.MovesHardLinks(to.Protocol) {
		path += "?links=1" // else the importer would drop the links' names
	}
	exp, err := g.nodeRequest(ctx, r, from, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Do(exp)
	if err != nil {
		return nil, fmt.Errorf("export from node %s: %w", from.ID, causeOf(ctx, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, &nodeAnswer{resp.StatusCode, body}
	}
	imp, err := g.nodeRequest(ctx, r, to, http.MethodPut, fmt.Sprintf("/volumes/%s/import?move=%d", id, token),
		&progressReader{r: resp.Body, progress: func() { idle.Reset(g.moveIdle()) }})
	if err != nil {
		return nil, err
	}
	imp.Header.Set("Content-Type", "application/x-tar")
	iresp, err := g.client.Do(imp)
	if err != nil {
		return nil, fmt.Errorf("import on node %s: %w", to.ID, causeOf(ctx, err))
	}
	defer iresp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(iresp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("import on node %s: %w", to.ID, causeOf(ctx, err))
	}
	if iresp.StatusCode != http.StatusOK {
		return nil, &nodeAnswer{iresp.StatusCode, body}
	}
	return body, nil
}

// moveIdleDefault is how long a move waits on a node that makes no
// progress.
const moveIdleDefault = 2 * time.Minute

func (g *Gateway) moveIdle() time.Duration {
	if g.cfg.MoveIdle > 0 {
		return g.cfg.MoveIdle
	}
	return moveIdleDefault
}

// causeOf names why ctx ended, when it did, in place of err (a transport's
// "context canceled").
func causeOf(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// progressReader calls progress each time bytes pass, and at their end.
type progressReader struct {
	r        io.Reader
	progress func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 || err == io.EOF {
		p.progress()
	}
	return n, err
}

// nodeRequest is a call of the gateway's own to node n (the cluster
// secret, acting as r's caller).
func (g *Gateway) nodeRequest(ctx context.Context, r *http.Request, n *nodeState, method, path string, body io.Reader) (*http.Request, error) {
	out, err := http.NewRequestWithContext(ctx, method, "http://"+n.Address+path, body)
	if err != nil {
		return nil, err
	}
	out.Header.Set("X-API-Key", g.cfg.ClusterSecret)
	g.actAs(r, out.Header)
	g.cfg.Tracer.Inject(ctx, out.Header)
	return out, nil
}

// nodeJSON makes a call of the gateway's own to node n, without a body,
// checks its status and decodes its answer into out.
func (g *Gateway) nodeJSON(r *http.Request, n *nodeState, method, path string, want int, out any) error {
	b, err := g.nodeDo(r, n, method, path, nil, want)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("node %s: %s %s: decode its answer: %w", n.ID, method, path, err)
	}
	return nil
}

// nodeCall makes a call of the gateway's own to node n and checks its
// status.
func (g *Gateway) nodeCall(r *http.Request, n *nodeState, method, path string, body io.Reader, want int) error {
	_, err := g.nodeDo(r, n, method, path, body, want)
	return err
}

// nodeDo makes a call of the gateway's own to node n, whether or not the
// client waits for its answer, and returns the answer's body (a
// *nodeAnswer unless its status is want).
func (g *Gateway) nodeDo(r *http.Request, n *nodeState, method, path string, body io.Reader, want int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	req, err := g.nodeRequest(ctx, r, n, method, path, body)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != want {
		return nil, &nodeAnswer{resp.StatusCode, b}
	}
	return b, err
}
