package sandbox

// Fakes of the manager's own interfaces (runtime driver, slot pool, envd,
// store failures) for fast, root-free tests of the lifecycle state
// machine. Each fake counts what it holds so that a test can check that a
// failure path left nothing behind, and fails on demand at any step.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	processpb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/aenv-dev/aenv/internal/template"
)

// faults makes named steps fail or hang. A step is "<op>" or
// "<op>:<sandboxID>"; hangs block until the call's context ends.
type faults struct {
	mu    sync.Mutex
	fail  map[string]error
	hang  map[string]bool
	calls map[string]int
}

func newFaults() *faults {
	return &faults{fail: map[string]error{}, hang: map[string]bool{}, calls: map[string]int{}}
}

func (f *faults) set(step string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, step)
	} else {
		f.fail[step] = err
	}
}

func (f *faults) setHang(step string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang[step] = on
}

func (f *faults) count(step string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[step]
}

// check records a call of op on id and returns its injected failure.
func (f *faults) check(ctx context.Context, op, id string) error {
	f.mu.Lock()
	f.calls[op]++
	err := f.fail[op]
	if e, ok := f.fail[op+":"+id]; ok {
		err = e
	}
	hang := f.hang[op] || f.hang[op+":"+id]
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return fmt.Errorf("%s %s: %w", op, id, ctx.Err())
	}
	return err
}

// instance is a sandbox the fake driver holds, with the fake envd in it.
type instance struct {
	state runtime.State
	token string // envd access token
	inits int
	// prepared: made by Prepare and not yet restored into or started.
	prepared bool
	// background: made with Spec.Background and not yet given Foreground.
	background bool
	// frozen: recorded running, but nothing in it runs (a pause cut
	// short): envd never answers until Unfreeze.
	frozen bool
	// slowHealth: that many next health checks get no answer (a sandbox
	// too busy to answer in time), then they are answered again.
	slowHealth int
	// exited is closed when the instance stops or is killed, for Exited.
	exited chan struct{}
	// rootfs is the root filesystem it was made from.
	rootfs string
}

var (
	_ runtime.Preparer  = (*fakeDriver)(nil)
	_ runtime.Unfreezer = (*fakeDriver)(nil)
	_ runtime.Watcher   = (*fakeDriver)(nil)
)

// fakeDriver is a runtime.Driver in memory. Checkpoint writes the envd
// token into the image so that Restore continues with it, as a real
// checkpoint does.
type fakeDriver struct {
	faults *faults
	mu     sync.Mutex
	inst   map[string]*instance
	onInit func(id string) // called at each /init, before its fault check
	// onUnfreeze is called at each Unfreeze, before its fault check.
	onUnfreeze func(id string)
	// onKill is called at each Kill, before its fault check.
	onKill func(id string)
	// checkRootfs: an instance made from a root filesystem that is not
	// there is recorded in noRootfs (a template deleted under a create).
	checkRootfs bool
	noRootfs    []string
}

// made notes that instance id is being made from spec's root filesystem;
// d.mu is held.
func (d *fakeDriver) made(spec runtime.Spec) {
	if !d.checkRootfs || spec.RootfsPath == "" {
		return
	}
	if _, err := os.Stat(spec.RootfsPath); err != nil {
		d.noRootfs = append(d.noRootfs, spec.ID+" on "+spec.RootfsPath)
	}
}

// on lists the instances made from root filesystem rootfs.
func (d *fakeDriver) on(rootfs string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id, in := range d.inst {
		if in.rootfs == rootfs {
			out = append(out, id)
		}
	}
	return out
}

// rootfsOf maps each instance to the root filesystem it was made from.
func (d *fakeDriver) rootfsOf() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]string{}
	for id, in := range d.inst {
		out[id] = in.rootfs
	}
	return out
}

func (d *fakeDriver) Name() string { return "fake" }
func (d *fakeDriver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Checkpoint: true, Fork: true, FilesystemSnapshot: true}
}

func (d *fakeDriver) ExportRootfs(ctx context.Context, id, file string) error {
	if err := d.faults.check(ctx, "export", id); err != nil {
		return err
	}
	d.mu.Lock()
	_, ok := d.inst[id]
	d.mu.Unlock()
	if !ok {
		return runtime.ErrNotFound
	}
	// A tar, as runsc writes: one file, named after the sandbox.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := []byte("files of " + id)
	if err := tw.WriteHeader(&tar.Header{Name: "./files-of-" + id, Typeflag: tar.TypeReg, Mode: 0o644,
		Size: int64(len(content))}); err != nil {
		return err
	}
	tw.Write(content)
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, buf.Bytes(), 0o600)
}

func (d *fakeDriver) Start(ctx context.Context, spec runtime.Spec) error {
	if err := runtime.ValidateID(spec.ID); err != nil {
		return err
	}
	if err := d.faults.check(ctx, "start", spec.ID); err != nil {
		return err
	}
	if spec.RootfsUpper != "" {
		if _, err := os.Stat(spec.RootfsUpper); err != nil {
			return fmt.Errorf("start over a saved filesystem: %w", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.made(spec)
	d.inst[spec.ID] = &instance{state: runtime.StateRunning, background: spec.Background, rootfs: spec.RootfsPath}
	return nil
}

func (d *fakeDriver) Kill(ctx context.Context, id string) error {
	if d.onKill != nil {
		d.onKill(id)
	}
	if err := d.faults.check(ctx, "kill", id); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in, ok := d.inst[id]; ok && in.exited != nil {
		close(in.exited)
	}
	delete(d.inst, id)
	return nil
}

// Exited closes its channel when instance id dies (die) or is killed.
func (d *fakeDriver) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	d.mu.Lock()
	in, ok := d.inst[id]
	if !ok || in.state == runtime.StateStopped {
		d.mu.Unlock()
		return nil, runtime.ErrNotFound
	}
	if in.exited == nil {
		in.exited = make(chan struct{})
	}
	ch := in.exited
	d.mu.Unlock()
	out := make(chan struct{})
	go func() {
		defer close(out)
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}()
	return out, nil
}

// die stops instance id on its own, as an out-of-memory kill would.
func (d *fakeDriver) die(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.inst[id]
	in.state = runtime.StateStopped
	if in.exited != nil {
		close(in.exited)
		in.exited = nil
	}
}

func (d *fakeDriver) State(ctx context.Context, id string) (runtime.State, error) {
	if err := d.faults.check(ctx, "state", id); err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	if !ok {
		return "", runtime.ErrNotFound
	}
	return in.state, nil
}

func (d *fakeDriver) List(ctx context.Context) ([]runtime.Instance, error) {
	if err := d.faults.check(ctx, "list", ""); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []runtime.Instance
	for id, in := range d.inst {
		out = append(out, runtime.Instance{ID: id, State: in.state})
	}
	return out, nil
}

func (d *fakeDriver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if err := d.faults.check(ctx, "stats", id); err != nil {
		return runtime.Stats{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.inst[id]; !ok {
		return runtime.Stats{}, runtime.ErrNotFound
	}
	return runtime.Stats{MemoryBytes: 1 << 20}, nil
}

func (d *fakeDriver) setState(ctx context.Context, op, id string, from, to runtime.State) error {
	if err := d.faults.check(ctx, op, id); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	if !ok {
		return runtime.ErrNotFound
	}
	if in.state != from {
		return fmt.Errorf("cannot %s container in state %s", op, in.state)
	}
	in.state = to
	return nil
}

func (d *fakeDriver) Pause(ctx context.Context, id string) error {
	return d.setState(ctx, "pause", id, runtime.StateRunning, runtime.StatePaused)
}

func (d *fakeDriver) Resume(ctx context.Context, id string) error {
	return d.setState(ctx, "resume", id, runtime.StatePaused, runtime.StateRunning)
}

func (d *fakeDriver) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return err
	}
	if err := d.faults.check(ctx, "checkpoint", id); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	if !ok {
		return runtime.ErrNotFound
	}
	if err := os.WriteFile(filepath.Join(imageDir, "pages.img"), []byte(in.token), 0o600); err != nil {
		return err
	}
	if !leaveRunning {
		in.state = runtime.StateStopped
	}
	return nil
}

func (d *fakeDriver) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if err := runtime.ValidateID(spec.ID); err != nil {
		return err
	}
	if err := d.faults.check(ctx, "restore", spec.ID); err != nil {
		return err
	}
	token, err := os.ReadFile(filepath.Join(imageDir, "pages.img"))
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.made(spec)
	d.inst[spec.ID] = &instance{state: runtime.StateRunning, token: string(token), background: spec.Background,
		rootfs: spec.RootfsPath}
	return nil
}

// Prepare makes an instance that runs nothing yet, as `runsc create`
// does: it shows as stopped until RestorePrepared or StartPrepared.
func (d *fakeDriver) Prepare(ctx context.Context, spec runtime.Spec) error {
	if err := runtime.ValidateID(spec.ID); err != nil {
		return err
	}
	if err := d.faults.check(ctx, "prepare", spec.ID); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.inst[spec.ID]; ok {
		return fmt.Errorf("sandbox %s already exists", spec.ID)
	}
	d.made(spec)
	d.inst[spec.ID] = &instance{state: runtime.StateStopped, prepared: true, background: spec.Background,
		rootfs: spec.RootfsPath}
	return nil
}

// takePrepared turns prepared instance id into a running one with token;
// a failure removes it, as the real driver does.
func (d *fakeDriver) takePrepared(ctx context.Context, op, id, token string) error {
	err := d.faults.check(ctx, op, id)
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	switch {
	case err != nil:
		delete(d.inst, id)
		return err
	case !ok || !in.prepared || in.state != runtime.StateStopped:
		delete(d.inst, id)
		return fmt.Errorf("%s %s: not a prepared sandbox", op, id)
	}
	in.prepared, in.state, in.token = false, runtime.StateRunning, token
	return nil
}

func (d *fakeDriver) RestorePrepared(ctx context.Context, id, imageDir string) error {
	token, err := os.ReadFile(filepath.Join(imageDir, "pages.img"))
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return d.takePrepared(ctx, "restorePrepared", id, string(token))
}

func (d *fakeDriver) StartPrepared(ctx context.Context, id string) error {
	return d.takePrepared(ctx, "startPrepared", id, "")
}

func (d *fakeDriver) Foreground(ctx context.Context, id string) error {
	if err := d.faults.check(ctx, "foreground", id); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	if !ok {
		return fmt.Errorf("foreground %s: %w", id, runtime.ErrNotFound)
	}
	in.background = false
	return nil
}

// background lists the instances still at background priority.
func (d *fakeDriver) background() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]bool{}
	for id, in := range d.inst {
		if in.background {
			out[id] = true
		}
	}
	return out
}

// prepared lists the instances prepared and not yet used.
func (d *fakeDriver) prepared() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id, in := range d.inst {
		if in.prepared {
			out = append(out, id)
		}
	}
	return out
}

func (d *fakeDriver) Cleanup(ctx context.Context, keep map[string]bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.inst {
		if !keep[id] {
			delete(d.inst, id)
		}
	}
	return nil
}

func (d *fakeDriver) ids() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id := range d.inst {
		out = append(out, id)
	}
	return out
}

func (d *fakeDriver) state(id string) runtime.State {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in, ok := d.inst[id]; ok {
		return in.state
	}
	return ""
}

// Unfreeze resumes a frozen instance.
func (d *fakeDriver) Unfreeze(ctx context.Context, id string) (bool, error) {
	d.mu.Lock()
	hook := d.onUnfreeze
	d.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	if err := d.faults.check(ctx, "unfreeze", id); err != nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.inst[id]
	if !ok || !in.frozen {
		return false, nil
	}
	in.frozen = false
	return true, nil
}

// freeze makes instance id frozen (see instance.frozen).
func (d *fakeDriver) freeze(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inst[id].frozen = true
}

// serveEnvd answers envd's /health and /init for instance id, as the real
// envd does: /init needs the current token once one is set.
func (d *fakeDriver) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	if r.URL.Path == "/health" {
		d.faults.check(r.Context(), "health", id) // counted, answered or not
	}
	d.mu.Lock()
	in, ok := d.inst[id]
	d.mu.Unlock()
	if !ok || in.state != runtime.StateRunning {
		http.Error(w, "no route to host", http.StatusBadGateway)
		return
	}
	d.mu.Lock()
	frozen := in.frozen
	d.mu.Unlock()
	if frozen {
		// No answer until the caller gives up.
		<-r.Context().Done()
		http.Error(w, "no answer", http.StatusGatewayTimeout)
		return
	}
	switch r.URL.Path {
	case "/health":
		d.mu.Lock()
		slow := in.slowHealth > 0
		if slow {
			in.slowHealth--
		}
		d.mu.Unlock()
		if slow {
			<-r.Context().Done()
			http.Error(w, "no answer", http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "/init":
		d.mu.Lock()
		hook := d.onInit
		d.mu.Unlock()
		if hook != nil {
			hook(id)
		}
		if err := d.faults.check(r.Context(), "init", id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if in.token != "" && r.Header.Get("X-Access-Token") != in.token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		var body struct {
			AccessToken *string `json:"accessToken"` // "" removes the token
		}
		json.NewDecoder(r.Body).Decode(&body)
		if body.AccessToken != nil {
			in.token = *body.AccessToken
		}
		in.inits++
		w.WriteHeader(http.StatusNoContent)
	default:
		if path, h := processconnect.NewProcessHandler(fakeProcess{d: d, id: id}); strings.HasPrefix(r.URL.Path, path) {
			h.ServeHTTP(w, r)
			return
		}
		http.NotFound(w, r)
	}
}

// fakeProcess is envd's process service as far as the warm pool's warm-up
// command uses it: every command starts and exits 0 at once.
type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
	d  *fakeDriver
	id string
}

func (p fakeProcess) Start(ctx context.Context, _ *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	if err := p.d.faults.check(ctx, "run", p.id); err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	for _, ev := range []*processpb.ProcessEvent{
		{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: 1}}},
		{Event: &processpb.ProcessEvent_End{End: &processpb.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}}},
	} {
		if err := stream.Send(&processpb.StartResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}

// envdTransport delivers requests for "<id>.<ip>:<port>" to the fake envd
// of instance id, in process.
type envdTransport struct{ driver *fakeDriver }

func (t envdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	id, _, _ := strings.Cut(r.URL.Hostname(), ".")
	rec := httptest.NewRecorder()
	t.driver.serveEnvd(rec, r, id)
	if r.Body != nil {
		r.Body.Close()
	}
	return rec.Result(), nil
}

// fakeSlots is a SlotPool of n slots.
type fakeSlots struct {
	faults *faults
	mu     sync.Mutex
	n      int
	held   map[int]bool
}

func (p *fakeSlots) Start(ctx context.Context, inUse []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, i := range inUse {
		p.held[i] = true
	}
	return nil
}

func (p *fakeSlots) Acquire(ctx context.Context) (*network.Slot, error) {
	if err := p.faults.check(ctx, "acquire", ""); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.n {
		if !p.held[i] {
			p.held[i] = true
			return p.slot(i), nil
		}
	}
	return nil, network.ErrExhausted
}

func (p *fakeSlots) slot(i int) *network.Slot {
	return &network.Slot{Index: i, SandboxIP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}
}

func (p *fakeSlots) Slot(i int) *network.Slot { return p.slot(i) }

func (p *fakeSlots) Release(ctx context.Context, i int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held[i] {
		return fmt.Errorf("slot %d released twice", i)
	}
	delete(p.held, i)
	return nil
}

func (p *fakeSlots) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n - len(p.held)
}

func (p *fakeSlots) SetPolicy(ctx context.Context, i int, pol network.Policy) error {
	return p.faults.check(ctx, "policy", "")
}

func (p *fakeSlots) AllCounters(ctx context.Context) (map[int]network.Traffic, error) {
	return map[int]network.Traffic{}, nil
}

func (p *fakeSlots) DNSServers() []netip.Addr { return nil }

func (p *fakeSlots) inUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// faultyStore is the real SQLite store with writes that fail on demand,
// and a count of calls made after it was closed.
type faultyStore struct {
	store.Store
	faults *faults
	mu     sync.Mutex
	closed bool
	late   int
	// beforeCreate, when set, runs as a sandbox record is about to be
	// written: what a concurrent request does between a create's read of
	// its template and its record.
	beforeCreate func()
}

func (s *faultyStore) write(ctx context.Context, op string) error {
	s.mu.Lock()
	if s.closed {
		s.late++
	}
	s.mu.Unlock()
	return s.faults.check(ctx, op, "")
}

func (s *faultyStore) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	if err := s.write(ctx, "store.create"); err != nil {
		return err
	}
	if s.beforeCreate != nil {
		s.beforeCreate()
	}
	return s.Store.CreateSandbox(ctx, sb)
}

func (s *faultyStore) CreateSandboxHolding(ctx context.Context, sb *store.Sandbox, rootfs string) error {
	if err := s.write(ctx, "store.create"); err != nil {
		return err
	}
	if s.beforeCreate != nil {
		s.beforeCreate()
	}
	return s.Store.CreateSandboxHolding(ctx, sb, rootfs)
}

func (s *faultyStore) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	if err := s.write(ctx, "store.update:"+string(sb.State)); err != nil {
		return err
	}
	if err := s.write(ctx, "store.update"); err != nil {
		return err
	}
	return s.Store.UpdateSandbox(ctx, sb)
}

func (s *faultyStore) DeleteSandbox(ctx context.Context, id string) error {
	if err := s.write(ctx, "store.delete"); err != nil {
		return err
	}
	return s.Store.DeleteSandbox(ctx, id)
}

func (s *faultyStore) PutTemplate(ctx context.Context, t *store.Template) error {
	if err := s.write(ctx, "store.putTemplate"); err != nil {
		return err
	}
	return s.Store.PutTemplate(ctx, t)
}

func (s *faultyStore) ReplaceTemplate(ctx context.Context, t *store.Template) (*store.Template, error) {
	if err := s.write(ctx, "store.putTemplate"); err != nil {
		return nil, err
	}
	return s.Store.ReplaceTemplate(ctx, t)
}

func (s *faultyStore) GetSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	s.write(ctx, "store.get")
	return s.Store.GetSandbox(ctx, id)
}

func (s *faultyStore) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	s.write(ctx, "store.list")
	return s.Store.ListSandboxes(ctx, f)
}

func (s *faultyStore) markClosed() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *faultyStore) lateCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.late
}

// world is a manager wired to fakes, with the base template recorded.
type world struct {
	t      *testing.T
	m      *Manager
	driver *fakeDriver
	slots  *fakeSlots
	store  *faultyStore
	faults *faults
	cfg    Config
	base   *store.Template
	dir    string
	// wrap, when set, gives the manager another driver over driver (a
	// test's added interfaces).
	wrap func(*fakeDriver) runtime.Driver
}

var errInjected = errors.New("injected failure")

// errDiskFull is how the SQLite store reports a full disk: SQLite's text,
// and the store's kind for it.
var errDiskFull = fmt.Errorf("database or disk is full (13): %w", store.ErrFull)

func newWorld(t *testing.T, tune ...func(*Config)) *world {
	t.Helper()
	dir := t.TempDir()
	f := newFaults()
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, faults: f, dir: dir,
		driver: &fakeDriver{faults: f, inst: map[string]*instance{}},
		slots:  &fakeSlots{faults: f, n: 16, held: map[int]bool{}},
		store:  &faultyStore{Store: db, faults: f},
	}
	w.cfg = Config{
		ImagesDir: filepath.Join(dir, "images"), MaxForkCount: 8, ForkParallelism: 4,
		DefaultTimeout: time.Minute, MaxTimeout: time.Hour, DefaultVCPU: 1, MaxVCPU: 4,
		DefaultMemoryMB: 512, MinMemoryMB: 128, MaxMemoryMB: 4096, ReadyTimeout: 2 * time.Second,
		MonitorInterval: time.Hour, MonitorTimeout: 100 * time.Millisecond, DeadRetention: time.Hour,
		Transport: envdTransport{w.driver},
	}
	for _, fn := range tune {
		fn(&w.cfg)
	}
	rootfs := filepath.Join(dir, "templates", "base", "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	w.base = &store.Template{ID: "base0000000000000000", Name: template.BaseName, RootfsPath: rootfs,
		Kind: store.KindRootfs, CreatedAt: time.Now().UTC()}
	if err := db.PutTemplate(context.Background(), w.base); err != nil {
		t.Fatal(err)
	}
	w.start()
	t.Cleanup(func() {
		w.stop()
		db.Close()
	})
	return w
}

// start makes a manager over the world's fakes and reconciles, as a
// server start does.
func (w *world) start() {
	w.t.Helper()
	tm := template.NewManager(w.store, template.BaseConfig{}, template.Dirs{
		TemplatesDir: filepath.Join(w.dir, "templates")}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var driver runtime.Driver = w.driver
	if w.wrap != nil {
		driver = w.wrap(w.driver)
	}
	w.m = NewManager(w.cfg, w.store, driver, w.slots, tm, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := w.m.Start(context.Background()); err != nil {
		w.t.Fatal(err)
	}
}

// stop shuts the manager down; sandboxes stay for the next start.
func (w *world) stop() {
	if w.m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.m.Shutdown(ctx, false); err != nil {
		w.t.Errorf("shutdown: %v", err)
	}
	w.m = nil
}

// halt stops the manager's goroutines (monitor, watches, timers) as
// the first moment of a kill -9 does; crash completes it.
func (w *world) halt() {
	w.m.mu.Lock()
	w.m.closed = true
	w.m.mu.Unlock()
	w.m.cancel()
	w.m.owned.Wait()
}

// crash drops the manager without a shutdown, as kill -9 would (its
// goroutines are cancelled but nothing is cleaned up), and starts anew.
func (w *world) crash() {
	w.halt()
	w.m = nil
	w.slots.mu.Lock()
	w.slots.held = map[int]bool{} // the kernel's slots outlive the process; Start is told which are in use
	w.slots.mu.Unlock()
	w.start()
}

func (w *world) create() *store.Sandbox {
	w.t.Helper()
	sb, err := w.m.Create(context.Background(), createReq())
	if err != nil {
		w.t.Fatalf("create: %v", err)
	}
	return sb
}

// record returns the stored record of id, or nil.
func (w *world) record(id string) *store.Sandbox {
	sb, err := w.store.Store.GetSandbox(context.Background(), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return sb
}

func (w *world) images() []string {
	entries, _ := os.ReadDir(w.cfg.ImagesDir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// settle waits for background slot releases.
func (w *world) settle(wantSlots int) {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.slots.inUse() != wantSlots {
		if time.Now().After(deadline) {
			w.t.Fatalf("slots in use: %d, want %d", w.slots.inUse(), wantSlots)
		}
		time.Sleep(time.Millisecond)
	}
}

// empty checks that nothing at all is held: no instance, slot, record,
// live entry or image.
func (w *world) empty() {
	w.t.Helper()
	w.settle(0)
	if ids := w.driver.ids(); len(ids) != 0 {
		w.t.Errorf("instances left: %v", ids)
	}
	if n := w.m.LiveCount(); n != 0 {
		w.t.Errorf("live entries left: %d", n)
	}
	all, _ := w.store.Store.ListSandboxes(context.Background(), store.SandboxFilter{})
	if len(all) != 0 {
		w.t.Errorf("records left: %d (first %s, %s)", len(all), all[0].ID, all[0].State)
	}
	if imgs := w.images(); len(imgs) != 0 {
		w.t.Errorf("images left: %v", imgs)
	}
}
