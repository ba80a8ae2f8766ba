package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// Member keeps a node registered in the cluster's database: it writes the
// node's row at start and a heartbeat with its use every interval, and
// applies the drained flag operators set there.
type Member struct {
	db        *postgres.Store
	self      postgres.Node
	admission *Admission
	interval  time.Duration
	logger    *slog.Logger

	stop func()
	done chan struct{}
	mu   sync.Mutex
	err  error // last heartbeat failure, nil when the last one worked
	// builds reports the node's template builds under way, carried by
	// each heartbeat; nil: none. Guarded by mu.
	builds func() []store.BuildProgress
}

// PublishBuilds has every heartbeat from now on carry the builds under way
// that inProgress reports.
func (m *Member) PublishBuilds(inProgress func() []store.BuildProgress) {
	m.mu.Lock()
	m.builds = inProgress
	m.mu.Unlock()
}

// Join registers self and starts heartbeating every interval until Leave
// or Stop.
func Join(ctx context.Context, db *postgres.Store, self postgres.Node, admission *Admission,
	interval time.Duration, logger *slog.Logger) (*Member, error) {
	m := &Member{db: db, self: self, admission: admission, interval: interval, logger: logger,
		done: make(chan struct{})}
	m.self.Use = m.use()
	m.self.Protocol = Protocol
	if err := db.RegisterNode(ctx, m.self); err != nil {
		return nil, err
	}
	// A drained node stays drained across restarts: read the flag back.
	if draining, err := db.Heartbeat(ctx, self.ID, m.self.Use); err == nil {
		admission.SetDraining(draining)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.stop = cancel
	go m.run(runCtx)
	logger.InfoContext(ctx, "joined the cluster", "node", self.ID, "address", self.Address,
		"max_sandboxes", self.Capacity.MaxSandboxes, "memory_mb", self.Capacity.MemoryMB)
	return m, nil
}

func (m *Member) use() postgres.NodeUse {
	u := m.admission.holder.Use()
	m.mu.Lock()
	builds := m.builds
	m.mu.Unlock()
	use := postgres.NodeUse{Sandboxes: u.Sandboxes, Starting: u.Starting, MemoryUsedMB: u.MemoryMB}
	if builds != nil {
		use.Builds = builds()
	}
	return use
}

func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.beat(ctx)
	}
}

// beat sends one heartbeat; a missing row (an operator removed the node)
// is written again. Failures are logged once per outage: the database may
// be restarting, and the next beat tries again.
func (m *Member) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, m.interval*3)
	defer cancel()
	use := m.use()
	draining, err := m.db.Heartbeat(bctx, m.self.ID, use)
	if errors.Is(err, store.ErrNotFound) {
		self := m.self
		self.Use = use
		err = m.db.RegisterNode(bctx, self)
	}
	m.mu.Lock()
	was := m.err
	m.err = err
	m.mu.Unlock()
	switch {
	case err != nil && was == nil && ctx.Err() == nil:
		m.logger.Warn("cluster heartbeat failed; retrying", "err", err)
	case err == nil && was != nil:
		m.logger.Info("cluster heartbeat restored")
	}
	if err == nil && draining != m.admission.Draining() {
		m.admission.SetDraining(draining)
		m.logger.Info("drain state changed", "draining", draining)
	}
}

// Stop ends the heartbeat; the node's row stays, and gateways see it
// unreachable until it starts again.
func (m *Member) Stop() {
	m.stop()
	<-m.done
}

// Leave ends the heartbeat and removes the node and its records from the
// cluster: for a node shut down with nothing left behind.
func (m *Member) Leave(ctx context.Context) error {
	m.Stop()
	if err := m.db.RemoveNode(ctx, m.self.ID); err != nil {
		return fmt.Errorf("leave the cluster: %w", err)
	}
	return nil
}
