package sandbox

// A create, from request to running sandbox, in the order it happens:
// Create checks the request and builds the record; launch asks plan
// where the instance comes from (a pool's, or a new one) and tries each
// way in turn; a pooled instance is adopted, a new one brought up by
// launchIn and bringUp; either way the record and its reference to the
// root filesystem are written before the sandbox is published, and envd is
// given the sandbox's identity. Fork children take the same path, pending
// until finish.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gvisor.dev/gvisor/pkg/cleanup"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/tracing"
)

// Create starts a sandbox and returns once envd in it answers. A rootfs
// template boots; a snapshot template is restored, memory and all.
func (m *Manager) Create(ctx context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	ctx, span := tracing.Child(ctx, "create sandbox", attribute.String("aenv.template", req.Template))
	sb, err := m.create(ctx, req)
	endSpan(span, sb, err)
	return sb, err
}

// endSpan ends the span of a step that made sandbox sb (nil on failure).
func endSpan(span trace.Span, sb *store.Sandbox, err error) {
	if sb != nil && span.IsRecording() {
		span.SetAttributes(tracing.SandboxID.String(sb.ID))
	}
	tracing.End(span, err)
}

func (m *Manager) create(ctx context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	if req.Template == "" {
		req.Template = template.BaseName
	}
	tpl, err := m.GetTemplate(ctx, req.Template)
	if err != nil {
		return nil, err
	}
	if template.IsCodeInterpreter(req.Template) {
		if tpl, err = m.codeInterpreterFor(ctx, req, tpl); err != nil {
			return nil, err
		}
	}
	if tpl.Kind != store.KindRootfs && tpl.Kind != "" {
		// A restored sandbox keeps the machine shape it was checkpointed
		// with; requested sizes are not applied.
		req.VCPU, req.MemoryMB = tpl.VCPU, tpl.MemoryMB
	}
	if err := m.validate(&req, tpl); err != nil {
		return nil, err
	}
	if tpl.ImageDir != "" {
		// A restore is given the mounts its checkpoint had: the
		// snapshot's, and no others.
		if len(req.VolumeMounts) > 0 {
			return nil, fmt.Errorf("%w: %s is a snapshot, restored with the volumes its sandbox had (%d); it takes no others",
				node.ErrInvalid, req.Template, len(tpl.VolumeMounts))
		}
		if err := snapshotVolumesUsable(tpl, req.TeamID); err != nil {
			return nil, err
		}
		if len(tpl.VolumeMounts) > 0 && m.cfg.Shared != nil && m.cfg.Shared.Remote(tpl) {
			// Unavailable, not a conflict: a gateway then offers the create
			// to the next node, which may be the volumes'.
			return nil, fmt.Errorf("%w: snapshot %s mounts volumes of node %s: it starts there (a gateway sends it there)",
				node.ErrUnavailable, tpl.Name, tpl.NodeID)
		}
		req.VolumeMounts = tpl.VolumeMounts
	}
	pol, err := ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	if err := m.checkUpstream(ctx, pol); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sb := &store.Sandbox{
		TemplateID: tpl.ID, Alias: tpl.Name, State: store.StateStarting,
		VCPU: req.VCPU, MemoryMB: req.MemoryMB, Metadata: req.Metadata,
		EnvVars:     mergeEnv(tpl.EnvVars, req.EnvVars),
		AccessToken: newAccessToken(), AutoPause: req.AutoPause,
		AutoPauseDropMemory: req.AutoPauseDropMemory, AutoResume: req.AutoResume,
		StartedAt: now, EndAt: now.Add(req.Timeout), UpdatedAt: now,
		TimeoutSecs: int(req.Timeout.Seconds()), Network: req.Network, TeamID: req.TeamID,
		VolumeMounts: slices.Clone(req.VolumeMounts),
	}
	if req.Insecure {
		sb.AccessToken = ""
	}
	if req.Private {
		sb.TrafficToken = newAccessToken()
	}
	var img image
	if tpl.Kind == store.KindSandboxTemplate {
		// Every sandbox of a template is restored from its one image;
		// each must draw its own random numbers. (A snapshot, or a fork,
		// is a copy, and keeps the generators' state.)
		ctx = withReseed(ctx)
	}
	if tpl.ImageDir != "" {
		held, release, err := m.holdTemplateImage(ctx, tpl)
		if err != nil {
			return nil, err
		}
		defer release()
		img = held
	}
	e, err := m.launch(ctx, sb, tpl, img, false)
	if err != nil {
		return nil, err
	}
	return cloneSandbox(e.view().sb), nil
}

func (m *Manager) validate(req *node.CreateRequest, tpl *store.Template) error {
	if req.VCPU == 0 {
		req.VCPU = firstPositive(tpl.VCPU, m.cfg.DefaultVCPU)
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = firstPositive(tpl.MemoryMB, m.cfg.DefaultMemoryMB)
	}
	if req.VCPU < 1 || req.VCPU > m.cfg.MaxVCPU {
		return fmt.Errorf("%w: vcpu must be between 1 and %d, got %d", node.ErrInvalid, m.cfg.MaxVCPU, req.VCPU)
	}
	if req.MemoryMB < m.cfg.MinMemoryMB || req.MemoryMB > m.cfg.MaxMemoryMB {
		return fmt.Errorf("%w: memoryMB must be between %d and %d, got %d",
			node.ErrInvalid, m.cfg.MinMemoryMB, m.cfg.MaxMemoryMB, req.MemoryMB)
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
		return 0, fmt.Errorf("%w: timeout must be between 1 and %d seconds", node.ErrInvalid, int(m.cfg.MaxTimeout.Seconds()))
	}
	return d, nil
}

// image is a checkpoint to restore from; the zero value means boot.
type image struct {
	dir   string
	token string // envd access token inside the image
	// rootfsUpper, instead, is a saved filesystem to boot afresh over.
	rootfsUpper string
	// prepared: the instance was made ahead by the driver's Prepare with
	// this sandbox's spec; only the boot or the restore is left.
	prepared bool
	// envd is the envd build dir was taken with (envdOf: "" for this
	// node's), and root the root file system it was taken over (rootOf),
	// read once by whoever brings the image up.
	envd string
	root rootForm
}

// launch records sb as starting, brings its instance up in a fresh network
// slot (booting, or restoring img), and unless pending records it running
// and arms its deadline. A pending sandbox stays starting until finish; a
// crash before that removes it. On failure nothing it made is left.
//
// Where the instance comes from is plan's choice: a pooled one when a
// pool has one ready (the quickest first), else a new one. Each try works
// on its own copy of sb, with the ID of the instance it lands in; a pooled
// instance that fails is removed and the next choice tried, the last being
// a new instance, whose failure is the launch's.
func (m *Manager) launch(ctx context.Context, sb *store.Sandbox, tpl *store.Template, img image, pending bool) (*entry, error) {
	img.envd, img.root = m.envdOf(img.dir), m.rootOf(ctx, img.dir, tpl.RootfsPath)
	var asked source
	for {
		p := m.plan(ctx, sb, tpl, img, pending, asked)
		asked |= p.asked
		defer p.end()
		try := cloneSandbox(sb)
		try.ID = p.id
		tryCtx, span := tracing.Child(ctx, "launch", tracing.SandboxID.String(p.id),
			attribute.String("aenv.launch.source", p.source.String()))
		var e *entry
		var err error
		switch p.source {
		case fromWarm:
			e, err = m.launchWarm(tryCtx, try, tpl, p.warm)
		case fromRestored:
			e, err = m.launchRestored(tryCtx, try, tpl, p.prepared)
		case fromPrepared:
			e, err = m.launchIn(tryCtx, try, tpl, img, pending, p.prepared)
		default:
			e, err = m.launchIn(tryCtx, try, tpl, img, pending, nil)
			tracing.End(span, err)
			return e, err
		}
		tracing.End(span, err)
		if p.prepared != nil {
			// Claimed: its record (if any) now holds the root filesystem.
			m.releasePrepared(ctx, p.prepared)
		}
		retry := err != nil && ctx.Err() == nil
		if p.source == fromPrepared {
			// Only a failure of the pool's sandbox, not of the launch.
			retry = retry && errors.Is(err, errNotPrepared)
		}
		if !retry {
			return e, err
		}
		m.logger.WarnContext(ctx, "pooled sandbox unusable; trying the next way", "from", p.source, "sandbox", p.id, "err", err)
	}
}

// source is where a launch's instance comes from, quickest first; a set
// of them is their bits.
type source uint8

const (
	fromWarm     source = 1 << iota // the warm pool: booted, envd answering
	fromRestored                    // the prepared pool: restored from the image, paused
	fromPrepared                    // the prepared pool: made, not started
	fromNew                         // a new instance in a new slot
)

func (s source) String() string {
	switch s {
	case fromWarm:
		return "warm pool"
	case fromRestored:
		return "restored pool"
	case fromPrepared:
		return "prepared pool"
	case fromNew:
		return "new instance"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// launchPlan is plan's choice for one try of a launch.
type launchPlan struct {
	source   source
	id       string // the sandbox's ID: the pooled instance's, or a new one
	warm     *warmSandbox
	prepared *preparedSandbox
	// asked are the pools this try asked, and end ends their count of
	// this launch (they size themselves by the launches in progress,
	// served or not); deferred by launch.
	asked source
	end   func()
}

// plan chooses where the next try of a launch of sb from tpl gets its
// instance, skipping the pools an earlier try asked: a boot the warm pool
// can serve claims a warm sandbox, a restore of a new sandbox one restored
// ahead, and both, failing that, a prepared one of their shape; else a new
// one. Each pool asked counts the launch, served or not, once, until end.
func (m *Manager) plan(ctx context.Context, sb *store.Sandbox, tpl *store.Template, img image, pending bool, skip source) launchPlan {
	var ends []func()
	p := launchPlan{source: fromNew, id: NewID()}
	if len(sb.VolumeMounts) > 0 {
		// Pools make their instances without mounts, which a sandbox
		// cannot gain once made.
		skip |= fromWarm | fromRestored | fromPrepared
	}
	p.end = func() {
		for _, end := range ends {
			end()
		}
	}
	if skip&fromWarm == 0 && img.dir == "" && !pending {
		ws, counted := m.warm.begin(warmKey{tpl.ID, sb.VCPU, sb.MemoryMB})
		if counted {
			ends = append(ends, m.warm.end)
			p.asked |= fromWarm
		}
		if ws != nil {
			p.source, p.id, p.warm = fromWarm, ws.id, ws
			return p
		}
	}
	if skip&fromRestored == 0 && img.dir != "" && !pending && m.prep != nil && m.prep.maxRestored > 0 {
		k := prepKey{rootfs: tpl.RootfsPath, vcpu: sb.VCPU, memoryMB: sb.MemoryMB, image: img.dir, token: img.token,
			unheld: !m.local(tpl), envd: img.envd, root: img.root}
		ps := m.prep.begin(k)
		ends = append(ends, func() { m.prep.end(k) })
		p.asked |= fromRestored
		if ps != nil {
			p.source, p.id, p.prepared = fromRestored, ps.id, ps
			return p
		}
	}
	if skip&fromPrepared == 0 && img.rootfsUpper == "" && m.prep != nil {
		// A restore into it needs the envd its image was taken with.
		k := prepKey{rootfs: tpl.RootfsPath, vcpu: sb.VCPU, memoryMB: sb.MemoryMB, unheld: !m.local(tpl),
			envd: img.envd, root: img.root}
		ps := m.prep.begin(k)
		ends = append(ends, func() { m.prep.end(k) })
		p.asked |= fromPrepared
		if _, err := os.Stat(k.rootfs); ps != nil && err != nil {
			// The template's rootfs was removed since ps was made.
			m.discardPrepared(context.WithoutCancel(ctx), ps)
			ps = nil
		}
		if ps != nil {
			p.source, p.id, p.prepared = fromPrepared, ps.id, ps
			return p
		}
	}
	return p
}

// adopt turns a running instance made ahead (with sb's ID, in slot, envd
// answering) into sb: it gets the request's CPU priority (pools make theirs in the
// background), first (if any) wakes it, then egress policy, envd
// identity, and the record, written once everything works; on failure
// discard removes the instance.
func (m *Manager) adopt(ctx context.Context, sb *store.Sandbox, tpl *store.Template, slot *network.Slot,
	envd *envdclient.Client, first func(context.Context) error, discard func(context.Context), what string) (*entry, error) {
	start := time.Now()
	sb.SlotIndex, sb.State = slot.Index, phaseRunning.stored()
	err := m.foreground(ctx, sb.ID)
	if err == nil && first != nil {
		err = first(ctx)
	}
	if err == nil {
		err = m.applyNetwork(ctx, sb, slot)
	}
	if err == nil {
		err = m.identify(ctx, envd, sb, tpl)
	}
	if err == nil {
		sb.UpdatedAt = time.Now().UTC()
		err = m.recordSandbox(ctx, sb, tpl)
	}
	if err != nil {
		discard(context.WithoutCancel(ctx))
		return nil, err
	}
	// identify re-keyed the client to sb's token.
	e := newEntry(newView(phaseRunning, sb, slot, envd))
	m.register(e)
	// Its deadline armed and, as a launched one is, watched from the
	// start: a death in its first seconds is seen at once, not at the
	// monitor's next poll.
	e.mu.Lock()
	e.settle()
	e.mu.Unlock()
	m.logger.InfoContext(ctx, what, "sandbox", sb.ID, "template", tpl.Name,
		"took", time.Since(start).Round(time.Millisecond))
	return e, nil
}

// launchIn is launch in a fresh slot, or in the prepared sandbox ps.
func (m *Manager) launchIn(ctx context.Context, sb *store.Sandbox, tpl *store.Template, img image, pending bool, ps *preparedSandbox) (*entry, error) {
	start := time.Now()
	var undo cleanup.Cleanup
	defer undo.Clean()

	var slot *network.Slot
	if ps != nil {
		slot, img.prepared = ps.slot, true
	} else {
		var err error
		if slot, err = m.acquireSlot(ctx); err != nil {
			return nil, err
		}
	}
	log := m.logger.With("sandbox", sb.ID)
	undo.Add(func() { m.releaseSlot(ctx, slot.Index, sb.ID) })
	if ps != nil {
		// The prepared instance exists already, in the slot: it goes
		// before the slot does (bringUp removes it on its own failures,
		// not on the steps before it).
		undo.Add(func() { m.killInstance(ctx, sb.ID) })
	}
	sb.SlotIndex = slot.Index
	sb.State = phaseStarting.stored()
	if err := m.applyNetwork(ctx, sb, slot); err != nil {
		return nil, err
	}
	// The starting record is durable first, so a crash mid-create is
	// cleaned up by reconcile; with it the sandbox holds its template's
	// root filesystem before booting from it.
	if err := m.recordSandbox(ctx, sb, tpl); err != nil {
		return nil, err
	}
	undo.Add(func() { m.deleteRecord(ctx, sb.ID) })
	envd, err := m.bringUp(ctx, sb, tpl, slot, img)
	if err != nil {
		log.WarnContext(ctx, "create failed", "err", err)
		return nil, err
	}
	undo.Add(func() { m.killInstance(ctx, sb.ID) })
	phase := phaseStarting
	if !pending {
		phase = phaseRunning
		sb.State = phase.stored()
		sb.UpdatedAt = time.Now().UTC()
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, storeError("record running sandbox", err)
		}
	}
	undo.Release()
	e := newEntry(newView(phase, sb, slot, envd))
	m.register(e)
	e.mu.Lock()
	e.settle() // a pending one (starting) gets its deadline from finish
	e.mu.Unlock()
	log.InfoContext(ctx, "sandbox started", "template", tpl.Name, "restored", img.dir != "",
		"prepared", ps != nil, "took", time.Since(start).Round(time.Millisecond))
	return e, nil
}

// recordSandbox writes sb's record and, in the same transaction, its
// reference to tpl's root filesystem: a template deleted since it was read
// fails the create (not found) rather than leaving it files being removed,
// and a delete that comes later sees the sandbox.
func (m *Manager) recordSandbox(ctx context.Context, sb *store.Sandbox, tpl *store.Template) error {
	local := m.local(tpl)
	var err error
	if local {
		err = m.store.CreateSandboxHolding(ctx, sb, tpl.RootfsPath)
	} else {
		// Another node's template: the shared cache keeps its files.
		err = m.store.CreateSandbox(ctx, sb)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrTeamGone):
		return fmt.Errorf("%w: team %q does not exist (deleted while the sandbox was made?)", node.ErrNotFound, sb.TeamID)
	case local && errors.Is(err, store.ErrNotFound) && len(sb.VolumeMounts) > 0:
		return fmt.Errorf("%w: template %q, or a volume the sandbox mounts, was deleted", node.ErrNotFound, tpl.Name)
	case local && errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: template %q was deleted", node.ErrNotFound, tpl.Name)
	case errors.Is(err, store.ErrVolumeMoving):
		return fmt.Errorf("%w: a volume the sandbox mounts is moving to another node: try again in a moment (%v)", node.ErrUnavailable, err)
	case errors.Is(err, store.ErrVolumeElsewhere):
		return fmt.Errorf("%w: a volume the sandbox mounts is kept by another node (%v)", node.ErrConflict, err)
	}
	return storeError("record sandbox", err)
}

// local reports whether tpl is this node's, its root filesystem held by
// references in this node's records.
func (m *Manager) local(tpl *store.Template) bool {
	return m.cfg.Shared == nil || !m.cfg.Shared.Remote(tpl)
}

// bringUp starts (or restores img into) the instance of sb in slot, waits
// for its envd and gives it sb's identity: access token, env vars, default
// user. It returns the client, which now holds sb's token. On failure the
// instance is gone.
func (m *Manager) bringUp(ctx context.Context, sb *store.Sandbox, tpl *store.Template, slot *network.Slot, img image) (*envdclient.Client, error) {
	spec := m.spec(sb.ID, tpl, slot, sb.VCPU, sb.MemoryMB, img.envd, img.root)
	spec.RootfsUpper = img.rootfsUpper
	mounts, err := m.hostMounts(ctx, sb.VolumeMounts)
	if err != nil {
		return nil, err
	}
	spec.Mounts = mounts
	// The runtime's commands are this span's children.
	rctx, span := tracing.Child(ctx, "runtime start", tracing.SandboxID.String(sb.ID),
		attribute.Bool("aenv.restore", img.dir != ""), attribute.Bool("aenv.prepared", img.prepared))
	switch prep, _ := m.driver.(runtime.Preparer); {
	case img.prepared:
		// Made in the background: this request's priority first.
		if err = prep.Foreground(rctx, sb.ID); err != nil {
			m.killInstance(rctx, sb.ID)
		} else if img.dir == "" {
			err = prep.StartPrepared(rctx, sb.ID)
		} else {
			err = prep.RestorePrepared(rctx, sb.ID, img.dir)
		}
		if err != nil {
			err = fmt.Errorf("%w: %w", errNotPrepared, err)
		}
	case img.dir == "":
		err = m.driver.Start(rctx, spec)
	default:
		err = m.driver.Restore(rctx, spec, img.dir)
	}
	tracing.End(span, err)
	if err != nil {
		return nil, classifyRuntimeError(fmt.Errorf("start sandbox: %w", err))
	}
	envd := envdclient.New(envdURL(sb.ID, slot.SandboxIP), m.http, img.token)
	_, span = tracing.Child(ctx, "envd ready", tracing.SandboxID.String(sb.ID))
	err = m.waitReady(ctx, envd)
	if err == nil {
		err = m.identify(ctx, envd, sb, tpl)
	} else {
		err = fmt.Errorf("sandbox did not become ready: %w", err)
	}
	tracing.End(span, err)
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

// identify gives envd the sandbox's identity: its access token, env
// vars, default user and resolvers.
func (m *Manager) identify(ctx context.Context, envd *envdclient.Client, sb *store.Sandbox, tpl *store.Template) error {
	env := mergeEnv(tpl.Env, sb.EnvVars)
	if m.intercepted(sb) {
		env = mergeEnv(caTrustEnv, env) // the sandbox's own win
	}
	err := envd.Init(ctx, envdclient.InitRequest{
		// An insecure sandbox restored from a secure one's image must
		// drop the token that image's envd still holds.
		AccessToken: sb.AccessToken, ClearAccessToken: sb.AccessToken == "",
		EnvVars:     env,
		DefaultUser: tpl.DefaultUser, DefaultWorkdir: tpl.DefaultWorkdir,
		Nameservers: m.nameservers(), Reseed: reseeding(ctx),
	})
	if err != nil {
		return envdRefusedServer("init envd", err)
	}
	return m.trustEgressCA(ctx, envd, sb)
}

// reseedKey marks the context of a create from a template's image (see
// create): identify asks envd to seed the sandbox's random generators anew.
type reseedKey struct{}

func withReseed(ctx context.Context) context.Context {
	return context.WithValue(ctx, reseedKey{}, true)
}

func reseeding(ctx context.Context) bool { return ctx.Value(reseedKey{}) != nil }

// snapshotVolumesUsable refuses a sandbox of team from snapshot tpl that
// mounts volumes of another team (a snapshot shared with other teams
// must not lend them its volumes).
func snapshotVolumesUsable(tpl *store.Template, team string) error {
	if len(tpl.VolumeMounts) > 0 && tpl.TeamID != team {
		return fmt.Errorf("%w: snapshot %s mounts volumes of its team; only that team may start it", node.ErrInvalid, tpl.Name)
	}
	return nil
}

// hostMounts are the runtime's mounts of a sandbox's volumes: where each
// is on this node.
func (m *Manager) hostMounts(ctx context.Context, volumes []store.VolumeMount) ([]runtime.Mount, error) {
	if len(volumes) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, fmt.Errorf("%w: this node keeps no volumes", node.ErrInvalid)
	}
	mounts := make([]runtime.Mount, 0, len(volumes))
	for _, v := range volumes {
		dir, overlay, err := m.cfg.Volumes.HostPath(ctx, v.VolumeID)
		if err != nil {
			return nil, fmt.Errorf("mount volume %s at %s: %w", v.Name, v.Path, err)
		}
		mounts = append(mounts, runtime.Mount{Source: dir, Destination: v.Path, ReadOnly: v.ReadOnly, Overlay: overlay})
	}
	return mounts, nil
}

// spec is the runtime spec of sandbox id from tpl in slot, running envd
// (a pinned build, see envdOf; "" for this node's) over root.
func (m *Manager) spec(id string, tpl *store.Template, slot *network.Slot, vcpu, memoryMB int, envd string, root rootForm) runtime.Spec {
	if envd == "" {
		envd = m.cfg.EnvdPath
	}
	spec := runtime.Spec{
		ID: id, RootfsPath: tpl.RootfsPath, EnvdPath: envd,
		EnvdArgs:  []string{"--port", strconv.Itoa(EnvdPort)},
		NetnsPath: slot.NetnsPath, VCPU: vcpu, MemoryMB: memoryMB, PidsLimit: m.cfg.PidsLimit,
		Hostname: "sandbox", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	root.apply(&spec, m.cfg.RootImage)
	return spec
}

// finish turns a pending sandbox (a fork child) into a running one.
func (m *Manager) finish(ctx context.Context, e *entry) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	v := e.view()
	if err := allowed(opFinish, e.id, v.phase); err != nil {
		return err
	}
	sb, err := e.next(phaseRunning)
	if err != nil {
		return err
	}
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return storeError("record running sandbox", err)
	}
	e.transition(phaseRunning, sb, v.slot, v.envd, nil)
	return nil
}
