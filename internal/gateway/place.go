package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/tracing"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

// maxCreateAttempts bounds the nodes one create is offered to.
const maxCreateAttempts = 3

// readBody reads a request body the gateway must look into, within the
// JSON limit; on failure it has answered.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxJSONBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			g.refuse(w, r, errdefs.ErrTooLarge,
				fmt.Sprintf("request body is larger than %d bytes", g.cfg.MaxJSONBytes))
		} else {
			g.refuse(w, r, errdefs.ErrInvalidArgument, "cannot read the request body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

// withBody gives r its body back after readBody.
func withBody(r *http.Request, body []byte) *http.Request {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return r
}

// create places a new sandbox: on a ready node that holds its template
// and has room (best of two), trying the next one should a node refuse
// for lack of room or fail to connect.
//
// With an Idempotency-Key, the node about to be sent the create is noted
// on the key first: should this gateway die before the answer, the
// gateway taking the key over resends to that node, under the same node
// key, and the node answers with what it made (see resumeCreate).
func (g *Gateway) create(w http.ResponseWriter, r *http.Request) {
	g.count("create")
	run := heldRun(r)
	body, ok := g.readBody(w, r)
	if !ok {
		g.forget(r, run)
		return
	}
	if run != nil && run.Prior() != "" && g.resumeCreate(w, r, run, body) {
		return
	}
	var req wire.NewSandbox
	if err := json.Unmarshal(body, &req); err != nil {
		// Any node answers a malformed request as every node would.
		g.forwardAny(w, withBody(r, body))
		return
	}
	tpl := req.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	// The code interpreter template is built-in but, unlike base, built
	// on a node's first use of it: until then no node has a copy.
	builtIn := template.IsCodeInterpreter(tpl)
	lookup := tpl
	if builtIn {
		lookup = template.CodeInterpreterName // its records bear this name, never the alias
	}
	// A node that lacks the template the cache placed it by (deleted, or
	// replaced from another node) made nothing: placed again once, by the
	// records as they are.
	if g.placeCreate(w, r, run, &req, body, tpl, lookup, builtIn, false) {
		g.placeCreate(w, r, run, &req, body, tpl, lookup, builtIn, true)
	}
}

// placeCreate places the create of req (body as read) on a node by the
// copies of its template lookup (the cache's unless fresh) and relays the
// node's answer. It answers nothing and reports true when a node refused
// with 404 for a template the cache named (fresh unset): the caller places
// again by fresh records.
func (g *Gateway) placeCreate(w http.ResponseWriter, r *http.Request, run *sharedRun, req *wire.NewSandbox,
	body []byte, tpl, lookup string, builtIn, fresh bool) (stale bool) {
	copies, err := g.templateCopies(r.Context(), lookup, fresh)
	if err != nil {
		g.forget(r, run)
		g.databaseDown(w, r, err)
		return false
	}
	// Another team's template is not there for the caller: answered here,
	// not by a node, so that no refusal for room or reach tells of it. (A
	// team's name has one record in the cluster; public ones one per
	// node.) The cache may hold a name that has passed to the caller's
	// team since: read again before refusing.
	if usable := usableCopies(r, copies); len(usable) < len(copies) {
		if copies, err = g.templateCopies(r.Context(), lookup, true); err != nil {
			g.forget(r, run)
			g.databaseDown(w, r, err)
			return false
		}
		copies = usableCopies(r, copies)
	}
	if len(copies) == 0 && !builtIn {
		g.forget(r, run)
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("template %q not found", tpl))
		return false
	}
	if teamMB, vcpus := sizeOf(req, copies); !g.teamRoom(w, r, teamMB, vcpus) {
		g.forget(r, run)
		return false
	}
	// A snapshot with volumes starts where they are.
	candidates, why := g.holders(r, copies, len(copies) == 0 || len(copies[0].VolumeMounts) == 0)
	memory := req.MemoryMB
	switch {
	case memory > 0:
	case len(copies) > 0:
		memory = copies[0].MemoryMB // the template's size
	default:
		memory = template.CodeInterpreterMemoryMB
	}
	order := g.nodes.place(candidates, memory)
	if builtIn {
		// Nodes that have built it first; then the others, which build it
		// for this create.
		order = append(order, g.builders(r, copies, memory)...)
		why += "; no other ready node has room to build it"
	}
	if len(req.VolumeMounts) > 0 {
		// Volumes are their node's directories: the sandbox goes there.
		// Volumes move only for a create the node will take: its
		// template is the caller's to use (above; the mounts' paths are
		// checked in volumesNode).
		keeper, err := g.volumesNode(r, req.VolumeMounts, order)
		if err != nil {
			g.forget(r, run)
			api.WriteError(w, r, g.logger, err)
			return false
		}
		order = slices.DeleteFunc(order, func(n *nodeState) bool { return n.ID != keeper })
		why = fmt.Sprintf("its volumes are on node %s, which cannot take it now (%s)", keeper, why)
	}
	if len(order) == 0 {
		g.forget(r, run)
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
			"no node can take a sandbox of template %q now (%s); try again later", tpl, why))
		return false
	}
	var before func(*nodeState) error
	if run != nil {
		before = func(n *nodeState) error { return run.Note(r.Context(), noteNode+n.ID) }
	}
	resp, n, last, err := g.sendFirst(r, order, body, before, http.StatusServiceUnavailable, http.StatusTooManyRequests)
	switch {
	case errors.Is(err, errNotNoted):
		// Nothing was sent to the node that could not be noted.
		g.forget(r, run)
		g.databaseDown(w, r, err)
	case err != nil:
		// The node may have made the sandbox: a retry asks it again.
		g.unknownOutcome(r, run)
		if r.Context().Err() == nil {
			g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf("node %s failed during the create: %v", n.ID, err))
		}
	case resp == nil:
		g.forget(r, run)
		g.refuse(w, r, errdefs.ErrUnavailable, "no node could take the sandbox; last: "+last)
	default:
		if resp.StatusCode == http.StatusNotFound {
			g.templates.forget(lookup)
			if !fresh {
				resp.Body.Close()
				return true
			}
		}
		if !g.relay(w, r, resp, n.ID) {
			g.unknownOutcome(r, run) // the answer was cut: ask the node again
		}
	}
	return false
}

// usableCopies are the copies of a template the caller of r may use, in
// a slice of their own (copies may be the cache's).
func usableCopies(r *http.Request, copies []*store.Template) []*store.Template {
	p := callerOf(r)
	out := make([]*store.Template, 0, len(copies))
	for _, t := range copies {
		if p.Uses(t.TeamID) {
			out = append(out, t)
		}
	}
	return out
}

// sizeOf is the memory and vCPUs a node gives the sandbox req asks for,
// as far as the gateway can tell (0: not known), from copies of its
// template the caller may use (usableCopies).
func sizeOf(req *wire.NewSandbox, copies []*store.Template) (memoryMB, vcpus int) {
	var tpl *store.Template
	if len(copies) > 0 {
		tpl = copies[0]
	}
	return tpl.SizeFor(req.MemoryMB, cmp.Or(req.Vcpu, req.CpuCount))
}

// teamRoom answers 429, and reports false, when the caller's team is at
// one of its limits already: a create past it is refused here rather than
// after waiting for room and a turn on a node. The node's record write
// still makes the check that holds (store.CheckTeamRoom takes nothing); a
// failed read refuses nothing.
func (g *Gateway) teamRoom(w http.ResponseWriter, r *http.Request, memoryMB, vcpus int) bool {
	team := callerOf(r).TeamID
	if _, ok := g.unlimited.get(team); ok {
		// Read without limits in the last second (most teams have none):
		// no read here; a limit set meanwhile is the node's to apply.
		return true
	}
	t, err := store.LimitedTeam(r.Context(), g.db, team)
	if err == nil && t == nil {
		g.unlimited.put(team, true)
	}
	if err == nil {
		// A limited team's limits and use are read afresh: a raised
		// limit applies at once.
		err = store.CheckTeamRoom(r.Context(), g.db, t, memoryMB, vcpus)
	}
	switch {
	case errors.Is(err, store.ErrLimit):
		api.WriteError(w, r, g.logger, err)
		return false
	case err != nil:
		g.logger.DebugContext(r.Context(), "cannot read the team's limits; the node will check them", "err", err)
	}
	return true
}

// noteNode prefixes the note of a create sent to a node.
const noteNode = "node:"

// resumeCreate takes over a create whose first gateway stopped before its
// answer was kept, and reports whether it answered. The create is sent
// again to the node the first gateway sent it to, with the same node key:
// a node that made the sandbox answers with it, one whose create undid
// itself makes it now. A node that has left the cluster took whatever it
// made with it, and one that refuses made nothing: the create is placed
// afresh. A node unreachable now may hold the sandbox: the key stays
// held, and the client is told to try again, never given a second one.
func (g *Gateway) resumeCreate(w http.ResponseWriter, r *http.Request, run *sharedRun, body []byte) bool {
	id, ok := strings.CutPrefix(run.Prior(), noteNode)
	n, known := g.nodes.current().get(id)
	if ok && !known {
		return false
	}
	unknown := func(why string) bool {
		g.unknownOutcome(r, run)
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
			"an earlier attempt of this request went to node %s, which %s; whether it made the sandbox is not known yet: try again later",
			id, why))
		return true
	}
	if !ok {
		return unknown("is unknown") // not a create's note
	}
	if !n.reachable {
		return unknown("is unreachable")
	}
	resp, err := g.send(r, n, body)
	if err != nil {
		return unknown(fmt.Sprintf("did not answer (%v)", err))
	}
	if (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests) &&
		resp.Header.Get(api.HeaderLimit) == "" {
		resp.Body.Close()
		return false
	}
	if !g.relay(w, r, resp, n.ID) {
		g.unknownOutcome(r, run)
	}
	return true
}

// errNotNoted: the node about to be sent a create could not be noted on
// its idempotency key.
var errNotNoted = errors.New("cannot note the create's node on its idempotency key")

// sendFirst offers body to the nodes in order, up to maxCreateAttempts:
// a node it cannot reach, or one answering one of the refused statuses,
// passes it on to the next. It returns the first other answer and its
// node; when every node passed, resp is nil and last says what the last
// one did. err is a send that failed after reaching node n: not safe to
// offer elsewhere. before, when set, runs before each send; its failure
// stops the sends (errNotNoted).
func (g *Gateway) sendFirst(r *http.Request, order []*nodeState, body []byte, before func(*nodeState) error, refused ...int) (
	resp *http.Response, n *nodeState, last string, err error) {
	for i, n := range order {
		if i == maxCreateAttempts {
			break
		}
		if before != nil {
			if err := before(n); err != nil {
				return nil, n, last, fmt.Errorf("%w: %w", errNotNoted, err)
			}
		}
		resp, err := g.send(r, n, body)
		if err != nil {
			if neverReached(err) {
				last = fmt.Sprintf("node %s did not answer: %v", n.ID, err)
				continue
			}
			return nil, n, last, err
		}
		// A team at its limit is at it on every node (the limit is the
		// cluster's): that answer is the client's, not a reason to try
		// another node.
		if slices.Contains(refused, resp.StatusCode) && resp.Header.Get(api.HeaderLimit) == "" {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			last = fmt.Sprintf("node %s: %s", n.ID, bytes.TrimSpace(msg))
			continue
		}
		return resp, n, last, nil
	}
	return nil, nil, last, nil
}

// neverReached reports whether a send failed before reaching the node
// (its connection was refused), so the request is safe to offer elsewhere.
// A node too old for the caller's team is never sent the request at all.
func neverReached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" || errors.Is(err, errTooOldForTeams)
}

// errTooOldForTeams: send refused to call a node that would act for a
// team's caller as the operator.
var errTooOldForTeams = errors.New("node too old for teams")

// relay copies a node's answer (read whole) to the client; when it is a
// sandbox just created, its route is noted. false: the answer could not
// be read (the client was told).
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, nodeID string) bool {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		g.refuse(w, r, errdefs.ErrBadGateway, fmt.Sprintf("node %s: reading its answer: %v", nodeID, err))
		return false
	}
	if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK {
		var created wire.Sandbox
		if json.Unmarshal(body, &created) == nil && created.SandboxID != "" {
			g.routes.put(created.SandboxID, nodeID)
			g.nodes.noteSent(nodeID, 1)
		}
	}
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
	return true
}

// send makes r's call on node n with body, as the gateway (the cluster
// secret in place of the user's key).
func (g *Gateway) send(r *http.Request, n *nodeState, body []byte) (*http.Response, error) {
	if !g.keepsTeams(r, n) {
		return nil, fmt.Errorf("%w: %s", errTooOldForTeams, tooOldForTeams(n))
	}
	ctx, span := tracing.ChildClient(r.Context(), "send to node", tracing.NodeID.String(n.ID))
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+n.Address+r.URL.RequestURI(),
		bytes.NewReader(body))
	if err != nil {
		tracing.End(span, err)
		return nil, err
	}
	copyHeader(out.Header, r.Header)
	out.Header.Del("Authorization")
	out.Header.Set("X-API-Key", g.cfg.ClusterSecret)
	g.actAs(r, out.Header)
	out.Host = r.Host
	// The node's spans are this call's children.
	g.cfg.Tracer.Inject(ctx, out.Header)
	resp, err := g.client.Do(out)
	tracing.EndCall(span, resp, err)
	return resp, err
}

// hopHeaders are a connection's own, never forwarded.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer"}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
}

// holders returns the ready nodes among those holding copies (every node
// with the object store, once a copy is uploaded there, if anywhere) that
// can take a sandbox of r's caller, and why the others cannot (for the
// answer when none can).
func (g *Gateway) holders(r *http.Request, copies []*store.Template, anywhere bool) ([]*nodeState, string) {
	view := g.nodes.current()
	var out []*nodeState
	var drained, unreachable, incompatible, teamless []string
	seen := map[string]bool{}
	var candidates []*nodeState
	uploaded := false
	for _, t := range copies {
		if n, ok := view.get(t.NodeID); ok {
			candidates = append(candidates, n)
		}
		uploaded = uploaded || t.Upload == store.UploadUploaded
	}
	if uploaded && anywhere {
		// In the object store: every node that has it can fetch it.
		for _, n := range view.list {
			if n.SharedImages {
				candidates = append(candidates, n)
			}
		}
	}
	for _, n := range candidates {
		if seen[n.ID] {
			continue
		}
		seen[n.ID] = true
		switch {
		case n.incompatible != "":
			incompatible = append(incompatible, n.ID+" ("+n.incompatible+")")
		case !n.reachable:
			unreachable = append(unreachable, n.ID)
		case n.Draining:
			drained = append(drained, n.ID)
		case !g.keepsTeams(r, n):
			teamless = append(teamless, n.ID)
		default:
			out = append(out, n)
		}
	}
	why := fmt.Sprintf("%d node(s) hold it, %d ready and all full", len(seen), len(out))
	if len(teamless) > 0 {
		why += fmt.Sprintf("; too old to keep a team's sandboxes (cluster protocol below %d, upgrade them): %s",
			cluster.TeamsProtocol, strings.Join(teamless, ", "))
	}
	if len(incompatible) > 0 {
		why += "; incompatible: " + strings.Join(incompatible, ", ")
	}
	if len(drained) > 0 {
		why += "; drained: " + strings.Join(drained, ", ")
	}
	if len(unreachable) > 0 {
		why += "; unreachable: " + strings.Join(unreachable, ", ")
	}
	return out, why
}

// builders orders the ready nodes with room that hold none of copies, for
// a create of the code interpreter template, which such a node builds
// first (minutes). They are in ID order, not by room: a client retrying a
// create that timed out during the build reaches the node building it,
// and builds gather on one node rather than each node making its own.
func (g *Gateway) builders(r *http.Request, copies []*store.Template, memoryMB int) []*nodeState {
	held := map[string]bool{}
	for _, t := range copies {
		held[t.NodeID] = true
	}
	var out []*nodeState
	for _, n := range g.nodes.current().list {
		if n.ready() && !held[n.ID] && g.nodes.free(n, memoryMB) > 0 && g.keepsTeams(r, n) {
			out = append(out, n)
		}
	}
	return out // the view lists nodes by ID
}

// forwardAny forwards r to some ready node (for requests any node answers
// alike).
func (g *Gateway) forwardAny(w http.ResponseWriter, r *http.Request) {
	var ready []*nodeState
	for _, n := range g.nodes.current().list {
		if n.ready() {
			ready = append(ready, n)
		}
	}
	order := g.nodes.place(ready, 0)
	if len(order) == 0 {
		g.refuse(w, r, errdefs.ErrUnavailable, "no node of the cluster is ready")
		return
	}
	g.forwardNode(w, r, order[0].ID, "", true)
}

// templateCopies returns every node's template with this ID or name.
// Placement may take an answer remembered for a moment (a burst of
// creates from one template reads the database once; a node answers for a
// template deleted meanwhile); what users read is read fresh, and a
// template not found is never remembered (it may be made the next moment).
func (g *Gateway) templateCopies(ctx context.Context, idOrName string, fresh bool) ([]*store.Template, error) {
	if copies, ok := g.templates.get(idOrName); ok && !fresh {
		return copies, nil
	}
	g.queries.Add(1)
	copies, err := g.db.TemplateCopies(ctx, idOrName)
	if err == nil && len(copies) == 0 {
		// "name:tag" names the template "name" (a template has one version).
		if i := strings.LastIndexByte(idOrName, ':'); i > 0 && i < len(idOrName)-1 {
			g.queries.Add(1)
			copies, err = g.db.TemplateCopies(ctx, idOrName[:i])
		}
	}
	if err != nil {
		return nil, err
	}
	if len(copies) > 0 {
		g.templates.put(idOrName, copies)
	}
	return copies, nil
}

// byTemplate forwards a call naming a template or snapshot (a fork of a
// snapshot) to a reachable node holding it.
func (g *Gateway) byTemplate(w http.ResponseWriter, r *http.Request) {
	g.count("template")
	id := r.PathValue("id")
	copies, err := g.templateCopies(r.Context(), id, true)
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	if len(copies) == 0 {
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("snapshot %q not found", id))
		return
	}
	nodeID := copies[0].NodeID
	view := g.nodes.current()
	for _, t := range copies {
		if n, ok := view.get(t.NodeID); ok && n.ready() {
			nodeID = t.NodeID
			break
		}
	}
	g.forwardNode(w, r, nodeID, "", true)
}

// createTemplate routes POST /templates: a template of a sandbox is made
// on the sandbox's node; one of an image on a node with room.
func (g *Gateway) createTemplate(w http.ResponseWriter, r *http.Request) {
	g.count("template")
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	r = withBody(r, body)
	var req wire.NewTemplate
	if json.Unmarshal(body, &req) != nil {
		g.forwardAny(w, r)
		return
	}
	if req.Name != "" {
		copies, err := g.templateCopies(r.Context(), req.Name, true)
		if err != nil {
			g.databaseDown(w, r, err)
			return
		}
		if len(copies) > 0 {
			// Names are the cluster's: the node holding the name decides
			// (it refuses a duplicate as a single server does).
			g.forwardNode(w, r, copies[0].NodeID, "", true)
			return
		}
		defer g.templates.forget(req.Name)
	}
	if req.SandboxID != "" {
		g.forwardSandbox(w, r, req.SandboxID, true)
		return
	}
	g.forwardAny(w, r)
}

// deleteTemplate deletes every node's copy of a template. Every holder
// must be reachable before any copy is deleted: a holder down leaves the
// template whole (503, try again), never half deleted. A holder failing
// or refusing once deletes have begun is answered with the copies
// already deleted; the records go with each copy, so a retry deletes the
// rest.
func (g *Gateway) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	g.count("template")
	id := r.PathValue("id")
	g.templates.forget(id)
	g.queries.Add(1)
	copies, err := g.db.TemplateCopies(r.Context(), id)
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	if p := callerOf(r); len(copies) > 0 && !p.Admin {
		switch team := copies[0].TeamID; {
		case !p.Uses(team):
			copies = nil // another team's: as if it did not exist
		case !p.Sees(team):
			g.refuse(w, r, errdefs.ErrPermissionDenied, fmt.Sprintf("template %q is public: only an admin may change it", id))
			return
		}
	}
	if len(copies) == 0 {
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("template %q not found", id))
		return
	}
	type step struct {
		t *store.Template
		n *nodeState // nil: only the record is left to delete
	}
	var steps []step
	var down []string
	view := g.nodes.current()
	for _, t := range copies {
		n, ok := view.get(t.NodeID)
		switch {
		case !ok && t.Upload == store.UploadUploaded:
			// Kept in the object store after its node was removed: only
			// the record is left to delete here; the collector removes
			// the objects nothing refers to any more.
			steps = append(steps, step{t: t})
		case !ok || !n.reachable:
			down = append(down, t.NodeID)
		default:
			steps = append(steps, step{t: t, n: n})
		}
	}
	if len(down) > 0 {
		g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
			"template %q has a copy on node(s) %s, which are unreachable: nothing was deleted; try again once they are back",
			id, strings.Join(down, ", ")))
		return
	}
	var deleted []string
	failed := func(status int, msg string) {
		if len(deleted) > 0 {
			msg += fmt.Sprintf("; the copies on %s were already deleted (deleting it again deletes the rest)",
				strings.Join(deleted, ", "))
		}
		api.WriteErrorJSON(w, status, msg)
	}
	for _, st := range steps {
		if st.n == nil {
			g.queries.Add(1)
			if err := g.db.DeleteTemplate(r.Context(), st.t.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				g.logger.WarnContext(r.Context(), "cluster database unavailable", "err", err)
				failed(http.StatusServiceUnavailable, "the cluster's database is unavailable; try again")
				return
			}
			deleted = append(deleted, st.t.NodeID)
			continue
		}
		del := r.Clone(r.Context())
		del.URL.Path = "/templates/" + st.t.ID
		del.URL.RawPath = ""
		resp, err := g.send(del, st.n, nil)
		if err != nil {
			failed(http.StatusServiceUnavailable, fmt.Sprintf("node %s did not answer: %v", st.n.ID, err))
			return
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		// 404: the node has no such copy any more (a delete before this
		// one ended there).
		if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
			var e wire.Error
			if json.Unmarshal(msg, &e) != nil || e.Message == "" {
				e.Message = string(bytes.TrimSpace(msg))
			}
			failed(resp.StatusCode, fmt.Sprintf("node %s: %s", st.n.ID, e.Message))
			return
		}
		deleted = append(deleted, st.n.ID)
	}
	w.WriteHeader(http.StatusNoContent)
}

// requestBuild places a template build: on the node that built the
// template before when it is ready, else on the first ready node with room
// (by ID): builds gather on one node while it is ready, so that a template
// built from another built template finds its parent there (templates are
// not shared between nodes yet). The build's later calls follow it.
func (g *Gateway) requestBuild(w http.ResponseWriter, r *http.Request) {
	g.count("build")
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	r = withBody(r, body)
	var req struct {
		Name  string `json:"name"`
		Alias string `json:"alias"`
	}
	if json.Unmarshal(body, &req) != nil || (req.Name == "" && req.Alias == "") {
		g.forwardAny(w, r)
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	name = untagged(name)
	view := g.nodes.current()
	g.queries.Add(1)
	prev, err := g.db.BuildNode(r.Context(), name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		g.databaseDown(w, r, err)
		return
	}
	if n, ok := view.get(prev); ok && n.ready() {
		g.forwardNode(w, r, prev, "", true)
		return
	}
	var chosen *nodeState
	for _, n := range view.list { // by ID
		if n.ready() && g.nodes.free(n, 0) > 0 {
			chosen = n
			break
		}
	}
	if chosen == nil {
		g.refuse(w, r, errdefs.ErrUnavailable, "no node of the cluster can run a build now")
		return
	}
	g.queries.Add(1)
	if err := g.db.MoveBuildNode(r.Context(), name, chosen.ID); err != nil {
		g.databaseDown(w, r, err)
		return
	}
	g.builds.forget(name)
	g.forwardNode(w, r, chosen.ID, "", true)
}

// byBuild forwards a build's call to the node running its builds.
func (g *Gateway) byBuild(w http.ResponseWriter, r *http.Request) {
	g.count("build")
	name := untagged(r.PathValue("templateID"))
	nodeID, err := g.buildNode(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("no build of template %q", name))
		return
	}
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	g.forwardNode(w, r, nodeID, "", true)
}

// buildNode returns the node running the builds of the template named
// name, remembered for a moment (a build's status is polled every second).
func (g *Gateway) buildNode(ctx context.Context, name string) (string, error) {
	if nodeID, ok := g.builds.get(name); ok {
		return nodeID, nil
	}
	g.queries.Add(1)
	nodeID, err := g.db.BuildNode(ctx, name)
	if err != nil {
		return "", err
	}
	g.builds.put(name, nodeID)
	return nodeID, nil
}

// tags routes E2B's tag calls to the node that keeps the template's tags:
// the one running its builds, else one holding it.
func (g *Gateway) tags(w http.ResponseWriter, r *http.Request) {
	g.count("template")
	name := r.PathValue("templateID")
	if name == "" {
		body, ok := g.readBody(w, r)
		if !ok {
			return
		}
		r = withBody(r, body)
		var req struct {
			Target string `json:"target"` // POST
			Name   string `json:"name"`   // DELETE
		}
		if json.Unmarshal(body, &req) != nil || req.Target+req.Name == "" {
			g.forwardAny(w, r) // any node answers a malformed request alike
			return
		}
		name = req.Target + req.Name
	}
	name = untagged(name)
	nodeID, err := g.buildNode(r.Context(), name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		g.databaseDown(w, r, err)
		return
	}
	if n, ok := g.nodes.current().get(nodeID); !ok || !n.reachable {
		copies, err := g.templateCopies(r.Context(), name, true)
		if err != nil {
			g.databaseDown(w, r, err)
			return
		}
		if len(copies) == 0 {
			g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
			return
		}
		nodeID = copies[0].NodeID
	}
	g.forwardNode(w, r, nodeID, "", true)
}

// untagged drops a build tag ("name:tag").
func untagged(name string) string {
	if i := strings.LastIndexByte(name, ':'); i > 0 && i < len(name)-1 {
		return name[:i]
	}
	return name
}

// listNodes is GET /cluster/nodes, read fresh from the database.
func (g *Gateway) listNodes(w http.ResponseWriter, r *http.Request) {
	g.count("cluster")
	if err := g.nodes.refresh(r.Context()); err != nil {
		g.databaseDown(w, r, err)
		return
	}
	view := g.nodes.current()
	out := make([]wire.ClusterNode, 0, len(view.list))
	for _, n := range view.list {
		out = append(out, wire.ClusterNode{ID: n.ID, Address: n.Address, State: wire.ClusterNodeState(n.state()),
			StateReason: n.incompatible, Version: n.Version, Protocol: n.Protocol, StartedAt: n.StartedAt, HeartbeatAgeMS: n.HeartbeatAge.Milliseconds(),
			Capacity: wire.NodeCapacity{MaxSandboxes: n.Capacity.MaxSandboxes, MemoryMB: n.Capacity.MemoryMB,
				VCPUs: n.Capacity.VCPUs},
			Use: wire.NodeUse{Sandboxes: n.Use.Sandboxes, Starting: n.Use.Starting, MemoryMB: n.Use.MemoryUsedMB},
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// drain is POST /cluster/nodes/{id}/drain and /undrain. The node learns
// it at its next heartbeat; gateways stop placing on it at their next
// refresh.
func (g *Gateway) drain(w http.ResponseWriter, r *http.Request, draining bool) {
	g.count("cluster")
	id := r.PathValue("id")
	g.queries.Add(1)
	err := g.db.SetDraining(r.Context(), id, draining)
	if errors.Is(err, store.ErrNotFound) {
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("node %q is not part of the cluster", id))
		return
	}
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	if err := g.nodes.refresh(r.Context()); err != nil {
		g.databaseDown(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// removeNode is DELETE /cluster/nodes/{id}: forget a node that is gone
// for good, with the records of its sandboxes and templates. A node still
// heartbeating is refused: drain it and stop it first. Should it come back
// after all, it finds no records and removes what it holds.
func (g *Gateway) removeNode(w http.ResponseWriter, r *http.Request) {
	g.count("cluster")
	id := r.PathValue("id")
	if err := g.nodes.refresh(r.Context()); err != nil {
		g.databaseDown(w, r, err)
		return
	}
	n, ok := g.nodes.current().get(id)
	switch {
	case !ok:
		g.refuse(w, r, errdefs.ErrNotFound, fmt.Sprintf("node %q is not part of the cluster", id))
		return
	case n.reachable:
		g.refuse(w, r, errdefs.ErrConflict, fmt.Sprintf(
			"node %s is alive (heartbeat %s ago): drain it and stop it before removing it", id, n.HeartbeatAge.Round(time.Millisecond)))
		return
	}
	g.queries.Add(1)
	if err := g.db.RemoveNode(r.Context(), id); err != nil {
		g.databaseDown(w, r, err)
		return
	}
	g.logger.InfoContext(r.Context(), "node removed from the cluster", "node", id)
	if err := g.nodes.refresh(r.Context()); err != nil {
		g.logger.WarnContext(r.Context(), "cannot read the cluster's nodes", "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// ttlCache remembers lookups for a moment.
type ttlCache[V any] struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newTTLCache[V any](ttl time.Duration) *ttlCache[V] {
	return &ttlCache[V]{ttl: ttl, m: map[string]ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(k string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || time.Now().After(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[V]) put(k string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) > 10000 {
		clear(c.m)
	}
	c.m[k] = ttlEntry[V]{v: v, expires: time.Now().Add(c.ttl)}
}

func (c *ttlCache[V]) forget(k string) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

var _ node.Catalog = (*catalog)(nil)

// volumesNode is the node a sandbox mounting mounts goes to: the node
// that keeps the volumes (the caller's team's, by name or ID), since a
// sandbox mounts only what its node keeps. order is the nodes that can
// take the sandbox, best first.
//
// With MoveVolumes, volumes that nothing mounts move to where the sandbox
// can go when their own node cannot take it (drained, full, without the
// template) or they are on several nodes: to the node of order that keeps
// the most of them (then the most bytes, then by ID), else to the first of
// order. A volume another sandbox mounts stays where it is; its node is
// then tried as the target instead.
func (g *Gateway) volumesNode(r *http.Request, mounts []wire.SandboxVolumeMount, order []*nodeState) (string, error) {
	p := callerOf(r)
	var vols []*store.Volume
	keepers := map[string]bool{}
	paths := make([]string, len(mounts))
	for i, m := range mounts {
		paths[i] = m.Path
		// Even an admin's sandbox mounts only its own team's volumes (as
		// the node decides).
		v, err := g.db.GetVolume(r.Context(), p.TeamID, m.Name)
		if errors.Is(err, store.ErrNotFound) || (err == nil && v.TeamID != p.TeamID) {
			return "", errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", m.Name)
		}
		if err != nil {
			return "", errdefs.Errorf(errdefs.ErrUnavailable, "the cluster database: %v", err)
		}
		if !slices.ContainsFunc(vols, func(o *store.Volume) bool { return o.ID == v.ID }) {
			vols = append(vols, v)
		}
		keepers[v.NodeID] = true
	}
	if _, err := volume.CheckMountPaths(paths); err != nil {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "volumeMounts: %v", err)
	}
	moves := g.cfg.MoveVolumes && len(order) > 0
	if len(keepers) == 1 && (!moves || slices.ContainsFunc(order, func(n *nodeState) bool { return keepers[n.ID] })) {
		return vols[0].NodeID, nil
	}
	if !moves {
		other := vols[slices.IndexFunc(vols, func(v *store.Volume) bool { return v.NodeID != vols[0].NodeID })]
		return "", errdefs.Errorf(errdefs.ErrConflict,
			"volumes %s and %s are kept by different nodes (%s, %s): one sandbox mounts volumes of one node",
			vols[0].Name, other.Name, vols[0].NodeID, other.NodeID)
	}
	movable := slices.DeleteFunc(slices.Clone(order), func(n *nodeState) bool { return !cluster.MovesVolumes(n.Protocol) })
	if len(movable) == 0 {
		return "", errdefs.Errorf(errdefs.ErrUnavailable,
			"the nodes that can take the sandbox now are of a release that does not move volumes (cluster protocol %d or later), and its volumes are elsewhere",
			cluster.VolumeMovesProtocol)
	}
	to := targetOf(vols, movable)
	for attempt := 0; ; attempt++ {
		moved, err := g.gather(r, vols, to)
		if err == nil {
			break
		}
		// A mounted volume cannot move: its node is the one to go to, if
		// it can take the sandbox and nothing was moved yet.
		var held *heldVolumeError
		if errors.As(err, &held) && moved == 0 && attempt == 0 {
			if i := slices.IndexFunc(movable, func(n *nodeState) bool { return n.ID == held.v.NodeID }); i >= 0 {
				to = movable[i]
				continue
			}
		}
		return "", err
	}
	// Another create may have moved some meanwhile: they must all be on
	// to now, or the node would refuse the sandbox.
	for _, v := range vols {
		now, err := g.db.GetVolume(r.Context(), "", v.ID)
		if err != nil || now.NodeID != to.ID || now.MovingTo != "" {
			return "", errdefs.Errorf(errdefs.ErrUnavailable,
				"volume %s moved while this create gathered its volumes on node %s; try again", v.Name, to.ID)
		}
	}
	return to.ID, nil
}

// targetOf is where volumes vols gather: the node of candidates (best
// first) that keeps the most of them, then the most of their bytes, then
// the first by ID; candidates[0] when none keeps any. The same volumes
// gather on the same node whatever the order of equally good nodes, so
// that two creates naming them do not move them past each other.
func targetOf(vols []*store.Volume, candidates []*nodeState) *nodeState {
	type kept struct {
		count int
		bytes int64
	}
	by := map[string]kept{}
	for _, v := range vols {
		k := by[v.NodeID]
		k.count++
		k.bytes += v.SizeBytes
		by[v.NodeID] = k
	}
	var best *nodeState
	for _, n := range candidates {
		k, ok := by[n.ID]
		if !ok {
			continue
		}
		if best == nil {
			best = n
			continue
		}
		b := by[best.ID]
		if k.count > b.count || (k.count == b.count && (k.bytes > b.bytes || (k.bytes == b.bytes && n.ID < best.ID))) {
			best = n
		}
	}
	if best == nil {
		return candidates[0]
	}
	return best
}

// heldVolumeError is a volume that cannot move because something mounts
// it.
type heldVolumeError struct {
	v   *store.Volume
	err error
}

func (e *heldVolumeError) Error() string { return e.err.Error() }
func (e *heldVolumeError) Unwrap() error { return e.err }

// gather moves those of vols not on node to there, and says how many it
// moved. Its errors are the create's answer: 503 when a later try may
// pass (a node refused or failed, a volume mounted or moving meanwhile),
// 409 for a mounted volume among volumes of several nodes
// (*heldVolumeError).
func (g *Gateway) gather(r *http.Request, vols []*store.Volume, to *nodeState) (int, error) {
	severalNodes := slices.ContainsFunc(vols, func(v *store.Volume) bool { return v.NodeID != vols[0].NodeID })
	view := g.nodes.current()
	moved := 0
	for _, v := range vols {
		if v.NodeID == to.ID {
			continue
		}
		from, ok := view.get(v.NodeID)
		switch {
		case !ok || !from.reachable:
			return moved, errdefs.Errorf(errdefs.ErrUnavailable,
				"volume %s is on node %s, which is unreachable: its files cannot be moved to a node that can take the sandbox", v.Name, v.NodeID)
		case !cluster.MovesVolumes(from.Protocol):
			return moved, errdefs.Errorf(errdefs.ErrUnavailable,
				"volume %s is on node %s, which cannot take the sandbox now and is of a release that does not move volumes", v.Name, v.NodeID)
		}
		_, err := g.relocate(r, v, from, to)
		if err == nil {
			moved++
			g.logger.InfoContext(r.Context(), "moved a volume for a create", "volume", v.ID, "from", v.NodeID, "to", to.ID)
			continue
		}
		why := err.Error()
		var answered *nodeAnswer
		if errors.As(err, &answered) {
			why = answered.message()
		}
		msg := fmt.Sprintf("volume %s is on node %s, which cannot take the sandbox now, and cannot move to node %s, which can: %s", v.Name, v.NodeID, to.ID, why)
		if severalNodes {
			msg = fmt.Sprintf("the volumes are kept by different nodes, and volume %s cannot move from node %s to node %s: %s", v.Name, v.NodeID, to.ID, why)
		}
		var mounted *mountedError
		switch {
		case errors.As(err, &mounted) && severalNodes:
			return moved, &heldVolumeError{v: v, err: errdefs.Errorf(errdefs.ErrConflict, "%s", msg)}
		case errors.As(err, &mounted):
			// Its node may take the sandbox later, or the volume be free.
			return moved, &heldVolumeError{v: v, err: errdefs.Errorf(errdefs.ErrUnavailable, "%s; try again later", msg)}
		case errors.Is(err, errdefs.ErrInsufficientStorage) || (answered != nil && answered.status == http.StatusInsufficientStorage):
			return moved, errdefs.Errorf(errdefs.ErrInsufficientStorage, "%s", msg)
		default:
			// A node's refusal or failure, or a move under way: another
			// try may find the nodes otherwise.
			return moved, errdefs.Errorf(errdefs.ErrUnavailable, "%s; try again later", msg)
		}
	}
	return moved, nil
}
