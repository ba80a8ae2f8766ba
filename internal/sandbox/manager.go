// Package sandbox is the lifecycle of sandboxes on one node: create, kill,
// deadlines, and reconciliation of records with the runtime after a restart.
// It talks to the runtime driver, the network slot pool, the store and the
// in-sandbox envd, and nothing else.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// Config bounds and defaults for sandboxes.
type Config struct {
	EnvdPath        string // host path of the static envd binary
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
	// DeadRetention is how long records of dead sandboxes are kept.
	DeadRetention time.Duration
}

// SlotPool is what the manager needs of the network.
type SlotPool interface {
	Start(ctx context.Context, inUse []int) error
	Acquire(ctx context.Context) (*network.Slot, error)
	Slot(index int) *network.Slot
	Release(ctx context.Context, index int) error
}

// Manager owns the sandboxes of one node.
type Manager struct {
	cfg       Config
	store     store.Store
	driver    runtime.Driver
	slots     SlotPool
	templates *template.Manager
	logger    *slog.Logger
	http      *http.Client // to envd, over the sandboxes' veths

	mu   sync.Mutex
	live map[string]*entry // sandboxes that hold resources

	stopMonitor context.CancelFunc
	monitorDone chan struct{}
}

// entry is the in-memory side of a sandbox that holds resources. Its mutex
// serialises lifecycle operations on that sandbox.
type entry struct {
	mu    sync.Mutex
	sb    *store.Sandbox // guarded by mu
	slot  *network.Slot
	envd  *envdclient.Client
	timer *time.Timer
	gone  bool // killed or dead; the entry is being removed
}

// NewManager wires a manager. Call Start before use.
func NewManager(cfg Config, st store.Store, driver runtime.Driver, slots SlotPool,
	templates *template.Manager, logger *slog.Logger) *Manager {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// envd responses are streamed; never buffer or compress them here.
		DisableCompression: true,
	}
	return &Manager{
		cfg: cfg, store: st, driver: driver, slots: slots, templates: templates, logger: logger,
		http: &http.Client{Transport: transport},
		live: map[string]*entry{},
	}
}

// HTTPTransport is the transport used to reach envd; the envd proxy shares it.
func (m *Manager) HTTPTransport() http.RoundTripper { return m.http.Transport }

// CreateRequest is a request for a new sandbox.
type CreateRequest struct {
	Template  string // template ID or name
	VCPU      int    // 0 = template or node default
	MemoryMB  int    // 0 = template or node default
	Timeout   time.Duration
	Metadata  map[string]string
	EnvVars   map[string]string
	AutoPause bool
}

func (m *Manager) validate(req *CreateRequest, tpl *store.Template) error {
	if req.VCPU == 0 {
		req.VCPU = firstPositive(tpl.VCPU, m.cfg.DefaultVCPU)
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = firstPositive(tpl.MemoryMB, m.cfg.DefaultMemoryMB)
	}
	if req.VCPU < 1 || req.VCPU > m.cfg.MaxVCPU {
		return fmt.Errorf("%w: vcpu must be between 1 and %d, got %d", ErrInvalid, m.cfg.MaxVCPU, req.VCPU)
	}
	if req.MemoryMB < m.cfg.MinMemoryMB || req.MemoryMB > m.cfg.MaxMemoryMB {
		return fmt.Errorf("%w: memoryMB must be between %d and %d, got %d",
			ErrInvalid, m.cfg.MinMemoryMB, m.cfg.MaxMemoryMB, req.MemoryMB)
	}
	timeout, err := m.checkTimeout(req.Timeout)
	if err != nil {
		return err
	}
	req.Timeout = timeout
	return nil
}

func (m *Manager) checkTimeout(d time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return m.cfg.DefaultTimeout, nil
	case d < 0 || d > m.cfg.MaxTimeout:
		return 0, fmt.Errorf("%w: timeout must be between 1 and %d seconds", ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	return d, nil
}

// Create starts a sandbox and returns once envd in it answers.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*store.Sandbox, error) {
	if req.Template == "" {
		req.Template = template.BaseName
	}
	tpl, err := m.templates.Get(ctx, req.Template)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: template %q", ErrNotFound, req.Template)
	}
	if err != nil {
		return nil, err
	}
	if err := m.validate(&req, tpl); err != nil {
		return nil, err
	}

	slot, err := m.slots.Acquire(ctx)
	if err != nil {
		if errors.Is(err, network.ErrExhausted) {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("acquire network slot: %w", err)
	}
	now := time.Now().UTC()
	sb := &store.Sandbox{
		ID: NewID(), TemplateID: tpl.ID, Alias: tpl.Name, State: store.StateStarting,
		VCPU: req.VCPU, MemoryMB: req.MemoryMB, Metadata: req.Metadata, EnvVars: req.EnvVars,
		AccessToken: newAccessToken(), SlotIndex: slot.Index, AutoPause: req.AutoPause,
		StartedAt: now, EndAt: now.Add(req.Timeout), UpdatedAt: now,
	}
	log := m.logger.With("sandbox", sb.ID)

	// Undo in reverse order if anything below fails: nothing half-made stays.
	var undo []func()
	fail := func(err error) (*store.Sandbox, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		log.WarnContext(ctx, "create failed", "err", err)
		return nil, err
	}
	undo = append(undo, func() {
		if err := m.slots.Release(context.WithoutCancel(ctx), slot.Index); err != nil {
			log.Error("release slot after failed create", "err", err)
		}
	})
	// The starting record is durable first, so a crash mid-create is
	// cleaned up by reconcile.
	if err := m.store.CreateSandbox(ctx, sb); err != nil {
		return fail(fmt.Errorf("record sandbox: %w", err))
	}
	undo = append(undo, func() {
		if err := m.store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
			log.Error("delete record after failed create", "err", err)
		}
	})
	spec := runtime.Spec{
		ID: sb.ID, RootfsPath: tpl.RootfsPath, EnvdPath: m.cfg.EnvdPath,
		EnvdArgs:  []string{"--port", strconv.Itoa(EnvdPort)},
		NetnsPath: slot.NetnsPath, VCPU: sb.VCPU, MemoryMB: sb.MemoryMB, PidsLimit: m.cfg.PidsLimit,
		Hostname: "sandbox", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	start := time.Now()
	if err := m.driver.Start(ctx, spec); err != nil {
		return fail(fmt.Errorf("start sandbox: %w", err))
	}
	undo = append(undo, func() {
		if err := m.driver.Kill(context.WithoutCancel(ctx), sb.ID); err != nil {
			log.Error("kill after failed create", "err", err)
		}
	})
	booted := time.Since(start)

	envd := envdclient.New(envdURL(slot.SandboxIP), m.http, "")
	if err := m.waitReady(ctx, envd); err != nil {
		return fail(fmt.Errorf("sandbox did not become ready: %w", err))
	}
	if err := envd.Init(ctx, envdclient.InitRequest{
		AccessToken: sb.AccessToken, EnvVars: mergeEnv(tpl.Env, sb.EnvVars),
		DefaultUser: tpl.DefaultUser, DefaultWorkdir: tpl.DefaultWorkdir,
	}); err != nil {
		return fail(fmt.Errorf("init envd: %w", err))
	}
	envd = envdclient.New(envdURL(slot.SandboxIP), m.http, sb.AccessToken)

	sb.State = store.StateRunning
	sb.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return fail(fmt.Errorf("record running sandbox: %w", err))
	}
	e := &entry{sb: sb, slot: slot, envd: envd}
	m.mu.Lock()
	m.live[sb.ID] = e
	m.mu.Unlock()
	m.armTimer(e)
	log.InfoContext(ctx, "sandbox created", "template", tpl.Name, "boot", booted.Round(time.Millisecond),
		"total", time.Since(start).Round(time.Millisecond))
	return cloneSandbox(sb), nil
}

func (m *Manager) waitReady(ctx context.Context, envd *envdclient.Client) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	defer cancel()
	delay := 2 * time.Millisecond
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, time.Second)
		err := envd.Health(attempt)
		cancelAttempt()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envd health: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// Get returns a sandbox record.
func (m *Manager) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	return sb, err
}

// List returns sandbox records matching f.
func (m *Manager) List(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	return m.store.ListSandboxes(ctx, f)
}

// lookup returns the live entry of a sandbox, locked, or an error saying
// why there is none. The caller must unlock it.
func (m *Manager) lookup(ctx context.Context, id string) (*entry, error) {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		sb, err := m.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, sb.State)
	}
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	return e, nil
}

// Kill stops a sandbox, releases everything it held and forgets it.
// Records of dead sandboxes are removed too.
func (m *Manager) Kill(ctx context.Context, id string) error {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		if _, err := m.Get(ctx, id); err != nil {
			return err
		}
		// A dead sandbox: only its record is left.
		if err := m.store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		return fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	if err := m.release(ctx, e); err != nil {
		return err
	}
	if err := m.store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	m.logger.InfoContext(ctx, "sandbox killed", "sandbox", id)
	return nil
}

// release stops the sandbox and frees its slot; e.mu must be held. On
// success the entry is gone from the live set.
func (m *Manager) release(ctx context.Context, e *entry) error {
	if e.timer != nil {
		e.timer.Stop()
	}
	if err := m.driver.Kill(ctx, e.sb.ID); err != nil {
		m.armTimer(e)
		return fmt.Errorf("kill sandbox %s: %w", e.sb.ID, err)
	}
	if e.slot != nil {
		if err := m.slots.Release(ctx, e.slot.Index); err != nil {
			m.logger.ErrorContext(ctx, "release network slot", "sandbox", e.sb.ID, "slot", e.slot.Index, "err", err)
		}
	}
	e.gone = true
	m.mu.Lock()
	delete(m.live, e.sb.ID)
	m.mu.Unlock()
	return nil
}

// markDead records that a sandbox ended on its own and frees what it held;
// e.mu must be held.
func (m *Manager) markDead(ctx context.Context, e *entry, reason string) {
	if err := m.release(ctx, e); err != nil {
		m.logger.ErrorContext(ctx, "release dead sandbox", "sandbox", e.sb.ID, "err", err)
		return
	}
	e.sb.State = store.StateDead
	e.sb.EndedReason = reason
	e.sb.SlotIndex = -1
	e.sb.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, e.sb); err != nil {
		m.logger.ErrorContext(ctx, "record dead sandbox", "sandbox", e.sb.ID, "err", err)
	}
	m.logger.WarnContext(ctx, "sandbox died", "sandbox", e.sb.ID, "reason", reason)
}

// SetTimeout moves a sandbox's deadline to now+d (it may shorten it).
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if d <= 0 || d > m.cfg.MaxTimeout {
		return fmt.Errorf("%w: timeout must be between 1 and %d seconds", ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	e, err := m.lookup(ctx, id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	updated := cloneSandbox(e.sb)
	updated.EndAt = time.Now().UTC().Add(d)
	updated.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return err
	}
	e.sb = updated
	m.armTimer(e)
	return nil
}

// armTimer (re)starts the deadline timer of e; e.mu must be held or e not
// yet shared.
func (m *Manager) armTimer(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	id := e.sb.ID
	e.timer = time.AfterFunc(time.Until(e.sb.EndAt), func() { m.expire(id) })
}

// expire handles a deadline: the sandbox is killed (pause-on-timeout is
// the snapshot layer's job).
func (m *Manager) expire(id string) {
	m.mu.Lock()
	e := m.live[id]
	m.mu.Unlock()
	if e == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		return
	}
	if wait := time.Until(e.sb.EndAt); wait > 0 { // extended meanwhile
		e.timer = time.AfterFunc(wait, func() { m.expire(id) })
		return
	}
	if err := m.release(ctx, e); err != nil {
		m.logger.Error("kill expired sandbox", "sandbox", id, "err", err)
		return
	}
	if err := m.store.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.logger.Error("delete expired sandbox record", "sandbox", id, "err", err)
	}
	m.logger.Info("sandbox timed out and was killed", "sandbox", id)
}

// Envd returns a client for the envd of a running sandbox.
func (m *Manager) Envd(ctx context.Context, id string) (*envdclient.Client, error) {
	e, err := m.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if e.sb.State != store.StateRunning {
		return nil, fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, e.sb.State)
	}
	return e.envd, nil
}

// Target returns the address of a port inside a running sandbox, for the
// envd traffic proxy.
func (m *Manager) Target(ctx context.Context, id string, port int) (netip.AddrPort, error) {
	e, err := m.lookup(ctx, id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer e.mu.Unlock()
	if e.sb.State != store.StateRunning {
		return netip.AddrPort{}, fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, e.sb.State)
	}
	return netip.AddrPortFrom(e.slot.SandboxIP, uint16(port)), nil
}

// SandboxByToken finds the running sandbox whose envd access token makes
// check return true; used to route signed file URLs, which carry no
// sandbox ID.
func (m *Manager) SandboxByToken(check func(token string) bool) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, e := range m.live {
		if check(e.sb.AccessToken) {
			return id, true
		}
	}
	return "", false
}

// Stats returns resource usage of a running sandbox.
func (m *Manager) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	e, err := m.lookup(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	defer e.mu.Unlock()
	return m.driver.Stats(ctx, id)
}

// LiveCount is the number of sandboxes holding resources.
func (m *Manager) LiveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

func envdURL(ip netip.Addr) string {
	return "http://" + netip.AddrPortFrom(ip, EnvdPort).String()
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
