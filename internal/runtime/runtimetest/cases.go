package runtimetest

import (
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// testLifecycle: a started sandbox answers on its veth address with the
// spec's hostname and CPU count, is listed and running, has cgroup stats,
// writes into its own overlay only, and cannot write envd.
func (h *harness) testLifecycle(t *testing.T) {
	spec, g := h.start(t)
	st := g.mustState(t)
	// gVisor shows at least 2 CPUs (fewer makes some programs drop their
	// locking), so the check allows that floor.
	if st.Hostname != spec.Hostname || st.CPUs > max(spec.VCPU, 2) {
		t.Errorf("guest sees hostname %q, %d CPUs; want %q, at most max(%d, 2)", st.Hostname, st.CPUs, spec.Hostname, spec.VCPU)
	}
	h.wantState(t, spec.ID, runtime.StateRunning)

	list, err := h.driver.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	i := slices.IndexFunc(list, func(i runtime.Instance) bool { return i.ID == spec.ID })
	if i < 0 || list[i].State != runtime.StateRunning || list[i].Pid <= 0 {
		t.Errorf("List = %+v; want %s running with a pid", list, spec.ID)
	}

	stats, err := h.driver.Stats(t.Context(), spec.ID)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	t.Logf("stats: %+v", stats)
	if stats.MemoryLimitBytes != uint64(spec.MemoryMB)<<20 || stats.MemoryBytes == 0 || stats.CPUUsageNanos == 0 || stats.PidsCurrent == 0 {
		t.Errorf("Stats = %+v; want limit %d MiB and nonzero usage", stats, spec.MemoryMB)
	}

	g.writeFile(t, "/tmp/lifecycle", "hello")
	if got, ok := g.readFile(t, "/tmp/lifecycle"); !ok || got != "hello" {
		t.Errorf("read back /tmp/lifecycle = %q, %v", got, ok)
	}
	if _, err := os.Stat(h.rootfsPath("tmp/lifecycle")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox write reached the template rootfs: %v", err)
	}
	code, _, err := g.do(t.Context(), http.MethodPost, "/file", url.Values{"path": {runtime.EnvdMountPath}, "data": {"x"}})
	if err != nil || code == http.StatusOK {
		t.Errorf("writing envd inside the sandbox: status %d, %v; want refused", code, err)
	}
	if _, err := h.driver.Stats(t.Context(), randomID(t)); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats(unknown) = %v; want ErrNotFound", err)
	}
}

// testPauseResume: while paused the guest's counter stands still; after
// resume it advances again.
func (h *harness) testPauseResume(t *testing.T) {
	spec, g := h.start(t)
	rate := counterRate(t, g, 500*time.Millisecond)

	before := g.mustState(t).Counter
	start := time.Now()
	const pausedFor = 500 * time.Millisecond
	h.timed(t, "Pause", func() error { return h.driver.Pause(t.Context(), spec.ID) })
	h.wantState(t, spec.ID, runtime.StatePaused)
	time.Sleep(pausedFor)
	h.timed(t, "Resume", func() error { return h.driver.Resume(t.Context(), spec.ID) })
	after := g.mustState(t).Counter
	elapsed := time.Since(start)

	// Running all along, the counter would have grown rate*elapsed; paused,
	// at most rate*(elapsed-pausedFor) plus a little.
	limit := rate*(elapsed-pausedFor+100*time.Millisecond).Seconds() + 2
	if grew := float64(after - before); grew > limit {
		t.Errorf("counter grew %v over %v with %v paused (rate %.0f/s); want at most %.0f", grew, elapsed, pausedFor, rate, limit)
	}
	h.wantState(t, spec.ID, runtime.StateRunning)
	if again := counterRate(t, g, 300*time.Millisecond); again < rate/3 {
		t.Errorf("after resume the counter runs at %.0f/s; before pause %.0f/s", again, rate)
	}
}

// counterRate measures how fast the guest's counter grows per second.
func counterRate(t testing.TB, g *guest, over time.Duration) float64 {
	t.Helper()
	a, start := g.mustState(t).Counter, time.Now()
	time.Sleep(over)
	b := g.mustState(t).Counter
	rate := float64(b-a) / time.Since(start).Seconds()
	if rate <= 0 {
		t.Fatalf("guest counter does not advance (%d -> %d)", a, b)
	}
	return rate
}

// testCheckpointRestore: a copy restored into another namespace answers at
// its new address with the parent's memory and files, the parent keeps
// running, and the two no longer share anything.
func (h *harness) testCheckpointRestore(t *testing.T) {
	parent, pg := h.start(t)
	pg.writeFile(t, "/tmp/before", "from-parent")
	before := pg.mustState(t)

	image := filepath.Join(t.TempDir(), "image")
	h.timed(t, "Checkpoint(leaveRunning)", func() error { return h.driver.Checkpoint(t.Context(), parent.ID, image, true) })
	h.wantState(t, parent.ID, runtime.StateRunning)
	pg.mustState(t)

	_, cg := h.restore(t, image)
	child := cg.mustState(t)
	if child.Nonce != before.Nonce || child.Counter < before.Counter {
		t.Errorf("restored guest = %+v; want nonce %s and counter >= %d (continuing the parent)", child, before.Nonce, before.Counter)
	}
	if got, ok := cg.readFile(t, "/tmp/before"); !ok || got != "from-parent" {
		t.Errorf("restored /tmp/before = %q, %v; want the parent's file", got, ok)
	}
	wantIndependent(t, pg, cg)
	time.Sleep(100 * time.Millisecond)
	if later := cg.mustState(t).Counter; later <= child.Counter {
		t.Errorf("restored counter does not advance: %d then %d", child.Counter, later)
	}
}

// testCheckpointRestoreLarge: a sandbox holding bigMiB of data is restored
// with that data intact; this also times checkpoint and restore at size.
func (h *harness) testCheckpointRestoreLarge(t *testing.T) {
	const bigMiB = 256
	ns := NewNetns(t)
	spec := h.spec(t, ns)
	spec.MemoryMB = 1024
	h.timed(t, "Start", func() error { return h.driver.Start(t.Context(), spec) })
	h.killAtEnd(t, spec.ID)
	pg := newGuest(ns.GuestAddr)
	pg.waitReady(t, 10*time.Second)
	sum := pg.alloc(t, bigMiB)
	if stats, err := h.driver.Stats(t.Context(), spec.ID); err != nil || stats.MemoryBytes < bigMiB<<20 {
		t.Errorf("Stats with %d MiB allocated = %+v, %v; want MemoryBytes above it", bigMiB, stats, err)
	}

	image := filepath.Join(t.TempDir(), "image")
	h.timed(t, "Checkpoint(256MiB)", func() error { return h.driver.Checkpoint(t.Context(), spec.ID, image, true) })
	cns := NewNetns(t)
	child := h.spec(t, cns)
	child.MemoryMB = 1024
	h.timed(t, "Restore(256MiB)", func() error { return h.driver.Restore(t.Context(), child, image) })
	h.killAtEnd(t, child.ID)
	cg := newGuest(cns.GuestAddr)
	cg.waitReady(t, 10*time.Second)
	if got := cg.allocSum(t); got != sum {
		t.Errorf("restored memory checksum %s; want %s", got, sum)
	}
	if got := pg.allocSum(t); got != sum {
		t.Errorf("parent memory checksum after checkpoint %s; want %s", got, sum)
	}
}

// wantIndependent checks that a file written in one guest is not seen in
// the other, both ways.
func wantIndependent(t testing.TB, a, b *guest) {
	t.Helper()
	name := "/tmp/only-" + randomHex(t, 4)
	a.writeFile(t, name, "a")
	if _, ok := b.readFile(t, name); ok {
		t.Errorf("%s written at %s is visible at %s", name, a.addr, b.addr)
	}
	name = "/tmp/only-" + randomHex(t, 4)
	b.writeFile(t, name, "b")
	if _, ok := a.readFile(t, name); ok {
		t.Errorf("%s written at %s is visible at %s", name, b.addr, a.addr)
	}
}

// testFork: two restores of one image, made at the same time, run
// independently from the same memory.
func (h *harness) testFork(t *testing.T) {
	parent, pg := h.start(t)
	pg.writeFile(t, "/tmp/template", "shared")
	nonce := pg.mustState(t).Nonce
	image := filepath.Join(t.TempDir(), "image")
	h.timed(t, "Checkpoint(stop)", func() error { return h.driver.Checkpoint(t.Context(), parent.ID, image, false) })
	if pg.answers(t) {
		t.Error("parent still answers after Checkpoint without leaveRunning")
	}
	if err := h.driver.Kill(t.Context(), parent.ID); err != nil {
		t.Fatalf("Kill checkpointed parent: %v", err)
	}

	// Both restores run at once, as a fork of N children would.
	nss := []*Netns{NewNetns(t), NewNetns(t)}
	specs := []runtime.Spec{h.spec(t, nss[0]), h.spec(t, nss[1])}
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	start := time.Now()
	for i, spec := range specs {
		wg.Go(func() { errs[i] = h.driver.Restore(t.Context(), spec, image) })
	}
	wg.Wait()
	h.record("Restore x2 in parallel", time.Since(start))
	children := make([]*guest, len(specs))
	for i, spec := range specs {
		if errs[i] != nil {
			t.Fatalf("Restore fork child %d: %v", i, errs[i])
		}
		h.killAtEnd(t, spec.ID)
		children[i] = newGuest(nss[i].GuestAddr)
	}
	for i, g := range children {
		g.waitReady(t, 10*time.Second)
		if st := g.mustState(t); st.Nonce != nonce {
			t.Errorf("fork child %d has nonce %s; want the parent's %s", i, st.Nonce, nonce)
		}
		if got, ok := g.readFile(t, "/tmp/template"); !ok || got != "shared" {
			t.Errorf("fork child %d /tmp/template = %q, %v", i, got, ok)
		}
	}
	wantIndependent(t, children[0], children[1])
}

// testInitExit: when init exits the sandbox is reported stopped, and Kill
// removes it.
func (h *harness) testInitExit(t *testing.T) {
	spec, g := h.start(t)
	if code, _, err := g.do(t.Context(), http.MethodPost, "/exit", nil); err != nil || code != http.StatusNoContent {
		t.Fatalf("POST /exit: %d %v", code, err)
	}
	h.waitState(t, spec.ID, runtime.StateStopped, 10*time.Second)
	if err := h.driver.Kill(t.Context(), spec.ID); err != nil {
		t.Fatalf("Kill stopped sandbox: %v", err)
	}
	h.wantNotFound(t, spec.ID)
}

// testFailedStart: a start that fails leaves nothing, and a start with an
// ID in use fails without harming the sandbox that has it.
func (h *harness) testFailedStart(t *testing.T) {
	ns := NewNetns(t)
	tests := []struct {
		name   string
		break_ func(*runtime.Spec)
	}{
		{"missing rootfs", func(s *runtime.Spec) { s.RootfsPath = filepath.Join(t.TempDir(), "missing") }},
		{"unprepared rootfs", func(s *runtime.Spec) { s.RootfsPath = t.TempDir() }},
		{"missing envd", func(s *runtime.Spec) { s.EnvdPath = filepath.Join(t.TempDir(), "missing-envd") }},
		{"missing netns", func(s *runtime.Spec) { s.NetnsPath = "/var/run/netns/aenvt-missing" }},
	}
	for _, tt := range tests {
		bad := h.spec(t, ns)
		tt.break_(&bad)
		if err := h.driver.Start(t.Context(), bad); err == nil {
			h.killAtEnd(t, bad.ID)
			t.Errorf("Start with %s succeeded", tt.name)
			continue
		} else {
			t.Logf("Start with %s: %v", tt.name, err)
		}
		h.wantNotFound(t, bad.ID)
	}

	spec, g := h.start(t)
	dup := h.spec(t, ns)
	dup.ID = spec.ID
	if err := h.driver.Start(t.Context(), dup); err == nil {
		t.Fatal("Start with an ID in use succeeded")
	}
	h.wantState(t, spec.ID, runtime.StateRunning)
	g.mustState(t)
}

// testKillIdempotent: Kill removes a running sandbox, and killing it again,
// or an ID never used, succeeds.
func (h *harness) testKillIdempotent(t *testing.T) {
	spec, g := h.start(t)
	h.timed(t, "Kill", func() error { return h.driver.Kill(t.Context(), spec.ID) })
	h.wantNotFound(t, spec.ID)
	if g.answers(t) {
		t.Error("guest still answers after Kill")
	}
	for _, id := range []string{spec.ID, randomID(t)} {
		if err := h.driver.Kill(t.Context(), id); err != nil {
			t.Errorf("Kill(%s) again: %v", id, err)
		}
	}
	if err := h.driver.Pause(t.Context(), spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Pause(killed) = %v; want ErrNotFound", err)
	}
}

// testCleanup: Cleanup keeps what it is told to and removes everything else;
// a final Cleanup(nil) leaves no process, mount or cgroup behind.
func (h *harness) testCleanup(t *testing.T) {
	kept, kg := h.start(t)
	gone, gg := h.start(t)
	// A paused sandbox must go too.
	if err := h.driver.Pause(t.Context(), gone.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := h.driver.Cleanup(t.Context(), map[string]bool{kept.ID: true}); err != nil {
		t.Fatalf("Cleanup(keep one): %v", err)
	}
	h.wantNotFound(t, gone.ID)
	h.wantState(t, kept.ID, runtime.StateRunning)
	kg.mustState(t)
	if gg.answers(t) {
		t.Error("removed sandbox still answers")
	}

	if err := h.driver.Cleanup(t.Context(), nil); err != nil {
		t.Fatalf("Cleanup(nil): %v", err)
	}
	list, err := h.driver.List(t.Context())
	if err != nil || len(list) != 0 {
		t.Errorf("List after Cleanup(nil) = %+v, %v; want empty", list, err)
	}
	if left := leftovers(t, h.env); len(left) > 0 {
		t.Errorf("left after Cleanup(nil):\n%v", left)
	}
}

// testFilesystemSnapshot: a sandbox's files exported without its memory
// boot a fresh sandbox that has the files (a new nonce: a new kernel and
// init) and not the old processes' state.
func (h *harness) testFilesystemSnapshot(t *testing.T) {
	if !h.driver.Capabilities().FilesystemSnapshot {
		t.Skip("the driver declares no filesystem snapshots")
	}
	parent, pg := h.start(t)
	pg.writeFile(t, "/tmp/kept", "files-only")
	before := pg.mustState(t)
	file := filepath.Join(t.TempDir(), "rootfs-upper.tar")
	h.timed(t, "ExportRootfs", func() error { return h.driver.ExportRootfs(t.Context(), parent.ID, file) })
	h.wantState(t, parent.ID, runtime.StateRunning)

	ns := NewNetns(t)
	spec := h.spec(t, ns)
	spec.RootfsUpper = file
	h.timed(t, "Start over a saved filesystem", func() error { return h.driver.Start(t.Context(), spec) })
	h.killAtEnd(t, spec.ID)
	g := newGuest(ns.GuestAddr)
	g.waitReady(t, 10*time.Second)
	if got, ok := g.readFile(t, "/tmp/kept"); !ok || got != "files-only" {
		t.Errorf("booted over the saved filesystem: /tmp/kept = %q, %v", got, ok)
	}
	if after := g.mustState(t); after.Nonce == before.Nonce {
		t.Errorf("the new sandbox continues the old one's memory (nonce %s): want a fresh boot", after.Nonce)
	}
}

// testPrepared, for drivers that prepare sandboxes ahead: a prepared
// sandbox runs nothing and is not running; started, it boots as Start
// would; restored into, it continues the image as Restore would; a
// failed restore removes it; Cleanup removes an unused one.
func (h *harness) testPrepared(t *testing.T) {
	prep, ok := h.driver.(runtime.Preparer)
	if !ok {
		t.Skip("the driver does not prepare sandboxes")
	}
	prepare := func(name string) (runtime.Spec, *guest) {
		ns := NewNetns(t)
		spec := h.spec(t, ns)
		// Made as a pool makes them, at background priority; Foreground
		// comes before they are used.
		spec.Background = true
		h.timed(t, name, func() error { return prep.Prepare(t.Context(), spec) })
		h.killAtEnd(t, spec.ID)
		if st, err := h.driver.State(t.Context(), spec.ID); err != nil || st == runtime.StateRunning {
			t.Fatalf("State of a prepared sandbox = %q, %v; want not running", st, err)
		}
		return spec, newGuest(ns.GuestAddr)
	}

	booted, bg := prepare("Prepare")
	h.timed(t, "Foreground", func() error { return prep.Foreground(t.Context(), booted.ID) })
	h.timed(t, "StartPrepared", func() error { return prep.StartPrepared(t.Context(), booted.ID) })
	h.record("StartPrepared→envd answers", bg.waitReady(t, 10*time.Second))
	h.wantState(t, booted.ID, runtime.StateRunning)
	if st := bg.mustState(t); st.Hostname != booted.Hostname {
		t.Errorf("started guest hostname %q; want %q", st.Hostname, booted.Hostname)
	}
	bg.writeFile(t, "/tmp/before", "from-parent")
	before := bg.mustState(t)
	image := filepath.Join(t.TempDir(), "image")
	h.timed(t, "Checkpoint(leaveRunning)", func() error { return h.driver.Checkpoint(t.Context(), booted.ID, image, true) })

	restored, rg := prepare("Prepare")
	h.timed(t, "Foreground", func() error { return prep.Foreground(t.Context(), restored.ID) })
	h.timed(t, "RestorePrepared", func() error { return prep.RestorePrepared(t.Context(), restored.ID, image) })
	h.record("RestorePrepared→envd answers", rg.waitReady(t, 10*time.Second))
	child := rg.mustState(t)
	if child.Nonce != before.Nonce || child.Counter < before.Counter {
		t.Errorf("restored guest = %+v; want nonce %s and counter >= %d", child, before.Nonce, before.Counter)
	}
	if got, ok := rg.readFile(t, "/tmp/before"); !ok || got != "from-parent" {
		t.Errorf("restored /tmp/before = %q, %v; want the parent's file", got, ok)
	}
	wantIndependent(t, bg, rg)

	failed, _ := prepare("Prepare")
	if err := prep.RestorePrepared(t.Context(), failed.ID, filepath.Join(t.TempDir(), "no-image")); err == nil {
		t.Fatal("RestorePrepared of a missing image succeeded")
	}
	h.wantNotFound(t, failed.ID)

	unused, _ := prepare("Prepare")
	if err := h.driver.Cleanup(t.Context(), map[string]bool{booted.ID: true, restored.ID: true}); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	h.wantNotFound(t, unused.ID)
	rg.mustState(t)
}
