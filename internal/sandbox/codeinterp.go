package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/codeinterp"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// The code interpreter template's sandboxes are restored from a snapshot
// in which the default kernel runs with the usual libraries imported: a
// booted one spends seconds starting IPython and importing them at its
// first runCode, which is the latency users and RL reward code feel. The
// node makes the snapshot itself, the first time a create asks for the
// template, from the root filesystem the template manager built (see
// template.CodeInterpreterName). It stays on this node (every node builds
// the root filesystem too; uploading hundreds of MB would cost more than
// making it again).

// warmCode is what the snapshot's kernel has run: the imports data code
// starts with, in a function so that the user's namespace stays empty,
// and the execution count put back, so that the user's first cell is [1].
const warmCode = `def _aenv_warm():
    import json, numpy, pandas, matplotlib, matplotlib.pyplot, requests
_aenv_warm()
del _aenv_warm
get_ipython().execution_count = 0
`

// warmRetryAfter is how long a failed warm snapshot is not tried again:
// creates meanwhile boot the root filesystem, which works, only slower.
const warmRetryAfter = 10 * time.Minute

// warmTimeout bounds the making of the snapshot (a boot, the imports, a
// checkpoint: seconds on a quiet machine).
const warmTimeout = 5 * time.Minute

// ciWarm is the making of the warm snapshot that creates share.
type ciWarm struct {
	mu      sync.Mutex
	current chan struct{} // closed when the one in progress ends
	tpl     *store.Template
	failed  time.Time // when the last attempt failed
}

// codeInterpreterFor returns the template a create of the code interpreter
// gets, tpl being the template manager's answer (the warm snapshot, or the
// root filesystem until there is one): the warm snapshot if this node can
// restore it, made first if need be; the root filesystem for a create the
// snapshot cannot serve (volumes, or a size of its own: a restore keeps
// the snapshot's), or while making it fails.
func (m *Manager) codeInterpreterFor(ctx context.Context, req node.CreateRequest, tpl *store.Template) (*store.Template, error) {
	if len(req.VolumeMounts) == 0 && req.VCPU == 0 && req.MemoryMB == 0 && m.warmUsable(tpl) {
		return tpl, nil
	}
	rootfs := tpl
	if tpl.ImageDir != "" {
		var err error
		if rootfs, err = m.templates.PrepareCodeInterpreter(ctx); err != nil {
			return nil, err
		}
	}
	if len(req.VolumeMounts) > 0 || req.VCPU != 0 || req.MemoryMB != 0 {
		return rootfs, nil
	}
	return m.codeInterpreterTemplate(ctx, rootfs), nil
}

// warmUsable tells whether tpl is a warm snapshot this node restores as it
// is: the built-in one (no team's), its image whole, taken with this
// node's envd. One taken with another build (before an upgrade) is made
// again: its kernel is the code interpreter of that build. So is one
// taken over another root file system than the node boots with
// (--root-image switched): its restores would keep the old one.
func (m *Manager) warmUsable(tpl *store.Template) bool {
	return tpl.Name == template.CodeInterpreterName && tpl.TeamID == "" && tpl.ImageDir != "" &&
		imageComplete(tpl.ImageDir) && m.otherEnvd(tpl.ImageDir) == "" &&
		m.rootOf(m.ctx, tpl.ImageDir, tpl.RootfsPath) == rootFromNode
}

// codeInterpreterTemplate turns rootfs, the code interpreter's root
// filesystem template, into the warm snapshot (or finds the one made
// meanwhile). Should that fail, the create boots rootfs: slower, but it
// works.
func (m *Manager) codeInterpreterTemplate(ctx context.Context, rootfs *store.Template) *store.Template {
	// warmUsable may make the root image of the snapshot's rootfs (seconds
	// for the code interpreter's), so it is asked outside the lock, which
	// every create of the code interpreter takes.
	m.ciWarm.mu.Lock()
	t := m.ciWarm.tpl
	m.ciWarm.mu.Unlock()
	if t != nil && m.warmUsable(t) {
		return t
	}
	m.ciWarm.mu.Lock()
	if !m.ciWarm.failed.IsZero() && time.Since(m.ciWarm.failed) < warmRetryAfter {
		m.ciWarm.mu.Unlock()
		return rootfs
	}
	done := m.ciWarm.current
	if done == nil {
		done = make(chan struct{})
		m.ciWarm.current = done
		m.ciWarm.tpl = nil
		started := m.goOwned(func(mctx context.Context) {
			wctx, cancel := context.WithTimeout(mctx, warmTimeout)
			defer cancel()
			tpl, err := m.makeWarmSnapshot(wctx, rootfs)
			m.ciWarm.mu.Lock()
			m.ciWarm.current, m.ciWarm.tpl = nil, tpl
			if err != nil {
				m.ciWarm.failed = time.Now()
				m.logger.WarnContext(wctx, "code interpreter: warm snapshot not made; its sandboxes boot",
					"err", err, "retry_after", warmRetryAfter)
			} else {
				m.ciWarm.failed = time.Time{}
			}
			m.ciWarm.mu.Unlock()
			close(done)
		})
		if !started {
			m.ciWarm.current = nil
			m.ciWarm.mu.Unlock()
			return rootfs
		}
	}
	m.ciWarm.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return rootfs // the caller gives up anyway; the snapshot goes on
	}
	m.ciWarm.mu.Lock()
	defer m.ciWarm.mu.Unlock()
	if m.ciWarm.tpl == nil {
		return rootfs
	}
	return m.ciWarm.tpl
}

// makeWarmSnapshot boots a sandbox from rootfs, warms its default kernel
// and snapshots it as template.CodeInterpreterName; a usable one made
// meanwhile is returned as it is.
func (m *Manager) makeWarmSnapshot(ctx context.Context, rootfs *store.Template) (*store.Template, error) {
	cur, err := m.store.GetTemplate(ctx, template.CodeInterpreterName)
	switch {
	case err == nil && m.warmUsable(cur):
		return cur, nil
	case err == nil:
		if err := m.retireWarmSnapshot(ctx, cur); err != nil {
			return nil, err
		}
	case !errors.Is(err, store.ErrNotFound):
		return nil, storeError("find the warm snapshot", err)
	}
	start := time.Now()
	sb, err := m.Create(ctx, node.CreateRequest{Template: rootfs.ID, Timeout: min(warmTimeout, m.cfg.MaxTimeout)})
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	defer func() {
		if err := m.Kill(context.WithoutCancel(ctx), sb.ID); err != nil {
			m.logger.WarnContext(ctx, "code interpreter: kill the warming sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	if err := m.warmKernel(ctx, sb); err != nil {
		return nil, err
	}
	tpl, err := m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Name: template.CodeInterpreterName,
		Kind: store.KindSandboxTemplate, Local: true})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	m.logger.InfoContext(ctx, "code interpreter: warm snapshot made", "template", tpl.ID,
		"took", time.Since(start).Round(time.Millisecond))
	return tpl, nil
}

// retireWarmSnapshot renames old, a warm snapshot this node will not
// restore any more (another build's, or its image gone), which frees its
// name for a new one. It is not deleted: sandboxes made from it still
// name it (to resume from disk, to fork); the operator may delete it.
func (m *Manager) retireWarmSnapshot(ctx context.Context, old *store.Template) error {
	if old.TeamID != "" || old.ImageDir == "" {
		return fmt.Errorf("%w: the name %s is taken by another template (%s)", node.ErrConflict,
			template.CodeInterpreterName, old.ID)
	}
	old.Name = template.CodeInterpreterRetiredPrefix + old.ID
	if err := m.store.PutTemplate(ctx, old); err != nil {
		return storeError("retire the warm snapshot", err)
	}
	m.logger.InfoContext(ctx, "code interpreter: warm snapshot retired; making another", "template", old.ID, "name", old.Name)
	return nil
}

// warmKernel runs warmCode in sandbox sb's default context, as E2B's SDK
// would, and fails unless it ran without error.
func (m *Manager) warmKernel(ctx context.Context, sb *store.Sandbox) error {
	tgt, err := m.Reach(ctx, sb.ID, codeinterp.Port)
	if err != nil {
		return err
	}
	defer tgt.Release()
	body, _ := json.Marshal(map[string]string{"code": warmCode})
	req, err := http.NewRequestWithContext(tgt.Ctx, http.MethodPost, "http://"+tgt.Addr+"/execute", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if sb.AccessToken != "" {
		req.Header.Set("X-Access-Token", sb.AccessToken)
	}
	res, err := m.http.Do(req)
	if err != nil {
		return fmt.Errorf("warm the kernel: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("warm the kernel: status %s", res.Status)
	}
	lines := bufio.NewScanner(res.Body)
	lines.Buffer(make([]byte, 64<<10), 4<<20)
	ended := false
	for lines.Scan() {
		var line struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Value string `json:"value"`
		}
		if err := json.Unmarshal(lines.Bytes(), &line); err != nil {
			return fmt.Errorf("warm the kernel: %w", err)
		}
		switch line.Type {
		case "error":
			return fmt.Errorf("warm the kernel: %s: %s", line.Name, strings.TrimSpace(line.Value))
		case "end_of_execution":
			ended = true
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("warm the kernel: %w", err)
	}
	if !ended {
		return fmt.Errorf("warm the kernel: the execution did not end")
	}
	return nil
}
