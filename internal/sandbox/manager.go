// Package sandbox is the lifecycle of sandboxes on one node: create, kill,
// pause, resume, snapshot, fork, deadlines, and reconciliation of records
// with the runtime after a restart. It implements node.Node for the local
// machine. It talks to the runtime driver, the network slot pool, the
// store and the in-sandbox envd, and nothing else.
//
// Every sandbox that holds resources has an entry: a lifecycle lock that
// serialises operations on it, and an immutable view published atomically
// for readers (see state.go). Each operation checks the transition table,
// then builds its steps on a cleanup stack, so that a failing later step
// (a store write, envd's /init, a restore) undoes the runtime and network
// steps before it: the runtime and the record never disagree.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/egress"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = node.EnvdPort

// Config bounds and defaults for sandboxes.
type Config struct {
	EnvdPath string // host path of the static envd binary
	// EnvdDir keeps the envd builds images were taken with, by digest
	// (see PinEnvd); EnvdPath is one of them. "": envd is not pinned.
	EnvdDir   string
	ImagesDir string // checkpoint images (snapshots, paused-to-disk, fork)
	// RootImage boots sandboxes over a read-only image of their template's
	// root file system and of envd (runtime.Spec.RootImage); restores
	// take the form their checkpoint was taken with (see rootOf).
	RootImage bool
	// NodeID is this node's in a cluster ("" on a single server): records
	// of other nodes are theirs to remove files of.
	NodeID string
	// PauseToDiskAfter is how long a sandbox stays paused in memory before
	// it is checkpointed to disk and its memory released; 0 = never.
	PauseToDiskAfter time.Duration
	MaxForkCount     int
	// ForkParallelism bounds the restores of one fork running at once.
	ForkParallelism int
	// WarmSandboxes is how many base sandboxes are kept booted ahead of
	// demand at least (see warm.go); 0 turns the pool off. Bursts grow the
	// pool up to WarmMax sandboxes holding at most WarmMemMB of host
	// memory; it shrinks back when idle.
	WarmSandboxes int
	WarmMax       int
	WarmMemMB     int
	// PreparedMax bounds the sandboxes made ahead of restores and boots
	// (see prepared.go), PreparedMemMB the host memory they hold; 0 turns
	// the pool off.
	PreparedMax   int
	PreparedMemMB int
	// SnapshotPool is how many sandboxes restored from one snapshot
	// template, paused, are kept at most for creates from it; the pool
	// keeps them for templates in use only (0: none).
	SnapshotPool    int
	DefaultTimeout  time.Duration
	MaxTimeout      time.Duration
	DefaultVCPU     int
	MaxVCPU         int
	DefaultMemoryMB int
	MinMemoryMB     int
	MaxMemoryMB     int
	PidsLimit       int
	// ReadyTimeout bounds the wait for envd to answer after start.
	ReadyTimeout time.Duration
	// MonitorInterval is how often the runtime is polled for sandboxes that
	// died on their own.
	MonitorInterval time.Duration
	// MonitorTimeout bounds each runtime query of the monitor; a runtime
	// that hangs on its listing is then asked sandbox by sandbox. 0: 10 s.
	MonitorTimeout time.Duration
	// AnswerTimeout bounds envd's answer to a health check of a sandbox
	// with a call open longer than that (see answers.go). 0: 5 s.
	AnswerTimeout time.Duration
	// RootImageCollectInterval is how often a driver that runs sandboxes
	// over root images removes the images no template needs any more, and
	// the manager the pinned envd builds unused (collectEnvdBuilds). 0:
	// every 10 minutes.
	RootImageCollectInterval time.Duration
	// DeadRetention is how long records of dead sandboxes are kept.
	DeadRetention time.Duration
	// Transport reaches sandboxes' ports; nil dials their addresses (tests
	// give one that reaches fakes).
	Transport http.RoundTripper
	// Shared is the cluster's object store (package shared): templates
	// made here are uploaded to it, and those of other nodes are fetched
	// from it. nil keeps every template on this node's disk alone.
	Shared SharedImages
	// Volumes finds the host directories of the volumes sandboxes mount;
	// nil refuses every create that mounts one.
	Volumes VolumePaths
	// Egress is the node's egress gateway, for its log of each sandbox;
	// nil: none.
	Egress EgressLog
	// Tracer traces the work no request asks for (pools making sandboxes,
	// deadlines, pauses to disk) as traces of their own; nil: not traced.
	// Requests' work is traced under their own spans without it.
	Tracer *tracing.Tracer
}

// EgressLog is what the manager needs of the egress gateway
// (internal/egress).
type EgressLog interface {
	// Events returns the log of the sandbox on network slot index.
	Events(index int) []egress.Event
	// CheckUpstream tells whether a sandbox's upstream proxy may be used:
	// its address is outside the node's denied ranges and it answers as a
	// SOCKS5 proxy taking its credentials.
	CheckUpstream(ctx context.Context, up network.Upstream) error
	// CACert is the PEM of the CA the gateway signs intercepted hosts'
	// certificates with; sandboxes whose policy has rules trust it.
	CACert() []byte
}

// VolumePaths is what the manager needs of the volumes (package volume).
type VolumePaths interface {
	// HostPath is where volume id's files are on this node, and whether
	// that is an overlay mount: an error of kind errdefs.ErrNotFound when
	// this node does not keep it.
	HostPath(ctx context.Context, id string) (string, bool, error)
	// Freeze makes volume id's files a layer its clones share; no
	// sandbox but holder may mount it.
	Freeze(ctx context.Context, id, holder string) (*store.Volume, error)
	// Clone makes a copy-on-write copy of v, frozen just before.
	Clone(ctx context.Context, v *store.Volume) (*store.Volume, error)
	// Pooled reports whether volumes are subvolumes of a volume pool,
	// whose copies are snapshots: then a volume other sandboxes mount
	// too can be copied (their writes do not reach the copies).
	Pooled() bool
	// Release lets go of what Freeze made for the clones of v, once
	// they are made (or will not be).
	Release(ctx context.Context, v *store.Volume)
	// Delete deletes v and its files.
	Delete(ctx context.Context, v *store.Volume) error
	// Get is team's volume by ID or name (not found: another team's, or
	// none), any team's for admin.
	Get(ctx context.Context, team string, admin bool, idOrName string) (*store.Volume, error)
}

// SharedImages is what the manager needs of the object store.
type SharedImages interface {
	// Remote reports whether tpl is another node's (found by Find).
	Remote(tpl *store.Template) bool
	// Share readies tpl, about to be recorded, for upload; Upload queues
	// the upload once it is recorded.
	Share(tpl *store.Template) error
	// Upload queues the upload of tpl's files; origin is the template
	// a snapshot's sandbox ran from ("" otherwise). replaces, when set,
	// is the snapshot tpl took the name of (its record gone): its objects
	// are deleted once tpl's upload ends, so that tpl shares its pages.
	Upload(tpl *store.Template, origin string, replaces *store.Template)
	// Find returns another node's uploaded template with its root
	// filesystem on this node.
	Find(ctx context.Context, idOrName string) (*store.Template, error)
	// Image returns a local copy of a remote template's checkpoint, held
	// until release.
	Image(ctx context.Context, tpl *store.Template) (dir string, release func(), err error)
	// Delete removes a deleted template's objects.
	Delete(ctx context.Context, tpl *store.Template)
	// UploadSandbox queues the upload of the image of a sandbox just
	// paused to disk, with the root filesystem it needs; ForgetSandbox
	// drops it (resumed or killed here).
	UploadSandbox(sb *store.Sandbox, rootfsPath, rootfsID string)
	ForgetSandbox(id string)
	// TakeOver fetches into dir the image of another node's sandbox
	// paused to disk, that node being gone, and makes the record this
	// node's; store.ErrNotFound if there is none such.
	TakeOver(ctx context.Context, id, dir string) (*store.Sandbox, error)
}

// SlotPool is what the manager needs of the network.
type SlotPool interface {
	Start(ctx context.Context, inUse []int) error
	Acquire(ctx context.Context) (*network.Slot, error)
	Slot(index int) *network.Slot
	Release(ctx context.Context, index int) error
	Free() int
	SetPolicy(ctx context.Context, index int, pol network.Policy) error
	AllCounters(ctx context.Context) (map[int]network.Traffic, error)
	DNSServers() []netip.Addr
}

// Bounds of runtime calls made outside a request (timers, monitor,
// cleanup): long enough for a big checkpoint, short enough that a hung
// runtime does not hold a sandbox for long.
const (
	backgroundOpTimeout = 5 * time.Minute
	killTimeout         = 30 * time.Second
	maxKillRetry        = time.Minute
)

// Manager owns the sandboxes of one node. It implements node.Node.
type Manager struct {
	cfg       Config
	store     store.Store
	driver    runtime.Driver
	slots     SlotPool
	templates *template.Manager
	logger    *slog.Logger
	http      *http.Client // to envd, over the sandboxes' veths

	// ctx ends at Shutdown; goroutines the manager starts are counted in
	// owned and must have returned when Shutdown does.
	ctx    context.Context
	cancel context.CancelFunc
	owned  sync.WaitGroup

	// envdBuilds is held while envdOf picks a pinned envd (and marks it
	// used) and while collectEnvdBuilds removes those unused, so that a
	// restore never gets a copy being removed.
	envdBuilds sync.Mutex

	mu     sync.Mutex        // guards the fields below; never held across a call
	closed bool              // Shutdown began: no new owned goroutines
	live   map[string]*entry // sandboxes that hold resources
	// images counts restores in progress per checkpoint image; an image
	// whose owner is deleted meanwhile is removed by the last of them.
	images       map[string]int
	imagesToDrop map[string]bool
	// orphans are records a failed create could not delete (disk full);
	// they are hidden and retried.
	orphans map[string]bool
	// recordedImages are the checkpoint images this node's template
	// records named, at the last sweep or since (sweepGoneImages), and
	// when they were seen so.
	recordedImages map[string]time.Time
	// tally keeps Use, what the live entries hold, under its own lock.
	tally tally

	warm *warmPool
	prep *preparedPool // nil when off
	// ciWarm makes the code interpreter's warm snapshot (codeinterp.go).
	ciWarm ciWarm
	// takeOverMu serialises taking over other nodes' sandboxes (rare).
	takeOverMu  sync.Mutex
	monitorDone chan struct{}
}

var _ node.Node = (*Manager)(nil)

// NewManager wires a manager. Call Start before use.
func NewManager(cfg Config, st store.Store, driver runtime.Driver, slots SlotPool,
	templates *template.Manager, logger *slog.Logger) *Manager {
	transport := cfg.Transport
	if transport == nil {
		transport = &http.Transport{
			DialContext:         dialSandbox,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
			// envd responses are streamed; never buffer or compress them here.
			DisableCompression: true,
		}
	}
	if cfg.MonitorTimeout <= 0 {
		cfg.MonitorTimeout = 10 * time.Second
	}
	if cfg.AnswerTimeout <= 0 {
		cfg.AnswerTimeout = defaultAnswerTimeout
	}
	if cfg.RootImageCollectInterval <= 0 {
		cfg.RootImageCollectInterval = 10 * time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		cfg: cfg, store: st, driver: driver, slots: slots, templates: templates, logger: logger,
		http: &http.Client{Transport: transport},
		ctx:  ctx, cancel: cancel,
		live: map[string]*entry{}, images: map[string]int{}, imagesToDrop: map[string]bool{},
		orphans:        map[string]bool{},
		recordedImages: map[string]time.Time{},
	}
}

// Transport is the transport used to reach sandboxes; the envd proxy
// shares it.
func (m *Manager) Transport() http.RoundTripper { return m.http.Transport }

// goOwned runs fn in a goroutine Shutdown waits for; after Shutdown began
// it does nothing and reports false.
func (m *Manager) goOwned(fn func(ctx context.Context)) bool {
	if !m.enter() {
		return false
	}
	go func() {
		defer m.owned.Done()
		fn(m.ctx)
	}()
	return true
}

// enter counts the caller as an owned goroutine, unless Shutdown began.
func (m *Manager) enter() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.owned.Add(1)
	return true
}

// afterFunc is time.AfterFunc for manager work: fn does not run once
// Shutdown began, and Shutdown waits for one that started.
func (m *Manager) afterFunc(d time.Duration, fn func(ctx context.Context)) *time.Timer {
	return time.AfterFunc(d, func() {
		if !m.enter() {
			return
		}
		defer m.owned.Done()
		fn(m.ctx)
	})
}

func (m *Manager) entry(id string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

func (m *Manager) entries() []*entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*entry, 0, len(m.live))
	for _, e := range m.live {
		out = append(out, e)
	}
	return out
}

func (m *Manager) register(e *entry) {
	e.tally, e.owner = &m.tally, m
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.live[e.id]; old != nil {
		m.count(old, false)
	}
	m.live[e.id] = e
	m.count(e, true)
}

func (m *Manager) unregister(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.live[id]; e != nil {
		m.count(e, false)
		delete(m.live, id)
	}
}

// lock returns the live entry of a sandbox with its lifecycle lock held
// and the operation o allowed, or an error saying why not. The caller
// unlocks it.
func (m *Manager) lock(ctx context.Context, id string, o op) (*entry, error) {
	e, err := m.lockEntry(ctx, id, o)
	if err != nil {
		return nil, err
	}
	if err := allowed(o, id, e.view().phase); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	return e, nil
}

// lockEntry returns the live entry of a sandbox with its lifecycle lock
// held, whatever its phase; o names the operation in the error when the
// sandbox holds no resources.
func (m *Manager) lockEntry(ctx context.Context, id string, o op) (*entry, error) {
	e := m.entry(id)
	if e == nil {
		sb, err := m.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: cannot %s sandbox %s: it is %s", node.ErrConflict, o, id, sb.State)
	}
	e.mu.Lock()
	return e, nil
}

// deleteRecord removes a record nobody acknowledged; when the store
// cannot (a full disk), the record is hidden and retried until it goes.
func (m *Manager) deleteRecord(ctx context.Context, id string) {
	err := m.store.DeleteSandbox(context.WithoutCancel(ctx), id)
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return
	}
	m.logger.WarnContext(ctx, "delete record; hiding it and retrying", "sandbox", id, "err", err)
	m.mu.Lock()
	m.orphans[id] = true
	m.mu.Unlock()
	m.goOwned(func(ctx context.Context) {
		for delay := time.Second; ; delay = min(2*delay, maxKillRetry) {
			select {
			case <-ctx.Done():
				return // reconcile removes it at the next start
			case <-time.After(delay):
			}
			err := m.store.DeleteSandbox(ctx, id)
			if err == nil || errors.Is(err, store.ErrNotFound) {
				m.mu.Lock()
				delete(m.orphans, id)
				m.mu.Unlock()
				return
			}
		}
	})
}

func (m *Manager) hidden(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.orphans[id]
}

func (m *Manager) acquireSlot(ctx context.Context) (*network.Slot, error) {
	slot, err := m.slots.Acquire(ctx)
	// Pooled sandboxes hold slots only while nobody else needs them.
	for errors.Is(err, network.ErrExhausted) && (m.evictPrepared(ctx) || m.evictWarm(ctx)) {
		slot, err = m.slots.Acquire(ctx)
	}
	if err != nil {
		if errors.Is(err, network.ErrExhausted) {
			return nil, fmt.Errorf("%w: %v", node.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	return slot, nil
}

func (m *Manager) releaseSlot(ctx context.Context, index int, id string) {
	if err := m.slots.Release(context.WithoutCancel(ctx), index); err != nil {
		m.logger.ErrorContext(ctx, "release network slot", "sandbox", id, "slot", index, "err", err)
	}
}

// releaseSlotLater returns a slot to the pool in the background: resetting
// or destroying it (tens of milliseconds: conntrack flush, veth and netns
// work) need not delay the answer to a delete. Shutdown waits for it.
func (m *Manager) releaseSlotLater(index int, id string) {
	if !m.goOwned(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		m.releaseSlot(ctx, index, id)
	}) {
		// Shutting down: release it now.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.releaseSlot(ctx, index, id)
	}
}

// killInstance stops an instance, bounded, whatever ctx says: it runs on
// failure paths whose request may be gone.
func (m *Manager) killInstance(ctx context.Context, id string) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	if err := m.driver.Kill(kctx, id); err != nil {
		m.logger.ErrorContext(ctx, "kill instance", "sandbox", id, "err", err)
		return err
	}
	return nil
}

// Get returns a sandbox record.
func (m *Manager) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	if m.hidden(id) {
		return nil, fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	sb, err := m.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	return sb, err
}

// SandboxTeam returns the team of sandbox id: from its entry while the
// node holds it, else from its record.
func (m *Manager) SandboxTeam(ctx context.Context, id string) (string, error) {
	if m.hidden(id) {
		return "", fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	if e := m.entry(id); e != nil {
		if v := e.view(); v != nil && v.sb != nil {
			return v.sb.TeamID, nil
		}
	}
	sb, err := m.Get(ctx, id)
	if err != nil {
		return "", err
	}
	return sb.TeamID, nil
}

// Running returns the records of the sandboxes running now, from memory
// (no store read): what a sampler of their use needs each round.
func (m *Manager) Running() []*store.Sandbox {
	var out []*store.Sandbox
	for _, e := range m.entries() {
		if v := e.view(); v != nil && v.phase == phaseRunning && v.sb != nil {
			out = append(out, v.sb)
		}
	}
	return out
}

// List returns sandbox records matching f, at most f.Limit of them.
// Orphans (records a failed create could not delete) are left out, and
// read past: a page is full whenever more records follow.
func (m *Manager) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	limit := f.Limit
	var out []*store.Sandbox
	for {
		if limit > 0 {
			// Read as many more as there are orphans, which it may hold.
			m.mu.Lock()
			f.Limit = limit - len(out) + len(m.orphans)
			m.mu.Unlock()
		}
		page, err := m.store.ListSandboxes(ctx, f)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		for _, sb := range page {
			if !m.orphans[sb.ID] {
				out = append(out, sb)
			}
		}
		m.mu.Unlock()
		if limit == 0 || len(out) >= limit || len(page) < f.Limit {
			break
		}
		last := page[len(page)-1]
		f.After = &store.ListCursor{At: last.StartedAt, ID: last.ID}
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Kill stops a sandbox, releases everything it held and forgets it.
// Records of dead sandboxes are removed too. An operation in progress on
// the sandbox is interrupted rather than waited for.
func (m *Manager) Kill(ctx context.Context, id string) error {
	e := m.entry(id)
	if e == nil {
		if _, err := m.Get(ctx, id); err != nil {
			return err
		}
		// A dead sandbox: only its record is left.
		if err := m.store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			return storeError("delete sandbox", err)
		}
		return nil
	}
	e.interrupt()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.renewOps()
	if e.view().phase == phaseGone {
		return fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	}
	// Once begun, a kill is finished even if its caller goes away (a
	// browser tab closed, a client's timeout): cut between stopping the
	// sandbox and deleting its record, it would leave a record of a
	// running sandbox that no longer runs. It is still bounded: a database
	// that does not answer must not hold the sandbox's lock for ever.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*killTimeout)
	defer cancel()
	if err := m.killLocked(kctx, e, "was killed"); err != nil {
		return err
	}
	m.logger.InfoContext(ctx, "sandbox killed", "sandbox", id)
	return nil
}

// killLocked stops the sandbox, frees what it held and deletes its
// record; e.mu must be held. Calls in flight to it end with why.
func (m *Manager) killLocked(ctx context.Context, e *entry, why string) error {
	if err := m.release(ctx, e, why); err != nil {
		return err
	}
	if err := m.store.DeleteSandbox(ctx, e.id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return storeError("delete sandbox", err)
	}
	return nil
}

// release stops the sandbox and frees its slot and image; e.mu must be
// held. On success the entry is gone from the live set and calls in
// flight to it end with why.
func (m *Manager) release(ctx context.Context, e *entry, why string) error {
	if e.view().phase == phaseGone {
		return nil // released already (a fork child killed before it finished)
	}
	e.stopTimer()
	v := e.view()
	if v.slot != nil || v.phase == phaseStarting {
		// Calls in flight learn why before the kill cuts their streams:
		// after it they would fail first with whatever the cut looked
		// like (a truncated envelope, a reset). Should the kill fail they
		// are ended all the same, as their caller asked.
		stopped := stoppedError(e.id, why)
		e.ending.Store(&stopped)
		e.calls.endAll(stopped)
		if err := m.killInstance(ctx, e.id); err != nil {
			e.ending.Store(nil)
			e.settle() // still what it was: its deadline or spill back
			return fmt.Errorf("kill sandbox %s: %w", e.id, err)
		}
		if v.slot != nil {
			m.releaseSlotLater(v.slot.Index, e.id)
		}
	}
	if v.sb.ImageDir != "" {
		m.removeImage(ctx, v.sb.ImageDir)
		m.forgetUploaded(v.sb)
	}
	e.transition(phaseGone, v.sb, nil, nil, stoppedError(e.id, why))
	m.unregister(e.id)
	return nil
}

// markDead records that a sandbox ended on its own and frees what it held;
// e.mu must be held.
func (m *Manager) markDead(ctx context.Context, e *entry, reason string) {
	// Its calls in flight learn it at once, not after the removal of its
	// remains (hundreds of milliseconds of runsc).
	if run := e.view().run; run != nil {
		run.stop(stoppedError(e.id, "died: "+reason))
	}
	if err := m.release(ctx, e, "died: "+reason); err != nil {
		m.logger.ErrorContext(ctx, "release dead sandbox", "sandbox", e.id, "err", err)
		return
	}
	sb := cloneSandbox(e.view().sb)
	sb.State = phaseGone.stored()
	sb.EndedReason = reason
	sb.SlotIndex = -1
	sb.ImageDir = ""
	sb.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		m.logger.ErrorContext(ctx, "record dead sandbox", "sandbox", e.id, "err", err)
	}
	m.logger.WarnContext(ctx, "sandbox died", "sandbox", e.id, "reason", reason)
}

// SetTimeout moves a sandbox's deadline to now+d (it may shorten it). As
// in E2B, d = 0 is a deadline of now: the sandbox is killed, or paused with
// autoPause, at once.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if d < 0 || d > m.cfg.MaxTimeout {
		return fmt.Errorf("%w: timeout must be between 0 and %d seconds", node.ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	e, err := m.lock(ctx, id, opSetTimeout)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	v := e.view()
	updated, err := e.next(v.phase)
	if err != nil {
		return err
	}
	updated.EndAt = updated.UpdatedAt.Add(d)
	if d > 0 {
		// A deadline of now is no lifetime for a later resume to reuse.
		updated.TimeoutSecs = int(d.Seconds())
	}
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return storeError("record timeout", err)
	}
	e.transition(v.phase, updated, v.slot, v.envd, nil)
	return nil
}

// Reach resolves a port of a running sandbox for one call, without
// waiting for any lifecycle operation on it.
func (m *Manager) Reach(ctx context.Context, id string, port int) (*node.Target, error) {
	e := m.entry(id)
	if e == nil {
		sb, err := m.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: sandbox %s is %s", node.ErrConflict, id, sb.State)
	}
	v := e.view()
	switch v.phase {
	case phaseRunning:
	case phaseGone:
		return nil, fmt.Errorf("%w: sandbox %q", node.ErrNotFound, id)
	default:
		return nil, fmt.Errorf("%w: sandbox %s is %s", node.ErrConflict, id, v.phase)
	}
	if ending := e.ending.Load(); ending != nil {
		return nil, *ending
	}
	if silent := e.silent.Load(); silent != nil {
		return nil, *silent
	}
	callCtx, cancel := context.WithCancelCause(ctx)
	stopRun := context.AfterFunc(v.run.ctx, func() { cancel(context.Cause(v.run.ctx)) })
	forget := e.calls.add(cancel)
	stop := func() { stopRun(); forget() }
	if ending := e.ending.Load(); ending != nil {
		// The kill began between the check above and add: its end of
		// the calls in flight may have missed this one.
		stop()
		cancel(*ending)
		return nil, *ending
	}
	mask := ""
	if v.sb.Network != nil {
		mask = v.sb.Network.MaskRequestHost
	}
	return &node.Target{
		Addr: sandboxHostPort(id, v.slot.SandboxIP, port), TrafficToken: v.sb.TrafficToken,
		MaskRequestHost: mask, Envd: v.envd, Ctx: callCtx,
		Release: func() { stop(); cancel(nil) },
	}, nil
}

// SandboxByToken finds the running sandbox whose envd access token makes
// check return true; used to route signed file URLs, which carry no
// sandbox ID.
func (m *Manager) SandboxByToken(check func(token string) bool) (string, bool) {
	for _, e := range m.entries() {
		// A sandbox without a token (secure: false) has no signed URLs:
		// every signature would match it, and they name no sandbox.
		if v := e.view(); v.phase == phaseRunning && v.sb.AccessToken != "" && check(v.sb.AccessToken) {
			return e.id, true
		}
	}
	return "", false
}

// Stats returns resource usage of a sandbox holding an instance.
func (m *Manager) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	e := m.entry(id)
	if e == nil {
		if _, err := m.Get(ctx, id); err != nil {
			return runtime.Stats{}, err
		}
		return runtime.Stats{}, fmt.Errorf("%w: sandbox %s holds no resources", node.ErrConflict, id)
	}
	if v := e.view(); v.slot == nil || v.phase == phaseGone {
		return runtime.Stats{}, nil // paused on disk: holds no memory or CPU
	}
	return m.driver.Stats(ctx, id)
}

// LiveCount is the number of sandboxes holding resources.
func (m *Manager) LiveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// Requests to sandboxes address them as "<sandboxID>.<ip>:<port>", and
// dialSandbox connects to <ip>:<port>. Keep-alive connections are pooled by
// that host name, so a connection to a sandbox is never reused for another
// one that later gets the same address (slots are reused): such a stale
// connection would hang or be cut mid-stream.
func sandboxHostPort(id string, ip netip.Addr, port int) string {
	return net.JoinHostPort(id+"."+ip.String(), strconv.Itoa(port))
}

func envdURL(id string, ip netip.Addr) string {
	return "http://" + sandboxHostPort(id, ip, EnvdPort)
}

var sandboxDialer = &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}

func dialSandbox(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, ipPart, ok := strings.Cut(host, "."); ok {
		if _, perr := netip.ParseAddr(host); perr != nil {
			host = ipPart
		}
	}
	return sandboxDialer.DialContext(ctx, network, net.JoinHostPort(host, port))
}

func mergeEnv(layers ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, l := range layers {
		for k, v := range l {
			out[k] = v
		}
	}
	return out
}

func cloneSandbox(sb *store.Sandbox) *store.Sandbox {
	c := *sb
	c.Metadata = mergeEnv(sb.Metadata)
	c.EnvVars = mergeEnv(sb.EnvVars)
	if sb.Network != nil {
		n := *sb.Network
		c.Network = &n
	}
	c.VolumeMounts = slices.Clone(sb.VolumeMounts)
	return &c
}

func firstPositive(vals ...int) int {
	for _, v := range vals {
		if v > 0 {
			return v
		}
	}
	return 0
}
