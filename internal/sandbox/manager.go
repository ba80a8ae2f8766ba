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
	"strings"
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
	EnvdPath  string // host path of the static envd binary
	ImagesDir string // checkpoint images (snapshots, paused-to-disk, fork)
	// PauseToDiskAfter is how long a sandbox stays paused in memory before
	// it is checkpointed to disk and its memory released; 0 = never.
	PauseToDiskAfter time.Duration
	MaxForkCount     int
	// ForkParallelism bounds the restores of one fork running at once.
	ForkParallelism int
	// WarmSandboxes is how many base sandboxes are kept booted ahead of
	// demand (see warm.go); 0 turns the pool off.
	WarmSandboxes   int
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
	Free() int
	SetPolicy(ctx context.Context, index int, pol network.Policy) error
	AllCounters(ctx context.Context) (map[int]network.Traffic, error)
	DNSServers() []netip.Addr
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

	warm        *warmPool
	background  sync.WaitGroup // slot releases in flight
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
		DialContext:         dialSandbox,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
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
	Network   *store.NetworkPolicy // nil: default policy
	// Private makes exposed ports require the traffic access token.
	Private bool
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

// Create starts a sandbox and returns once envd in it answers. A rootfs
// template boots; a snapshot template is restored, memory and all.
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
	if tpl.Kind != store.KindRootfs && tpl.Kind != "" {
		// A restored sandbox keeps the machine shape it was checkpointed
		// with; requested sizes are not applied.
		req.VCPU, req.MemoryMB = tpl.VCPU, tpl.MemoryMB
	}
	if err := m.validate(&req, tpl); err != nil {
		return nil, err
	}
	if _, err := ParseNetwork(req.Network); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sb := &store.Sandbox{
		ID: NewID(), TemplateID: tpl.ID, Alias: tpl.Name, State: store.StateStarting,
		VCPU: req.VCPU, MemoryMB: req.MemoryMB, Metadata: req.Metadata,
		EnvVars:     mergeEnv(tpl.EnvVars, req.EnvVars),
		AccessToken: newAccessToken(), AutoPause: req.AutoPause,
		StartedAt: now, EndAt: now.Add(req.Timeout), UpdatedAt: now,
		TimeoutSecs: int(req.Timeout.Seconds()), Network: req.Network,
	}
	if req.Private {
		sb.TrafficToken = newAccessToken()
	}
	e, err := m.launchNew(ctx, sb, tpl, tpl.ImageDir, tpl.EnvdToken)
	if err != nil {
		return nil, err
	}
	return cloneSandbox(e.sb), nil
}

// launchNew records sb as starting, brings its instance up in a fresh
// network slot (booting, or restoring imageDir whose envd answers to
// imageToken), records it running and arms its deadline. On failure
// nothing it made is left.
func (m *Manager) launchNew(ctx context.Context, sb *store.Sandbox, tpl *store.Template, imageDir, imageToken string) (*entry, error) {
	if imageDir == "" {
		if ws := m.takeWarm(warmKey{tpl.ID, sb.VCPU, sb.MemoryMB}); ws != nil {
			e, err := m.launchWarm(ctx, sb, tpl, ws)
			if err == nil {
				return e, nil
			}
			m.logger.WarnContext(ctx, "warm sandbox unusable; booting one", "err", err)
			sb.ID = NewID()
		}
	}
	log := m.logger.With("sandbox", sb.ID)
	slot, err := m.acquireSlot(ctx)
	if err != nil {
		return nil, err
	}
	sb.SlotIndex = slot.Index
	sb.State = store.StateStarting
	if err := m.applyNetwork(ctx, sb, slot); err != nil {
		m.releaseSlot(ctx, slot.Index, sb.ID)
		return nil, err
	}
	// The starting record is durable first, so a crash mid-create is
	// cleaned up by reconcile.
	if err := m.store.CreateSandbox(ctx, sb); err != nil {
		m.releaseSlot(ctx, slot.Index, sb.ID)
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	start := time.Now()
	envd, err := m.bringUp(ctx, sb, tpl, slot, imageDir, imageToken)
	if err == nil {
		sb.State = store.StateRunning
		sb.UpdatedAt = time.Now().UTC()
		if err = m.store.UpdateSandbox(ctx, sb); err != nil {
			err = fmt.Errorf("record running sandbox: %w", err)
			m.killInstance(ctx, sb.ID)
		}
	}
	if err != nil {
		m.releaseSlot(ctx, slot.Index, sb.ID)
		if derr := m.store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
			log.Error("delete record after failed create", "err", derr)
		}
		log.WarnContext(ctx, "create failed", "err", err)
		return nil, err
	}
	e := &entry{sb: sb, slot: slot, envd: envd}
	m.mu.Lock()
	m.live[sb.ID] = e
	m.mu.Unlock()
	m.armTimer(e)
	log.InfoContext(ctx, "sandbox started", "template", tpl.Name, "restored", imageDir != "",
		"took", time.Since(start).Round(time.Millisecond))
	return e, nil
}

// identify gives envd the sandbox's identity: its access token, env
// vars, default user and resolvers.
func (m *Manager) identify(ctx context.Context, envd *envdclient.Client, sb *store.Sandbox, tpl *store.Template) error {
	err := envd.Init(ctx, envdclient.InitRequest{
		AccessToken: sb.AccessToken, EnvVars: mergeEnv(tpl.Env, sb.EnvVars),
		DefaultUser: tpl.DefaultUser, DefaultWorkdir: tpl.DefaultWorkdir,
		Nameservers: m.nameservers(),
	})
	if err != nil {
		return fmt.Errorf("init envd: %w", err)
	}
	return nil
}

func (m *Manager) acquireSlot(ctx context.Context) (*network.Slot, error) {
	slot, err := m.slots.Acquire(ctx)
	if err != nil {
		if errors.Is(err, network.ErrExhausted) {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
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
	m.background.Add(1)
	go func() {
		defer m.background.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.releaseSlot(ctx, index, id)
	}()
}

func (m *Manager) killInstance(ctx context.Context, id string) {
	if err := m.driver.Kill(context.WithoutCancel(ctx), id); err != nil {
		m.logger.ErrorContext(ctx, "kill instance", "sandbox", id, "err", err)
	}
}

// bringUp starts (or restores from imageDir) the instance of sb in slot,
// waits for its envd and gives it sb's identity: access token, env vars,
// default user. It returns the client, which now holds sb's token. On
// failure the instance is gone.
func (m *Manager) bringUp(ctx context.Context, sb *store.Sandbox, tpl *store.Template, slot *network.Slot,
	imageDir, imageToken string) (*envdclient.Client, error) {
	spec := m.spec(sb.ID, tpl, slot, sb.VCPU, sb.MemoryMB)
	var err error
	if imageDir == "" {
		err = m.driver.Start(ctx, spec)
	} else {
		err = m.driver.Restore(ctx, spec, imageDir)
	}
	if err != nil {
		return nil, classifyRuntimeError(fmt.Errorf("start sandbox: %w", err))
	}
	envd := envdclient.New(envdURL(sb.ID, slot.SandboxIP), m.http, imageToken)
	err = m.waitReady(ctx, envd)
	if err == nil {
		err = m.identify(ctx, envd, sb, tpl)
	} else {
		err = fmt.Errorf("sandbox did not become ready: %w", err)
	}
	if err != nil {
		m.killInstance(ctx, sb.ID)
		return nil, err
	}
	return envd, nil // Init switched it to sb's token
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
	if e.slot != nil {
		if err := m.driver.Kill(ctx, e.sb.ID); err != nil {
			m.armTimer(e)
			return fmt.Errorf("kill sandbox %s: %w", e.sb.ID, err)
		}
		m.releaseSlotLater(e.slot.Index, e.sb.ID)
		e.slot = nil
	}
	if e.sb.ImageDir != "" {
		m.removeImage(ctx, e.sb.ImageDir)
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
	e.sb.ImageDir = ""
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
	if e.sb.State != store.StateRunning {
		return fmt.Errorf("%w: sandbox %s is %s; resume it to set a timeout", ErrConflict, id, e.sb.State)
	}
	updated := cloneSandbox(e.sb)
	updated.EndAt = time.Now().UTC().Add(d)
	updated.TimeoutSecs = int(d.Seconds())
	updated.UpdatedAt = time.Now().UTC()
	if err := m.store.UpdateSandbox(ctx, updated); err != nil {
		return err
	}
	e.sb = updated
	m.armTimer(e)
	return nil
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
func (m *Manager) Target(ctx context.Context, id string, port int) (string, error) {
	target, _, err := m.PortTarget(ctx, id, port)
	return target, err
}

// PortTarget is Target for exposed ports: it also returns the traffic
// token the caller must present ("" when the ports are public).
func (m *Manager) PortTarget(ctx context.Context, id string, port int) (string, string, error) {
	e, err := m.lookup(ctx, id)
	if err != nil {
		return "", "", err
	}
	defer e.mu.Unlock()
	if e.sb.State != store.StateRunning {
		return "", "", fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, e.sb.State)
	}
	return sandboxHostPort(id, e.slot.SandboxIP, port), e.sb.TrafficToken, nil
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
	if e.slot == nil {
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
