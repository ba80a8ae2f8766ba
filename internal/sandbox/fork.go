package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aenv-dev/aenv/internal/meminfo"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// Fork makes Count children with the source's memory, processes and
// filesystem at this instant. Each gets its own network slot, address,
// envd token and deadline; the source keeps running. Children are
// restored in parallel; some may fail while others succeed. Children stay
// starting until the whole fork is done, so a crash before the answer
// leaves none (reconcile removes starting sandboxes), and a cancelled
// request takes its children down with it.
func (m *Manager) Fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	ctx, span := tracing.Child(ctx, "fork", attribute.String("aenv.fork.sandbox", req.SandboxID),
		attribute.String("aenv.fork.snapshot", req.SnapshotID), attribute.Int("aenv.fork.count", req.Count))
	results, err := m.fork(ctx, req)
	tracing.End(span, err)
	return results, err
}

func (m *Manager) fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	if err := requireCapability(m.driver.Capabilities().Fork, m.driver.Name(), "fork"); err != nil {
		return nil, err
	}
	if req.Count < 1 || req.Count > m.cfg.MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", node.ErrInvalid, m.cfg.MaxForkCount)
	}
	if req.Timeout < 0 || req.Timeout > m.cfg.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1 and %d seconds", node.ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	src, err := m.forkSource(ctx, req)
	if err != nil {
		return nil, err
	}
	defer src.release()
	if err := m.checkCapacity(req.Count, src.memoryBytes); err != nil {
		return nil, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = src.timeout
	}
	if timeout, err = m.checkTimeout(timeout); err != nil {
		return nil, err
	}

	m.prep.demand(prepKey{rootfs: src.tpl.RootfsPath, vcpu: src.vcpu, memoryMB: src.memoryMB,
		unheld: !m.local(src.tpl)}, req.Count)
	start := time.Now()
	results := make([]node.ForkResult, req.Count)
	children := make([]*entry, req.Count)
	sem := make(chan struct{}, max(1, m.cfg.ForkParallelism))
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				results[i].Err = err
				return
			}
			now := time.Now().UTC()
			child := &store.Sandbox{
				TemplateID: src.tpl.ID, Alias: src.tpl.Name,
				VCPU: src.vcpu, MemoryMB: src.memoryMB, Metadata: src.metadata,
				EnvVars: src.envVars, AccessToken: newAccessToken(), AutoPause: src.autoPause,
				AutoPauseDropMemory: src.autoPauseDropMemory, AutoResume: src.autoResume,
				StartedAt: now, EndAt: now.Add(timeout), UpdatedAt: now, TimeoutSecs: int(timeout.Seconds()),
				Network: src.network, TeamID: src.team,
				// Shared: the children mount the parent's volumes.
				VolumeMounts: slices.Clone(src.volumeMounts),
			}
			if src.private {
				child.TrafficToken = newAccessToken()
			}
			if src.img.token == "" {
				child.AccessToken = "" // the children of an insecure sandbox are insecure too
			}
			e, err := m.launch(ctx, child, src.tpl, src.img, true)
			if err != nil {
				results[i].Err = err
				return
			}
			children[i] = e
		}()
	}
	wg.Wait()
	ok := 0
	for i, e := range children {
		if e == nil {
			continue
		}
		err := ctx.Err()
		if err == nil {
			err = m.finish(ctx, e)
		}
		if err != nil {
			// The request is gone (or the record failed): nobody would
			// learn of this child.
			m.discard(ctx, e)
			results[i].Err = err
			continue
		}
		results[i].Sandbox = cloneSandbox(e.view().sb)
		ok++
	}
	m.logger.InfoContext(ctx, "fork done", "source", src.name, "children", ok, "failed", req.Count-ok,
		"took", time.Since(start).Round(time.Millisecond))
	return results, nil
}

// discard removes a sandbox nobody was told about.
func (m *Manager) discard(ctx context.Context, e *entry) {
	ctx = context.WithoutCancel(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := m.release(ctx, e, "was discarded"); err != nil {
		m.logger.ErrorContext(ctx, "discard sandbox", "sandbox", e.id, "err", err)
		return
	}
	m.deleteRecord(ctx, e.id)
}

// forkSource is what children are restored from: the record they come
// from as it is stored (a snapshot, or the parent's template: its root
// filesystem and defaults), the checkpoint image taken of it, and the
// shape and settings the children inherit.
type forkSource struct {
	name      string
	tpl       *store.Template
	img       image
	vcpu      int
	memoryMB  int
	envVars   map[string]string
	metadata  map[string]string
	autoPause bool
	// autoPauseDropMemory and autoResume are the parent's lifecycle.
	autoPauseDropMemory, autoResume bool
	timeout                         time.Duration
	memoryBytes                     uint64 // resident memory of the source, to size the fork
	network                         *store.NetworkPolicy
	private                         bool
	team                            string // the children's
	volumeMounts                    []store.VolumeMount
	release                         func()
}

func (m *Manager) forkSource(ctx context.Context, req node.ForkRequest) (*forkSource, error) {
	if req.SnapshotID != "" {
		tpl, err := m.GetTemplate(ctx, req.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("%w: snapshot %q", node.ErrNotFound, req.SnapshotID)
		}
		if tpl.ImageDir == "" {
			return nil, fmt.Errorf("%w: template %q has no checkpoint to fork; create sandboxes from it instead", node.ErrInvalid, req.SnapshotID)
		}
		img, release, err := m.holdTemplateImage(ctx, tpl)
		if err != nil {
			return nil, err
		}
		return &forkSource{name: tpl.ID, tpl: tpl, img: img, vcpu: tpl.VCPU, memoryMB: tpl.MemoryMB,
			envVars: tpl.EnvVars, memoryBytes: imageBytes(img.dir), timeout: m.cfg.DefaultTimeout,
			team: req.TeamID, release: release}, nil
	}
	e, err := m.lock(ctx, req.SandboxID, opFork)
	if err != nil {
		return nil, err
	}
	// The parent is locked only while its image is taken.
	defer e.mu.Unlock()
	v := e.view()
	base, err := m.GetTemplate(ctx, v.sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("fork %s: template %s: %w", e.id, v.sb.TemplateID, err)
	}
	var mem uint64
	if v.slot != nil {
		if st, err := m.driver.Stats(ctx, e.id); err == nil {
			mem = st.MemoryBytes
		}
	}
	dir := filepath.Join(m.cfg.ImagesDir, "fork-"+NewID())
	opCtx, done := e.opContext(ctx)
	defer done()
	if err := m.imageOf(opCtx, e, dir); err != nil {
		return nil, err
	}
	if mem == 0 {
		mem = imageBytes(dir)
	}
	// The children keep the parent's template and its defaults; the image
	// is the parent's state now, and its shape and variables theirs.
	return &forkSource{
		name: e.id, tpl: base, img: image{dir: dir, token: v.sb.AccessToken},
		vcpu: v.sb.VCPU, memoryMB: v.sb.MemoryMB, envVars: v.sb.EnvVars, metadata: v.sb.Metadata, autoPause: v.sb.AutoPause,
		autoPauseDropMemory: v.sb.AutoPauseDropMemory, autoResume: v.sb.AutoResume,
		network: v.sb.Network, private: v.sb.TrafficToken != "", team: v.sb.TeamID, volumeMounts: v.sb.VolumeMounts,
		timeout: time.Duration(v.sb.TimeoutSecs) * time.Second, memoryBytes: mem,
		// Restores load the image whole; it is not needed afterwards.
		release: func() { m.removeImage(context.WithoutCancel(ctx), dir) },
	}, nil
}

// checkCapacity refuses a fork the node cannot hold, before anything is
// made: children need network slots and about the source's memory each.
func (m *Manager) checkCapacity(count int, perChild uint64) error {
	// Pooled sandboxes give up their slots to whoever needs one.
	if free := m.slots.Free() + m.prep.count() + m.WarmPool().Ready; free < count {
		return fmt.Errorf("%w: %d children need %d network slots, %d are free", node.ErrUnavailable, count, count, free)
	}
	if avail, ok := memAvailable(); ok && perChild > 0 {
		need := perChild * uint64(count)
		// Keep a tenth of the available memory for everything else.
		if need > avail-avail/10 {
			return fmt.Errorf("%w: %d children need about %d MiB of memory, the node has %d MiB available",
				node.ErrUnavailable, count, need>>20, avail>>20)
		}
	}
	return nil
}

// memAvailable is the memory the kernel can give without swapping, in
// bytes.
func memAvailable() (uint64, bool) {
	v, err := meminfo.Read("MemAvailable")
	return v, err == nil
}

// imageBytes is the size of the memory pages in a checkpoint image.
func imageBytes(dir string) uint64 {
	var total uint64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "pages") {
			total += uint64(info.Size())
		}
	}
	return total
}
