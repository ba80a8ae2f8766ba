package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// SnapshotRequest asks for a checkpoint of a sandbox kept as a template.
type SnapshotRequest struct {
	SandboxID string
	Name      string             // optional for snapshots, required for templates
	Kind      store.TemplateKind // KindSnapshot or KindSandboxTemplate
}

// Snapshot checkpoints a sandbox (running or paused; it keeps its state)
// into a new template that sandboxes can be created, or forked, from.
func (m *Manager) Snapshot(ctx context.Context, req SnapshotRequest) (*store.Template, error) {
	if err := requireCapability(m.driver.Capabilities().Checkpoint, m.driver.Name(), "snapshots"); err != nil {
		return nil, err
	}
	if req.Kind == store.KindSandboxTemplate && req.Name == "" {
		return nil, fmt.Errorf("%w: name is required", ErrInvalid)
	}
	if req.Name != "" {
		if err := template.CheckName(req.Name); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		if _, err := m.store.GetTemplate(ctx, req.Name); err == nil {
			return nil, fmt.Errorf("%w: a template named %q exists", ErrConflict, req.Name)
		}
	}
	e, err := m.lookup(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	src, err := m.templates.Get(ctx, e.sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: template %s: %w", req.SandboxID, e.sb.TemplateID, err)
	}
	id := NewID()
	dir := filepath.Join(m.cfg.ImagesDir, id)
	start := time.Now()
	if err := m.imageOf(ctx, e, dir); err != nil {
		return nil, err
	}
	name := req.Name
	if name == "" {
		name = id
	}
	tpl := &store.Template{
		ID: id, Name: name, RootfsPath: src.RootfsPath, DefaultUser: src.DefaultUser,
		DefaultWorkdir: src.DefaultWorkdir, Env: src.Env, VCPU: e.sb.VCPU, MemoryMB: e.sb.MemoryMB,
		CreatedAt: time.Now().UTC(), Kind: req.Kind, ImageDir: dir, SourceSandbox: e.sb.ID,
		EnvdToken: e.sb.AccessToken, EnvVars: e.sb.EnvVars,
	}
	if err := m.store.PutTemplate(ctx, tpl); err != nil {
		m.removeImage(ctx, dir)
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a template named %q exists", ErrConflict, req.Name)
		}
		return nil, err
	}
	m.logger.InfoContext(ctx, "snapshot taken", "sandbox", e.sb.ID, "snapshot", id, "name", req.Name,
		"kind", req.Kind, "took", time.Since(start).Round(time.Millisecond))
	return tpl, nil
}

// imageOf writes the current state of the sandbox of e into dir, leaving
// the sandbox as it was (running, paused, or paused on disk). e.mu held.
func (m *Manager) imageOf(ctx context.Context, e *entry, dir string) error {
	if e.sb.ImageDir != "" {
		// Paused on disk: its image is the state; share it by hard links.
		out, err := exec.CommandContext(ctx, "cp", "-al", e.sb.ImageDir, dir).CombinedOutput()
		if err != nil {
			m.removeImage(ctx, dir)
			return classifyRuntimeError(fmt.Errorf("copy image of %s: %w: %s", e.sb.ID, err, out))
		}
		return nil
	}
	// runsc checkpoints a paused sandbox as it is; it stays paused.
	return m.checkpoint(ctx, e.sb.ID, dir, true)
}

// ListTemplates returns every template, snapshots included.
func (m *Manager) ListTemplates(ctx context.Context) ([]*store.Template, error) {
	return m.store.ListTemplates(ctx)
}

// DeleteTemplate removes a template or snapshot and its image. Sandboxes
// already made from it are not affected (restores load images whole).
func (m *Manager) DeleteTemplate(ctx context.Context, idOrName string) error {
	tpl, err := m.store.GetTemplate(ctx, idOrName)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: template %q", ErrNotFound, idOrName)
	}
	if err != nil {
		return err
	}
	if tpl.Name == template.BaseName {
		return fmt.Errorf("%w: the base template cannot be deleted", ErrConflict)
	}
	if err := m.store.DeleteTemplate(ctx, tpl.ID); err != nil {
		return err
	}
	if tpl.ImageDir != "" {
		m.removeImage(ctx, tpl.ImageDir)
	}
	if err := m.templates.RemoveRootfs(tpl); err != nil {
		m.logger.WarnContext(ctx, "remove template rootfs", "template", tpl.ID, "err", err)
	}
	m.logger.InfoContext(ctx, "template deleted", "template", tpl.ID, "name", tpl.Name)
	return nil
}
