// Package usage keeps a short history of each sandbox's resource use, as
// E2B's metrics endpoint serves it: a sample every few seconds per running
// sandbox, kept in a bounded ring and dropped when the sandbox is gone.
// The same samples add up each team's use by day, written to a Ledger
// (see TeamDay).
package usage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	// DefaultCapacity keeps an hour at the default interval: ~17 KB per
	// sandbox.
	DefaultCapacity = 720
)

// Source is what the history samples: the sandbox manager.
type Source interface {
	// Running returns the records of the sandboxes running now, from
	// memory: a round of samples costs the store nothing, however many
	// sandboxes the node holds.
	Running() []*store.Sandbox
	// List returns the sandbox records matching f; read once per
	// PruneEvery to forget sandboxes that are neither running nor paused.
	List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error)
	// Stats returns the resource use of a running sandbox.
	Stats(ctx context.Context, id string) (runtime.Stats, error)
}

// Config tunes a History; zero fields take the defaults.
type Config struct {
	Interval time.Duration // between two samples of a sandbox
	Capacity int           // samples kept per sandbox
	// Ledger receives the teams' use by day, every FlushEvery; nil: not
	// accounted.
	Ledger     Ledger
	FlushEvery time.Duration
	// Storage tells what the teams keep stored, read before each flush
	// and weighed by the time since the last read; nil: not accounted.
	Storage StorageSource
}

// DefaultFlushEvery is how often the teams' use is written by default.
const DefaultFlushEvery = 10 * time.Second

// PruneEvery is how often the histories of sandboxes that ended are
// forgotten (a paused sandbox keeps its own).
const PruneEvery = time.Minute

// Sample is one measurement of a sandbox.
type Sample struct {
	At         time.Time
	CPUUsedPct float64 // of the sandbox's vCPUs, averaged since the previous sample
	CPUCount   int
	MemUsed    uint64 // bytes
	MemTotal   uint64 // bytes
}

// History samples every running sandbox of a Source until stopped.
type History struct {
	src    Source
	cfg    Config
	logger *slog.Logger

	mu      sync.Mutex
	series  map[string]*series
	pending map[teamDay]*TeamDay // accounted, not yet written
	// storedAt is when storage was last accounted (zero: never).
	storedAt time.Time
	// flushMu makes flushes one at a time, so that a failed one puts
	// its days back before the next takes them.
	flushMu sync.Mutex

	cancel context.CancelFunc
	done   chan struct{}
}

// series is the ring of one sandbox plus what the next CPU figure needs.
type series struct {
	vcpu     int
	memTotal uint64
	points   []point // ring once full; next is the oldest
	next     int
	lastCPU  uint64 // cumulative CPU time at lastAt
	lastAt   time.Time
}

// point is a sample without what is constant for the sandbox.
type point struct {
	at     int64 // Unix nanoseconds
	cpuPct float64
	mem    uint64
}

// Start begins sampling src in a goroutine owned by the History, until
// ctx ends or Stop is called.
func Start(ctx context.Context, src Source, cfg Config, logger *slog.Logger) *History {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &History{src: src, cfg: cfg, logger: logger, series: map[string]*series{},
		pending: map[teamDay]*TeamDay{}, cancel: cancel, done: make(chan struct{})}
	go h.run(ctx)
	return h
}

// Stop ends sampling and waits for the sampler to return.
func (h *History) Stop() {
	h.cancel()
	<-h.done
}

func (h *History) run(ctx context.Context) {
	defer close(h.done)
	ticker := time.NewTicker(h.cfg.Interval)
	defer ticker.Stop()
	lastFlush := time.Now()
	var lastPrune time.Time
	for {
		h.sampleAll(ctx)
		if time.Since(lastPrune) >= PruneEvery {
			lastPrune = time.Now()
			h.prune(ctx)
		}
		if time.Since(lastFlush) >= h.cfg.FlushEvery {
			lastFlush = time.Now()
			h.accountStorage(ctx, lastFlush)
			h.flushLogged(ctx)
		}
		select {
		case <-ctx.Done():
			// What was accounted since the last flush is written on the
			// way out, with what was kept stored since.
			h.accountStorage(context.WithoutCancel(ctx), time.Now())
			h.flushLogged(context.WithoutCancel(ctx))
			return
		case <-ticker.C:
		}
	}
}

// flushTimeout bounds one write of the teams' use.
const flushTimeout = 10 * time.Second

func (h *History) flushLogged(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := h.Flush(ctx); err != nil {
		h.logger.WarnContext(ctx, "team usage kept for the next flush", "err", err)
	}
}

// sampleAll takes one sample of every running sandbox.
func (h *History) sampleAll(ctx context.Context) {
	// A round is bounded by the interval, so that rounds never pile up
	// behind slow stats.
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Interval)
	defer cancel()
	for _, sb := range h.src.Running() {
		st, err := h.src.Stats(ctx, sb.ID)
		if err != nil {
			// Paused, killed or gone between the list and now.
			h.logger.DebugContext(ctx, "usage sampling: stats", "sandbox", sb.ID, "err", err)
			continue
		}
		h.record(sb, st, time.Now())
	}
}

// prune forgets the histories of sandboxes that are neither running nor
// paused any more.
func (h *History) prune(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Interval)
	defer cancel()
	all, err := h.src.List(ctx, store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused}})
	if err != nil {
		if ctx.Err() == nil {
			h.logger.WarnContext(ctx, "usage sampling: list sandboxes", "err", err)
		}
		return
	}
	keep := make(map[string]bool, len(all))
	for _, sb := range all {
		keep[sb.ID] = true
	}
	// Sandboxes made since the list are running: they stay too.
	for _, sb := range h.src.Running() {
		keep[sb.ID] = true
	}
	h.mu.Lock()
	for id := range h.series {
		if !keep[id] {
			delete(h.series, id)
		}
	}
	h.mu.Unlock()
}

// record adds a sample of sb taken at now.
func (h *History) record(sb *store.Sandbox, st runtime.Stats, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[sb.ID]
	if s == nil {
		s = &series{lastAt: sb.StartedAt}
		h.series[sb.ID] = s
	}
	s.vcpu = sb.VCPU
	s.memTotal = uint64(sb.MemoryMB) << 20
	if st.MemoryLimitBytes > 0 {
		s.memTotal = st.MemoryLimitBytes
	}
	p := point{at: now.UnixNano(), cpuPct: s.cpuPct(st.CPUUsageNanos, now), mem: min(st.MemoryBytes, s.memTotal)}
	// The sample stands for the time since the last one; after a gap
	// (a pause, a slow round, a restart of this server) for one interval.
	counted := now.Sub(s.lastAt)
	if counted <= 0 || counted > 2*h.cfg.Interval {
		counted = h.cfg.Interval
	}
	cpu := time.Duration(st.CPUUsageNanos)
	if st.CPUUsageNanos >= s.lastCPU {
		cpu = time.Duration(st.CPUUsageNanos - s.lastCPU)
	}
	h.account(sb.TeamID, sb.MemoryMB, sb.VCPU, now, counted, min(cpu, counted*time.Duration(max(sb.VCPU, 1))))
	s.lastCPU, s.lastAt = st.CPUUsageNanos, now
	if len(s.points) < h.cfg.Capacity {
		s.points = append(s.points, p)
		return
	}
	s.points[s.next] = p
	s.next = (s.next + 1) % len(s.points)
}

// cpuPct is the share of the sandbox's vCPUs used since the last sample.
// The counter starts again from zero when a sandbox comes back from disk;
// then all of cpu was spent since the last sample at most.
func (s *series) cpuPct(cpu uint64, now time.Time) float64 {
	elapsed := now.Sub(s.lastAt)
	if elapsed <= 0 || s.vcpu <= 0 {
		return 0
	}
	used := cpu
	if cpu >= s.lastCPU {
		used = cpu - s.lastCPU
	}
	pct := float64(used) / float64(elapsed.Nanoseconds()) / float64(s.vcpu) * 100
	return min(pct, 100)
}

// Range returns the samples of sandbox id taken in [start, end], oldest
// first; a zero bound is open.
func (h *History) Range(id string, start, end time.Time) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[id]
	if s == nil {
		return nil
	}
	var out []Sample
	n := len(s.points)
	for i := range n {
		p := s.points[(s.next+i)%n]
		at := time.Unix(0, p.at)
		if (!start.IsZero() && at.Before(start)) || (!end.IsZero() && at.After(end)) {
			continue
		}
		out = append(out, Sample{At: at, CPUUsedPct: p.cpuPct, CPUCount: s.vcpu, MemUsed: p.mem, MemTotal: s.memTotal})
	}
	return out
}

// Tracked is the number of sandboxes with a history.
func (h *History) Tracked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.series)
}
