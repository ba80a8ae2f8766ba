package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

// forkSnapshot routes POST /snapshots/{id}/fork. A snapshot in the object
// store is forked across the cluster: its children are split over every
// ready node with room (each fetches the image once, then restores its
// share in parallel with the others) and the answers are joined in one
// list, as one node would give it. A snapshot only its own node has, or a
// fork of one child, goes to that node as is.
//
// With an Idempotency-Key, the key is noted as a fork's before anything
// is sent: a gateway taking it over (this one died before the answer was
// kept) cannot tell which nodes made which children, so it answers that
// the outcome is unknown until the key expires, never forking again.
func (g *Gateway) forkSnapshot(w http.ResponseWriter, r *http.Request) {
	run := heldRun(r)
	if run != nil {
		if run.Prior() != "" {
			g.unknownOutcome(r, run)
			g.refuse(w, r, errdefs.ErrUnavailable, "an earlier attempt of this fork stopped before its answer "+
				"was kept, and which children it made is not known: use another Idempotency-Key to fork again")
			return
		}
		if err := run.Note(r.Context(), "fork"); err != nil {
			g.forget(r, run)
			g.databaseDown(w, r, err)
			return
		}
	}
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	r = withBody(r, body)
	var req map[string]json.RawMessage
	count := 1
	if len(body) > 0 {
		if json.Unmarshal(body, &req) != nil {
			g.byTemplate(w, r) // a node answers malformed requests
			return
		}
		if raw, ok := req["count"]; ok && json.Unmarshal(raw, &count) != nil {
			g.byTemplate(w, r)
			return
		}
	}
	id := r.PathValue("id")
	copies, err := g.templateCopies(r.Context(), id, true)
	if err != nil {
		g.databaseDown(w, r, err)
		return
	}
	if len(copies) > 0 && callerOf(r).Uses(copies[0].TeamID) && !g.teamRoom(w, r, copies[0].MemoryMB, copies[0].VCPU) {
		g.forget(r, run)
		return
	}
	uploaded := false
	for _, t := range copies {
		uploaded = uploaded || t.Upload == store.UploadUploaded
	}
	for k := range req {
		// JSON field names match whatever their case: any spelling.
		if strings.EqualFold(k, "copySources") {
			g.refuse(w, r, errdefs.ErrInvalidArgument, "copySources: only a gateway's fork of a snapshot names them")
			return
		}
	}
	// A snapshot with volumes is forked on their node, unless each child
	// gets copies of them all (and the caller is the snapshot's team, the
	// only one that may start it): then other nodes take shares, each
	// given copies brought from there.
	var carry *copyPlan
	if len(copies) > 0 && len(copies[0].VolumeMounts) > 0 {
		carry = copiesOf(req, copies[0])
		if carry == nil || callerOf(r).TeamID != copies[0].TeamID {
			g.byTemplate(w, r)
			return
		}
	}
	if !uploaded || count <= 1 {
		g.byTemplate(w, r)
		return
	}
	g.count("template")
	if carry != nil {
		// One copy of each volume, made before any share: every child,
		// on whatever node, starts from the same files. Unmade, the fork
		// goes to the volumes' node, which answers for itself.
		defer g.dropCopies(r, carry)
		if !g.firstCopies(r, carry) {
			g.byTemplate(w, r)
			return
		}
	}
	candidates, why := g.holders(r, copies, true)
	if carry != nil {
		candidates = slices.DeleteFunc(candidates, func(n *nodeState) bool {
			return n.ID != carry.origin && !cluster.CopiesForForks(n.Protocol)
		})
	}
	out := make([]json.RawMessage, 0, count)
	left := count
	// A node that refuses its share (full, drained since the gateway last
	// read the nodes, or not answering) has it placed on the others, as a
	// create moves to the next node, for a few rounds.
	for round := 0; left > 0 && round < maxCreateAttempts && len(candidates) > 0; round++ {
		shares := g.nodes.split(candidates, copies[0].MemoryMB, left)
		if len(shares) == 0 && round == 0 {
			g.refuse(w, r, errdefs.ErrUnavailable, fmt.Sprintf(
				"no node can take a fork of snapshot %q now (%s); try again later", id, why))
			return
		}
		if len(shares) == 0 {
			break
		}
		results := make([]forkResult, len(shares))
		var wg sync.WaitGroup
		for i, sh := range shares {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = g.forkShare(r, req, sh, carry)
			}()
		}
		wg.Wait()
		left = 0
		last := round == maxCreateAttempts-1
		for i, res := range results {
			if res.retry != "" && !last {
				left += shares[i].count
				why = res.retry
				candidates = slices.DeleteFunc(candidates, func(n *nodeState) bool { return n.ID == shares[i].node.ID })
				continue
			}
			out = append(out, res.items...)
		}
	}
	for len(out) < count {
		out = append(out, forkError(http.StatusServiceUnavailable,
			fmt.Sprintf("no node could take this child of snapshot %q (%s)", id, why)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(out)
}

// forkResult is one node's answer to its share: an item per child, or
// (retry set) a refusal of the whole share another node may take.
type forkResult struct {
	items []json.RawMessage
	retry string
}

// forkOn asks one node for its share of a fork; a node that fails answers
// an error for each child of its share.
func (g *Gateway) forkOn(r *http.Request, req map[string]json.RawMessage, sh forkShare) forkResult {
	fail := func(status int, msg string) forkResult { return shareFailed(sh, status, msg) }
	share := make(map[string]json.RawMessage, len(req)+1)
	for k, v := range req {
		share[k] = v
	}
	share["count"] = json.RawMessage(fmt.Sprint(sh.count))
	body, err := json.Marshal(share)
	if err != nil {
		return fail(http.StatusInternalServerError, err.Error())
	}
	resp, err := g.send(r, sh.node, body)
	if err != nil {
		if neverReached(err) {
			return fail(http.StatusServiceUnavailable, err.Error())
		}
		return fail(http.StatusBadGateway, err.Error())
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fail(http.StatusBadGateway, "reading its answer: "+err.Error())
	}
	var items []json.RawMessage
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(raw, &items) != nil || len(items) != sh.count {
		var e wire.Error
		msg := string(raw)
		if json.Unmarshal(raw, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		status := resp.StatusCode
		if status < 400 {
			status = http.StatusBadGateway
		}
		res := fail(status, msg)
		if resp.Header.Get(api.HeaderLimit) != "" {
			// The team's limit: every node would answer the same.
			res.retry = ""
		}
		return res
	}
	for _, item := range items {
		var child wire.ForkResult
		if json.Unmarshal(item, &child) == nil && child.Sandbox != nil && child.Sandbox.SandboxID != "" {
			g.routes.put(child.Sandbox.SandboxID, sh.node.ID)
		}
	}
	return forkResult{items: items}
}

// copyPlan is what a fork whose every volume is copied needs to spread
// over nodes: the snapshot's node, the volumes it mounts, and the first
// copy of each (by mount path), made on the snapshot's node, that every
// node's children are copies of.
type copyPlan struct {
	origin  string
	mounts  []store.VolumeMount
	sources map[string]string
}

// firstCopies makes the first copy of each of carry's volumes on the
// snapshot's node: false if one cannot be made (those made are dropped
// by dropCopies).
func (g *Gateway) firstCopies(r *http.Request, carry *copyPlan) bool {
	origin, ok := g.nodes.current().get(carry.origin)
	if !ok || !origin.reachable || origin.incompatible != "" || !cluster.CopiesForForks(origin.Protocol) {
		return false
	}
	carry.sources = map[string]string{}
	for _, mt := range carry.mounts {
		var made wire.Volume
		if err := g.nodeJSON(r, origin, http.MethodPost, "/volumes/"+mt.VolumeID+"/copy", http.StatusCreated, &made); err != nil {
			g.logger.InfoContext(r.Context(), "a fork's copies made on the volumes' node alone", "volume", mt.VolumeID, "err", err)
			return false
		}
		carry.sources[mt.Path] = made.VolumeID
	}
	return true
}

// dropCopies deletes the first copies of a fork, once its children made
// their own.
func (g *Gateway) dropCopies(r *http.Request, carry *copyPlan) {
	origin, ok := g.nodes.current().get(carry.origin)
	for _, id := range carry.sources {
		var err error
		if ok {
			err = g.nodeCall(r, origin, http.MethodDelete, "/volumes/"+id, nil, http.StatusNoContent)
		}
		if !ok || err != nil {
			g.logger.WarnContext(r.Context(), "a volume copy made for a fork stays: delete it", "volume", id,
				"node", carry.origin, "err", err)
		}
	}
}

// copiesOf is the plan of a fork of snapshot tpl (which mounts volumes)
// asking req, or nil unless req copies every volume it mounts.
func copiesOf(req map[string]json.RawMessage, tpl *store.Template) *copyPlan {
	var modes map[string]string
	if raw, ok := req["volumes"]; !ok || json.Unmarshal(raw, &modes) != nil {
		return nil
	}
	copied := map[string]bool{}
	for p, mode := range modes {
		if clean, err := volume.CheckMountPath(p); err == nil && mode == "copy" {
			copied[clean] = true
		}
	}
	mounted := map[string]bool{}
	for _, mt := range tpl.VolumeMounts {
		if !copied[mt.Path] {
			return nil
		}
		mounted[mt.Path] = true
	}
	for p := range copied {
		if !mounted[p] {
			return nil // refused by the node, before anything is copied
		}
	}
	return &copyPlan{origin: tpl.NodeID, mounts: tpl.VolumeMounts}
}

// forkShare asks sh's node for its share of a fork; for a fork with
// copies (carry), its children copy carry's first copies: on the
// snapshot's node those, elsewhere copies of them brought there first (one
// per node, whatever its share's count), removed once the node made its
// children's own.
func (g *Gateway) forkShare(r *http.Request, req map[string]json.RawMessage, sh forkShare, carry *copyPlan) forkResult {
	if carry == nil {
		return g.forkOn(r, req, sh)
	}
	withSources := func(sources map[string]string) forkResult {
		share := maps.Clone(req)
		raw, err := json.Marshal(sources)
		if err != nil {
			return shareFailed(sh, http.StatusInternalServerError, err.Error())
		}
		share["copySources"] = raw
		return g.forkOn(r, share, sh)
	}
	if sh.node.ID == carry.origin {
		return withSources(carry.sources)
	}
	sources := map[string]string{}
	defer func() {
		for _, id := range sources {
			if err := g.nodeCall(r, sh.node, http.MethodDelete, "/volumes/"+id, nil, http.StatusNoContent); err != nil {
				g.logger.WarnContext(r.Context(), "a volume copy brought for a fork stays: delete it", "volume", id,
					"node", sh.node.ID, "err", err)
			}
		}
	}()
	// Copies are made on a draining node too: it takes no sandboxes.
	origin, ok := g.nodes.current().get(carry.origin)
	if !ok || !origin.reachable || origin.incompatible != "" {
		return shareFailed(sh, http.StatusServiceUnavailable,
			fmt.Sprintf("the snapshot's node %s, which keeps its volumes, is not reachable", carry.origin))
	}
	for _, mt := range carry.mounts {
		id, err := g.bringCopy(r, carry.sources[mt.Path], origin, sh.node)
		if err != nil {
			status, msg := http.StatusServiceUnavailable, err.Error()
			if answered := (*nodeAnswer)(nil); errors.As(err, &answered) {
				status, msg = answered.status, answered.message()
			}
			res := shareFailed(sh, status, fmt.Sprintf("a copy of volume %s: %s", mt.Name, msg))
			if status == http.StatusTooManyRequests {
				res.retry = "" // the team's limit: every node would make the same copy
			}
			return res
		}
		sources[mt.Path] = id
	}
	return withSources(sources)
}

// bringCopy makes a copy of volume id on node from, as it is now, and
// moves it to node to: the copy's ID. A copy that cannot be moved is
// deleted.
func (g *Gateway) bringCopy(r *http.Request, id string, from, to *nodeState) (string, error) {
	var made wire.Volume
	if err := g.nodeJSON(r, from, http.MethodPost, "/volumes/"+id+"/copy", http.StatusCreated, &made); err != nil {
		return "", err
	}
	c, err := g.db.GetVolume(r.Context(), "", made.VolumeID)
	if err == nil {
		_, err = g.relocate(r, c, from, to)
	}
	if err != nil {
		if derr := g.nodeCall(r, from, http.MethodDelete, "/volumes/"+made.VolumeID, nil, http.StatusNoContent); derr != nil {
			g.logger.WarnContext(r.Context(), "a volume copy made for a fork stays: delete it", "volume", made.VolumeID,
				"node", from.ID, "err", derr)
		}
		return "", err
	}
	return made.VolumeID, nil
}

// shareFailed is a share's result when none of its children was made:
// retried on another node for a 503 or 429.
func shareFailed(sh forkShare, status int, msg string) forkResult {
	msg = fmt.Sprintf("node %s: %s", sh.node.ID, msg)
	res := forkResult{items: make([]json.RawMessage, sh.count)}
	for i := range res.items {
		res.items[i] = forkError(status, msg)
	}
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		res.retry = msg
	}
	return res
}

// forkError is a fork answer's item for a child that was not made.
func forkError(status int, msg string) json.RawMessage {
	raw, _ := json.Marshal(wire.ForkResult{Error: &wire.Error{Code: status, Message: msg}})
	return raw
}
