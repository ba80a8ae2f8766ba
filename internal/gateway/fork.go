package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
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
	if !uploaded || count <= 1 {
		g.byTemplate(w, r)
		return
	}
	g.count("template")
	candidates, why := g.holders(r, copies)
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
				results[i] = g.forkOn(r, req, sh)
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
	fail := func(status int, msg string) forkResult {
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

// forkError is a fork answer's item for a child that was not made.
func forkError(status int, msg string) json.RawMessage {
	raw, _ := json.Marshal(wire.ForkResult{Error: &wire.Error{Code: status, Message: msg}})
	return raw
}
