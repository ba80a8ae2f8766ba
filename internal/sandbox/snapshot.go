package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Snapshot checkpoints a sandbox (running or paused; it keeps its state)
// into a new template that sandboxes can be created, or forked, from.
func (m *Manager) Snapshot(ctx context.Context, req node.SnapshotRequest) (*store.Template, error) {
	if err := requireCapability(m.driver.Capabilities().Checkpoint, m.driver.Name(), "snapshots"); err != nil {
		return nil, err
	}
	if req.Kind == store.KindSandboxTemplate && req.Name == "" {
		return nil, fmt.Errorf("%w: name is required", node.ErrInvalid)
	}
	if req.Name != "" {
		if err := template.CheckName(req.Name); err != nil {
			return nil, fmt.Errorf("%w: %v", node.ErrInvalid, err)
		}
	}
	// Checked first so that a taken name fails before the checkpoint;
	// the store checks again when it writes.
	prev, err := m.replaced(ctx, req)
	if err != nil {
		return nil, err
	}
	e, err := m.lock(ctx, req.SandboxID, opSnapshot)
	if err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	v := e.view()
	// A team at its limit of snapshots is refused before the checkpoint
	// (a replacement takes the place of the one it replaces).
	if prev == nil || prev.TeamID != v.sb.TeamID {
		if err := m.store.SnapshotRoom(ctx, v.sb.TeamID); err != nil {
			return nil, storeError("snapshot "+req.SandboxID, err)
		}
	}
	src, err := m.GetTemplate(ctx, v.sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: template %s: %w", req.SandboxID, v.sb.TemplateID, err)
	}
	id := NewID()
	dir := filepath.Join(m.cfg.ImagesDir, id)
	start := time.Now()
	opCtx, done := e.opContext(ctx)
	defer done()
	if err := m.imageOf(opCtx, e, dir); err != nil {
		return nil, err
	}
	// Its size is what the team's limit counts, known before the record
	// is written; an upload records the same figure again.
	size, err := treeBytes(dir)
	if err != nil {
		m.removeImage(ctx, dir)
		return nil, fmt.Errorf("snapshot %s: %w", req.SandboxID, err)
	}
	name := req.Name
	if name == "" {
		name = id
	}
	tpl := &store.Template{
		ID: id, Name: name, RootfsPath: src.RootfsPath, DefaultUser: firstSet(req.DefaultUser, src.DefaultUser),
		DefaultWorkdir: firstSet(req.DefaultWorkdir, src.DefaultWorkdir), Env: src.Env, VCPU: v.sb.VCPU,
		MemoryMB: v.sb.MemoryMB, CreatedAt: time.Now().UTC(), Kind: req.Kind, ImageDir: dir, SourceSandbox: e.id,
		EnvdToken: v.sb.AccessToken, EnvVars: v.sb.EnvVars, RootfsID: src.RootfsID,
		TeamID: v.sb.TeamID, // a snapshot belongs to its sandbox's team
		// Not the volumes' files, which stay theirs: the mounts, which
		// the sandboxes made from it mount again.
		VolumeMounts: slices.Clone(v.sb.VolumeMounts),
		ImageStats:   store.ImageStats{Bytes: size},
	}
	// One with volumes is shared too, for forks that copy every volume
	// (a gateway brings each node its copies); other sandboxes made from
	// it are this node's, where its volumes are.
	shared := m.cfg.Shared != nil && !req.Local
	if shared {
		if err := m.cfg.Shared.Share(tpl); err != nil {
			m.removeImage(ctx, dir)
			return nil, fmt.Errorf("snapshot %s: %w", req.SandboxID, err)
		}
	}
	// The new record takes the name from the old in one transaction,
	// once the new image exists: a failed checkpoint or write leaves the
	// old template in place, and no create finds the name missing.
	var old *store.Template
	if req.Replace && req.Name != "" {
		old, err = m.store.ReplaceTemplate(ctx, tpl)
	} else {
		err = m.store.PutTemplate(ctx, tpl)
	}
	if err != nil {
		m.removeImage(ctx, dir)
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a template named %q exists", node.ErrConflict, req.Name)
		}
		return nil, storeError("record snapshot", err)
	}
	m.noteRecorded(dir)
	switch {
	case old != nil && old.NodeID != m.cfg.NodeID:
		// Another node's, in the object store: the upload of this one (or
		// the collector, for one kept here) removes its objects; that
		// node's sweep removes its copy of the files (sweepGoneImages).
		if !shared && m.cfg.Shared != nil {
			m.cfg.Shared.Delete(ctx, old)
		}
		m.logger.InfoContext(ctx, "template replaced", "template", old.ID, "name", old.Name, "by", tpl.ID,
			"node", old.NodeID)
	case old != nil:
		if shared {
			// Its objects stay until the new image is up: the new one
			// shares their pages (the next step of a trajectory).
			m.dropImageOf(ctx, old.ImageDir)
		} else {
			m.removeTemplateFiles(ctx, old)
		}
		m.logger.InfoContext(ctx, "template replaced", "template", old.ID, "name", old.Name, "by", tpl.ID)
	}
	m.logger.InfoContext(ctx, "snapshot taken", "sandbox", e.id, "snapshot", id, "name", req.Name,
		"kind", req.Kind, "took", time.Since(start).Round(time.Millisecond))
	if shared {
		m.share(ctx, tpl, src.ID, old)
	}
	return tpl, nil
}

// replaced is the template req's name takes over: nil when the name is
// free, ErrConflict when it is taken and req does not ask to replace it
// or it is a template that owns its root filesystem.
func (m *Manager) replaced(ctx context.Context, req node.SnapshotRequest) (*store.Template, error) {
	if req.Name == "" {
		return nil, nil
	}
	old, err := m.store.TemplateNamed(ctx, req.Name)
	if err != nil {
		return nil, nil
	}
	team, err := m.SandboxTeam(ctx, req.SandboxID)
	if err != nil {
		return nil, nil // the snapshot's own lookup of the sandbox says so
	}
	if err := replaceableBy(old, req.Replace, team, m.cfg.NodeID); err != nil {
		return nil, err
	}
	return old, nil
}

// replaceableBy says, with ErrConflict, why a new template of team on
// node may not take the name of old (a template that holds it): the
// caller did not ask to replace it, or it is not store.Replaceable.
func replaceableBy(old *store.Template, replace bool, team, nodeID string) error {
	switch {
	case !replace || old.ImageDir == "" || old.TeamID != team:
		return fmt.Errorf("%w: a template named %q exists", node.ErrConflict, old.Name)
	case !store.Replaceable(old, team, nodeID):
		return fmt.Errorf("%w: the template named %q is node %s's and not in the object store yet; "+
			"replace it there, or once it is uploaded", node.ErrConflict, old.Name, old.NodeID)
	}
	return nil
}

func firstSet(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// imageOf writes the current state of the sandbox of e into dir, leaving
// the sandbox as it was (running, paused, or paused on disk). e.mu held.
func (m *Manager) imageOf(ctx context.Context, e *entry, dir string) error {
	v := e.view()
	if v.phase == phaseOnDisk {
		if filesystemOnly(v.sb.ImageDir) {
			return fmt.Errorf("%w: sandbox %s was paused without its memory; resume it to snapshot or fork it",
				node.ErrConflict, e.id)
		}
		// Paused on disk: its image is the state; share it by hard links.
		if err := linkTree(ctx, v.sb.ImageDir, dir); err != nil {
			m.removeImage(ctx, dir)
			return classifyRuntimeError(fmt.Errorf("copy image of %s: %w", e.id, err))
		}
		return nil
	}
	// runsc checkpoints a paused sandbox as it is; it stays paused.
	return m.checkpoint(ctx, e.id, dir, true)
}

// GetTemplate finds a template or snapshot by ID or name: this node's, or
// else one another node uploaded to the shared object store (its root
// filesystem fetched here first if this node has none like it).
func (m *Manager) GetTemplate(ctx context.Context, idOrName string) (*store.Template, error) {
	tpl, err := m.templates.Get(ctx, idOrName)
	if errors.Is(err, store.ErrNotFound) && m.cfg.Shared != nil {
		tpl, err = m.cfg.Shared.Find(ctx, idOrName)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
	}
	return tpl, err
}

// holdTemplateImage keeps tpl's checkpoint image on disk until release,
// and returns it: the local image, or for another node's template, the
// copy fetched into the cache. tpl itself is left as it is stored.
func (m *Manager) holdTemplateImage(ctx context.Context, tpl *store.Template) (image, func(), error) {
	if m.cfg.Shared != nil && m.cfg.Shared.Remote(tpl) {
		dir, release, err := m.cfg.Shared.Image(ctx, tpl)
		if err != nil {
			return image{}, nil, classifyRuntimeError(err)
		}
		return image{dir: dir, token: tpl.EnvdToken}, release, nil
	}
	dir := tpl.ImageDir
	if err := m.holdImage(dir); err != nil {
		return image{}, nil, fmt.Errorf("%w: template %q", node.ErrNotFound, tpl.Name)
	}
	return image{dir: dir, token: tpl.EnvdToken}, func() { m.dropImage(dir) }, nil
}

// share uploads tpl, recorded now, to the object store if there is one;
// origin is the template a snapshot's sandbox ran from.
func (m *Manager) share(ctx context.Context, tpl *store.Template, origin string, replaces *store.Template) {
	if m.cfg.Shared == nil {
		return
	}
	m.cfg.Shared.Upload(tpl, origin, replaces)
	m.logger.InfoContext(ctx, "template queued for upload", "template", tpl.ID, "rootfs", tpl.RootfsID)
}

// TemplateNamed finds the template a new one of this node named name
// would conflict with (store.Store.TemplateNamed): any node's team
// template, uploaded or not.
func (m *Manager) TemplateNamed(ctx context.Context, name string) (*store.Template, error) {
	t, err := m.store.TemplateNamed(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, name)
	}
	return t, err
}

// ListTemplates returns every template, snapshots included.
func (m *Manager) ListTemplates(ctx context.Context) ([]*store.Template, error) {
	return m.store.ListTemplates(ctx)
}

// ListSnapshots pages through the node's snapshots, newest first.
func (m *Manager) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error) {
	return m.store.ListSnapshots(ctx, f)
}

// BuildTemplate makes a template from an OCI image.
func (m *Manager) BuildTemplate(ctx context.Context, req template.ImageRequest) (*store.Template, error) {
	tpl, err := m.templates.BuildFromImage(ctx, req, NewID)
	if err != nil || m.cfg.Shared == nil {
		return tpl, err
	}
	if err := m.cfg.Shared.Share(tpl); err != nil {
		return nil, fmt.Errorf("share template %s: %w", tpl.Name, err)
	}
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		return nil, storeError("record template", err)
	}
	m.share(ctx, tpl, "", nil)
	return tpl, nil
}

// DeleteTemplate removes a template or snapshot. What it owns goes only
// when nothing refers to it any more: a template's root filesystem is
// shared by its snapshots and by the sandboxes made from either, so such a
// template answers ErrConflict naming its users; a snapshot's image is
// removed once the restores reading it are done.
func (m *Manager) DeleteTemplate(ctx context.Context, idOrName string) error {
	tpl, err := m.GetTemplate(ctx, idOrName)
	if err != nil {
		return err
	}
	if tpl.Name == template.BaseName {
		return fmt.Errorf("%w: the base template cannot be deleted", node.ErrConflict)
	}
	if m.cfg.Shared != nil && m.cfg.Shared.Remote(tpl) {
		return fmt.Errorf("%w: template %s is node %s's; delete it there or through a gateway",
			node.ErrConflict, tpl.Name, tpl.NodeID)
	}
	if tpl.ImageDir == "" {
		// The pool's sandboxes made from it are not users: it stops
		// keeping them, which drops their references, and the one being
		// made is discarded when done.
		for _, ps := range m.prep.forgetRootfs(tpl.RootfsPath) {
			m.discardPrepared(context.WithoutCancel(ctx), ps)
		}
		if err := m.prep.waitMade(ctx, tpl.RootfsPath); err != nil {
			return fmt.Errorf("delete template %s: %w", tpl.Name, err)
		}
	}
	// The check of the references and the delete are one transaction: a
	// create that has read the template either holds its root filesystem
	// already (and is named here) or fails to take it.
	refs, err := m.store.DeleteTemplateUnreferenced(ctx, tpl.ID)
	switch {
	case errors.Is(err, store.ErrConflict):
		return fmt.Errorf("%w: template %s is in use by %s; delete those first",
			node.ErrConflict, tpl.Name, strings.Join(m.describeRefs(ctx, refs), ", "))
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
	case err != nil:
		return storeError("delete template", err)
	}
	m.removeTemplateFiles(ctx, tpl)
	m.logger.InfoContext(ctx, "template deleted", "template", tpl.ID, "name", tpl.Name)
	return nil
}

// removeTemplateFiles removes what tpl, whose record and references were
// just deleted, owned: its checkpoint image (once the restores reading it
// are done), its copy in the object store, and a root filesystem of its
// own, which nothing refers to any more.
func (m *Manager) removeTemplateFiles(ctx context.Context, tpl *store.Template) {
	if tpl.ImageDir != "" {
		m.dropImageOf(ctx, tpl.ImageDir)
	}
	if m.cfg.Shared != nil {
		m.cfg.Shared.Delete(ctx, tpl)
	}
	if tpl.ImageDir == "" {
		if err := m.templates.RemoveRootfs(tpl); err != nil {
			m.logger.WarnContext(ctx, "remove template rootfs", "template", tpl.ID, "err", err)
		}
	}
}

// describeRefs names the holders of refs for a message: templates and
// snapshots by name, sandboxes by ID.
func (m *Manager) describeRefs(ctx context.Context, refs []store.Ref) []string {
	users := make([]string, 0, len(refs))
	for _, r := range refs {
		switch r.HolderKind {
		case store.RefTemplate:
			if t, err := m.store.GetTemplate(ctx, r.HolderID); err == nil {
				users = append(users, fmt.Sprintf("%s %s", kindWord(t), t.Name))
			} else {
				users = append(users, "template "+r.HolderID)
			}
		case store.RefPrepared:
			users = append(users, "sandbox "+r.HolderID+" (being made)")
		default:
			users = append(users, string(r.HolderKind)+" "+r.HolderID)
		}
	}
	sort.Strings(users)
	return users
}

func kindWord(t *store.Template) string {
	if t.ImageDir != "" {
		return "snapshot"
	}
	return "template"
}

// holdImage marks a template's image as being read by a restore, so that
// deleting the template meanwhile does not remove it under the restore.
func (m *Manager) holdImage(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.imagesToDrop[dir] || !imageComplete(dir) {
		return fmt.Errorf("image %s is gone", dir)
	}
	m.images[dir]++
	return nil
}

// dropImage ends a hold; the last one removes an image whose template
// was deleted meanwhile.
func (m *Manager) dropImage(dir string) {
	m.mu.Lock()
	m.images[dir]--
	remove := m.images[dir] <= 0 && m.imagesToDrop[dir]
	if m.images[dir] <= 0 {
		delete(m.images, dir)
	}
	if remove {
		delete(m.imagesToDrop, dir)
	}
	m.mu.Unlock()
	if remove {
		m.removeImage(context.Background(), dir)
	}
}

// dropImageOf removes a deleted template's image now, or after the
// restores holding it finish.
func (m *Manager) dropImageOf(ctx context.Context, dir string) {
	for _, ps := range m.prep.forgetImage(dir) {
		m.discardPrepared(context.WithoutCancel(ctx), ps)
	}
	m.mu.Lock()
	held := m.images[dir] > 0
	if held {
		m.imagesToDrop[dir] = true
	}
	m.mu.Unlock()
	if !held {
		m.removeImage(ctx, dir)
	}
}
