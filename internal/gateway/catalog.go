package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// StateUnreachable is the state of a sandbox whose node has stopped
// heartbeating: it may well still run, but nobody can reach it now.
const StateUnreachable = store.SandboxState(wire.SandboxStateUnreachable)

// catalog is the cluster's records as one node.Catalog: the API's read
// routes (list, get, templates, snapshots) served from the database.
type catalog struct {
	g *Gateway
}

// mark shows the sandboxes of unreachable nodes as such.
func (c *catalog) mark(sb *store.Sandbox) {
	if sb.State != store.StateRunning && sb.State != store.StatePaused {
		return
	}
	if n, ok := c.g.nodes.current().get(sb.NodeID); !ok || !n.reachable {
		sb.State = StateUnreachable
	}
}

func (c *catalog) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	c.g.queries.Add(1)
	sb, err := c.g.db.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	c.mark(sb)
	return sb, nil
}

func (c *catalog) SandboxTeam(ctx context.Context, id string) (string, error) {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return "", err
	}
	return sb.TeamID, nil
}

func (c *catalog) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	c.g.queries.Add(1)
	all, err := c.g.db.ListSandboxes(ctx, f)
	if err != nil {
		return nil, err
	}
	for _, sb := range all {
		c.mark(sb)
	}
	return all, nil
}

// GetTemplate finds a template by ID or name; of the copies every node
// has of a name (each builds its own "base"), one on a reachable node.
func (c *catalog) GetTemplate(ctx context.Context, idOrName string) (*store.Template, error) {
	copies, err := c.g.templateCopies(ctx, idOrName, true)
	if err != nil {
		return nil, err
	}
	view := c.g.nodes.current()
	for _, t := range copies {
		if n, ok := view.get(t.NodeID); ok && n.reachable {
			return t, nil
		}
	}
	if len(copies) > 0 {
		return copies[0], nil
	}
	return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
}

// TemplateNamed finds any node's team template named name (a team's
// names are the cluster's; public ones are each node's, and a gateway
// makes none).
func (c *catalog) TemplateNamed(ctx context.Context, name string) (*store.Template, error) {
	c.g.queries.Add(1)
	t, err := c.g.db.TemplateNamed(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, name)
	}
	return t, err
}

// ListTemplates lists each name once (the oldest copy), leaving out
// records of nodes no longer in the cluster (unless in the object store).
func (c *catalog) ListTemplates(ctx context.Context) ([]*store.Template, error) {
	c.g.queries.Add(1)
	all, err := c.g.db.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	view := c.g.nodes.current()
	seen := map[string]bool{}
	out := all[:0]
	for _, t := range all {
		// A removed node's templates are gone with it, but for those in
		// the object store, which every node can still use.
		if _, ok := view.get(t.NodeID); !ok && t.Upload != store.UploadUploaded || seen[t.Name] {
			continue
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	return out, nil
}

// ListSnapshots pages through the cluster's snapshots, newest first,
// leaving out those of nodes no longer in the cluster (unless in the
// object store). Left-out records are read past: a page is full whenever
// more snapshots follow.
func (c *catalog) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error) {
	limit := f.Limit
	seen := map[string]bool{} // a name once (names are the cluster's)
	var out []*store.Template
	for {
		c.g.queries.Add(1)
		page, err := c.g.db.ListSnapshots(ctx, f)
		if err != nil {
			return nil, err
		}
		view := c.g.nodes.current()
		for _, t := range page {
			if _, ok := view.get(t.NodeID); !ok && t.Upload != store.UploadUploaded || seen[t.Name] {
				continue
			}
			seen[t.Name] = true
			out = append(out, t)
		}
		if limit == 0 || len(page) < f.Limit || len(out) >= limit {
			break
		}
		last := page[len(page)-1]
		f.After = &store.ListCursor{At: last.CreatedAt, ID: last.ID}
		// Records were left out: read on in pages of some size, not one
		// query per record a small page asks for.
		f.Limit = max(f.Limit, 100)
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Kill kills sandbox id on the node holding it, for the caller in ctx (a
// team's forced deletion). A sandbox already gone is not found.
func (c *catalog) Kill(ctx context.Context, id string) error {
	g := c.g
	nodeID, err := g.nodeOf(ctx, id)
	if err != nil {
		return err
	}
	n, ok := g.nodes.current().get(nodeID)
	if !ok || !n.reachable {
		return fmt.Errorf("%w: sandbox %s is on node %s, which is unreachable", errdefs.ErrUnavailable, id, nodeID)
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	defer g.routes.forget(id)
	resp, err := g.send(r, n, nil)
	if err != nil {
		return fmt.Errorf("%w: kill sandbox %s on node %s: %v", errdefs.ErrBadGateway, id, nodeID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		return nil
	case http.StatusNotFound:
		return fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	// The node's refusal keeps its kind; an answer of none is the
	// node's fault.
	kind := errdefs.FromHTTPStatus(resp.StatusCode)
	if kind == nil {
		kind = errdefs.ErrBadGateway
	}
	return fmt.Errorf("%w: kill sandbox %s on node %s: %s: %s", kind, id, nodeID, resp.Status, bytes.TrimSpace(body))
}
