package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

// ForkRequest asks for Count children of a sandbox or of a snapshot.
type ForkRequest struct {
	SandboxID  string // fork a sandbox (running, or paused in memory or on disk)...
	SnapshotID string // ...or a snapshot/template (ID or name)
	Count      int
	Timeout    time.Duration // children's lifetime; 0 = the source's
}

// ForkResult is one child: a sandbox or why it could not be made.
type ForkResult struct {
	Sandbox *store.Sandbox
	Err     error
}

// Fork makes Count children with the source's memory, processes and
// filesystem at this instant. Each gets its own network slot, address,
// envd token and deadline; the source keeps running. Children are
// restored in parallel; some may fail while others succeed.
func (m *Manager) Fork(ctx context.Context, req ForkRequest) ([]ForkResult, error) {
	if err := requireCapability(m.driver.Capabilities().Fork, m.driver.Name(), "fork"); err != nil {
		return nil, err
	}
	if req.Count < 1 || req.Count > m.cfg.MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", ErrInvalid, m.cfg.MaxForkCount)
	}
	if req.Timeout < 0 || req.Timeout > m.cfg.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1 and %d seconds", ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
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

	start := time.Now()
	results := make([]ForkResult, req.Count)
	sem := make(chan struct{}, max(1, m.cfg.ForkParallelism))
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			now := time.Now().UTC()
			child := &store.Sandbox{
				ID: NewID(), TemplateID: src.tpl.ID, Alias: src.tpl.Name,
				VCPU: src.tpl.VCPU, MemoryMB: src.tpl.MemoryMB, Metadata: src.metadata,
				EnvVars: src.tpl.EnvVars, AccessToken: newAccessToken(), AutoPause: src.autoPause,
				StartedAt: now, EndAt: now.Add(timeout), UpdatedAt: now, TimeoutSecs: int(timeout.Seconds()),
				Network: src.network,
			}
			if src.private {
				child.TrafficToken = newAccessToken()
			}
			e, err := m.launchNew(ctx, child, src.tpl, src.tpl.ImageDir, src.tpl.EnvdToken)
			if err != nil {
				results[i].Err = err
				return
			}
			results[i].Sandbox = cloneSandbox(e.sb)
		}()
	}
	wg.Wait()
	ok := 0
	for _, r := range results {
		if r.Err == nil {
			ok++
		}
	}
	m.logger.InfoContext(ctx, "fork done", "source", src.name, "children", ok, "failed", req.Count-ok,
		"took", time.Since(start).Round(time.Millisecond))
	return results, nil
}

// forkSource is what children are restored from: a template-shaped view
// of the source (rootfs, defaults, image, envd token inside the image).
type forkSource struct {
	name        string
	tpl         *store.Template
	metadata    map[string]string
	autoPause   bool
	timeout     time.Duration
	memoryBytes uint64 // resident memory of the source, to size the fork
	network     *store.NetworkPolicy
	private     bool
	release     func()
}

func (m *Manager) forkSource(ctx context.Context, req ForkRequest) (*forkSource, error) {
	if req.SnapshotID != "" {
		tpl, err := m.templates.Get(ctx, req.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, req.SnapshotID)
		}
		if tpl.ImageDir == "" {
			return nil, fmt.Errorf("%w: template %q has no checkpoint to fork; create sandboxes from it instead", ErrInvalid, req.SnapshotID)
		}
		return &forkSource{name: tpl.ID, tpl: tpl, memoryBytes: imageBytes(tpl.ImageDir),
			timeout: m.cfg.DefaultTimeout, release: func() {}}, nil
	}
	e, err := m.lookup(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	// The parent is locked only while its image is taken.
	defer e.mu.Unlock()
	base, err := m.templates.Get(ctx, e.sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("fork %s: template %s: %w", e.sb.ID, e.sb.TemplateID, err)
	}
	var mem uint64
	if e.slot != nil {
		if st, err := m.driver.Stats(ctx, e.sb.ID); err == nil {
			mem = st.MemoryBytes
		}
	}
	dir := filepath.Join(m.cfg.ImagesDir, "fork-"+NewID())
	if err := m.imageOf(ctx, e, dir); err != nil {
		return nil, err
	}
	if mem == 0 {
		mem = imageBytes(dir)
	}
	// The children keep the parent's template ID and defaults; the image
	// is the parent's state now.
	tpl := *base
	tpl.ImageDir, tpl.EnvdToken, tpl.EnvVars = dir, e.sb.AccessToken, e.sb.EnvVars
	tpl.VCPU, tpl.MemoryMB = e.sb.VCPU, e.sb.MemoryMB
	return &forkSource{
		name: e.sb.ID, tpl: &tpl, metadata: e.sb.Metadata, autoPause: e.sb.AutoPause,
		network: e.sb.Network, private: e.sb.TrafficToken != "",
		timeout: time.Duration(e.sb.TimeoutSecs) * time.Second, memoryBytes: mem,
		// Restores load the image whole; it is not needed afterwards.
		release: func() { m.removeImage(context.WithoutCancel(ctx), dir) },
	}, nil
}

// checkCapacity refuses a fork the node cannot hold, before anything is
// made: children need network slots and about the source's memory each.
func (m *Manager) checkCapacity(count int, perChild uint64) error {
	if free := m.slots.Free(); free < count {
		return fmt.Errorf("%w: %d children need %d network slots, %d are free", ErrUnavailable, count, count, free)
	}
	if avail, ok := memAvailable(); ok && perChild > 0 {
		need := perChild * uint64(count)
		// Keep a tenth of the available memory for everything else.
		if need > avail-avail/10 {
			return fmt.Errorf("%w: %d children need about %d MiB of memory, the node has %d MiB available",
				ErrUnavailable, count, need>>20, avail>>20)
		}
	}
	return nil
}

// memAvailable reads MemAvailable from /proc/meminfo.
func memAvailable() (uint64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
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
