package runtimetest

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// Contract is the part of the conformance suite that looks only at what a
// driver says of its sandboxes, never inside them: states and listings,
// kills that are idempotent, wrong-state calls refused without effect,
// checkpoints, restores and prepared sandboxes. Run runs it against a
// real driver; the in-memory fake the lifecycle tests use runs it too,
// without root, so that the fake cannot drift from the real driver on
// what the lifecycle relies on.
//
// newSpec returns a spec for a new sandbox (a real driver's needs a
// network namespace and a root filesystem; a fake's, an ID).
func Contract(t *testing.T, d runtime.Driver, newSpec func(t *testing.T) runtime.Spec) {
	c := &contract{d: d, newSpec: newSpec}
	t.Run("UnknownID", c.unknownID)
	t.Run("StartAndKill", c.startAndKill)
	t.Run("BadSpecLeavesNothing", c.badSpec)
	caps := d.Capabilities()
	if caps.Pause {
		t.Run("PauseResume", c.pauseResume)
	}
	if caps.Checkpoint {
		t.Run("CheckpointRestore", c.checkpointRestore)
	}
	if caps.FilesystemSnapshot {
		t.Run("ExportRootfs", c.exportRootfs)
	}
	if _, ok := d.(runtime.Preparer); ok {
		t.Run("Prepared", c.prepared)
	}
	t.Run("Cleanup", c.cleanup)
}

type contract struct {
	d       runtime.Driver
	newSpec func(t *testing.T) runtime.Spec
}

// start starts a sandbox that is killed when the test ends.
func (c *contract) start(t *testing.T) runtime.Spec {
	t.Helper()
	spec := c.newSpec(t)
	if err := c.d.Start(t.Context(), spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	c.killAtEnd(t, spec.ID)
	return spec
}

func (c *contract) killAtEnd(t *testing.T, id string) {
	t.Cleanup(func() {
		if err := c.d.Kill(t.Context(), id); err != nil {
			t.Errorf("Kill %s: %v", id, err)
		}
	})
}

// want checks the state of id, as State and as List say it.
func (c *contract) want(t *testing.T, id string, want runtime.State) {
	t.Helper()
	st, err := c.d.State(t.Context(), id)
	if err != nil || st != want {
		t.Errorf("State(%s) = %q, %v; want %s", id, st, err, want)
	}
	if got := c.listed(t, id); got != want {
		t.Errorf("List has %s as %q; want %s", id, got, want)
	}
}

// wantGone checks that the driver knows nothing of id.
func (c *contract) wantGone(t *testing.T, id string) {
	t.Helper()
	if st, err := c.d.State(t.Context(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("State(%s) of a removed sandbox = %q, %v; want ErrNotFound", id, st, err)
	}
	if got := c.listed(t, id); got != "" {
		t.Errorf("List still has %s (%s)", id, got)
	}
}

// listed is the state List gives id, "" when it is not listed.
func (c *contract) listed(t *testing.T, id string) runtime.State {
	t.Helper()
	list, err := c.d.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if i := slices.IndexFunc(list, func(in runtime.Instance) bool { return in.ID == id }); i >= 0 {
		return list[i].State
	}
	return ""
}

func (c *contract) unknownID(t *testing.T) {
	id := randomID(t)
	if st, err := c.d.State(t.Context(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("State(unknown) = %q, %v; want ErrNotFound", st, err)
	}
	if _, err := c.d.Stats(t.Context(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats(unknown) = %v; want ErrNotFound", err)
	}
	if err := c.d.Kill(t.Context(), id); err != nil {
		t.Errorf("Kill(unknown) = %v; want nil", err)
	}
}

func (c *contract) startAndKill(t *testing.T) {
	spec := c.newSpec(t)
	if err := c.d.Start(t.Context(), spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	c.want(t, spec.ID, runtime.StateRunning)
	if _, err := c.d.Stats(t.Context(), spec.ID); err != nil {
		t.Errorf("Stats: %v", err)
	}
	for i := range 2 {
		if err := c.d.Kill(t.Context(), spec.ID); err != nil {
			t.Fatalf("Kill #%d: %v", i+1, err)
		}
		c.wantGone(t, spec.ID)
	}
}

// badSpec: a start that fails (here, an ID the driver must refuse)
// leaves nothing listed.
func (c *contract) badSpec(t *testing.T) {
	spec := c.newSpec(t)
	spec.ID = "Not/An-ID"
	before, err := c.d.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.d.Start(t.Context(), spec); err == nil {
		c.killAtEnd(t, spec.ID)
		t.Fatalf("Start with ID %q succeeded", spec.ID)
	}
	after, err := c.d.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("a failed start left instances: %v, before %v", after, before)
	}
}

// pauseResume: pause and resume move between running and paused; a pause
// of a paused sandbox and a resume of a running one are refused and
// change nothing.
func (c *contract) pauseResume(t *testing.T) {
	spec := c.start(t)
	if err := c.d.Pause(t.Context(), spec.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	c.want(t, spec.ID, runtime.StatePaused)
	if err := c.d.Pause(t.Context(), spec.ID); err == nil {
		t.Error("Pause of a paused sandbox succeeded")
	}
	c.want(t, spec.ID, runtime.StatePaused)
	if err := c.d.Resume(t.Context(), spec.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	c.want(t, spec.ID, runtime.StateRunning)
	if err := c.d.Resume(t.Context(), spec.ID); err == nil {
		t.Error("Resume of a running sandbox succeeded")
	}
	c.want(t, spec.ID, runtime.StateRunning)
	for _, call := range []func() error{
		func() error { return c.d.Pause(t.Context(), randomID(t)) },
		func() error { return c.d.Resume(t.Context(), randomID(t)) },
	} {
		if err := call(); err == nil {
			t.Error("Pause or Resume of an unknown sandbox succeeded")
		}
	}
}

// checkpointRestore: a checkpoint that leaves the sandbox running keeps
// it running; a restore (twice, when the driver forks) makes new
// sandboxes beside it; a checkpoint that does not leave it running leaves
// it stopped, for Kill to remove.
func (c *contract) checkpointRestore(t *testing.T) {
	spec := c.start(t)
	image := filepath.Join(t.TempDir(), "image")
	if err := c.d.Checkpoint(t.Context(), spec.ID, image, true); err != nil {
		t.Fatalf("Checkpoint (leave running): %v", err)
	}
	c.want(t, spec.ID, runtime.StateRunning)

	copies := 1
	if c.d.Capabilities().Fork {
		copies = 2
	}
	for range copies {
		restored := c.newSpec(t)
		if err := c.d.Restore(t.Context(), restored, image); err != nil {
			t.Fatalf("Restore: %v", err)
		}
		c.killAtEnd(t, restored.ID)
		c.want(t, restored.ID, runtime.StateRunning)
	}
	if err := c.d.Restore(t.Context(), c.newSpec(t), filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("Restore from a missing image succeeded")
	}

	stop := filepath.Join(t.TempDir(), "image")
	if err := c.d.Checkpoint(t.Context(), spec.ID, stop, false); err != nil {
		t.Fatalf("Checkpoint (stop): %v", err)
	}
	c.want(t, spec.ID, runtime.StateStopped)
	if err := c.d.Kill(t.Context(), spec.ID); err != nil {
		t.Fatalf("Kill of a checkpointed sandbox: %v", err)
	}
	c.wantGone(t, spec.ID)
}

// exportRootfs: the export of a running sandbox's files leaves it
// running, and a sandbox boots over them.
func (c *contract) exportRootfs(t *testing.T) {
	spec := c.start(t)
	file := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := c.d.ExportRootfs(t.Context(), spec.ID, file); err != nil {
		t.Fatalf("ExportRootfs: %v", err)
	}
	c.want(t, spec.ID, runtime.StateRunning)
	if info, err := os.Stat(file); err != nil || info.Size() == 0 {
		t.Fatalf("exported files: %v", err)
	}
	over := c.newSpec(t)
	over.RootfsUpper = file
	if err := c.d.Start(t.Context(), over); err != nil {
		t.Fatalf("Start over exported files: %v", err)
	}
	c.killAtEnd(t, over.ID)
	c.want(t, over.ID, runtime.StateRunning)
	if err := c.d.ExportRootfs(t.Context(), randomID(t), file); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("ExportRootfs(unknown) = %v; want ErrNotFound", err)
	}
}

// prepared: a prepared sandbox is listed but runs nothing (stopped) until
// it is started or restored into; then it runs; a start of a sandbox that
// was not prepared fails, and removes it.
func (c *contract) prepared(t *testing.T) {
	p := c.d.(runtime.Preparer)
	spec := c.newSpec(t)
	spec.Background = true
	if err := p.Prepare(t.Context(), spec); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	c.killAtEnd(t, spec.ID)
	if got := c.listed(t, spec.ID); got != runtime.StateStopped {
		t.Errorf("List has a prepared sandbox as %q; want %s", got, runtime.StateStopped)
	}
	if err := p.Foreground(t.Context(), spec.ID); err != nil {
		t.Errorf("Foreground: %v", err)
	}
	if err := p.StartPrepared(t.Context(), spec.ID); err != nil {
		t.Fatalf("StartPrepared: %v", err)
	}
	c.want(t, spec.ID, runtime.StateRunning)
	if !c.d.Capabilities().Checkpoint {
		return
	}
	// A sandbox started from a prepared one is like any other: the pools
	// hand them out, and they are paused to disk and forked.
	image := filepath.Join(t.TempDir(), "image")
	if err := c.d.Checkpoint(t.Context(), spec.ID, image, true); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	into := c.newSpec(t)
	if err := p.Prepare(t.Context(), into); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	c.killAtEnd(t, into.ID)
	if err := p.RestorePrepared(t.Context(), into.ID, image); err != nil {
		t.Fatalf("RestorePrepared: %v", err)
	}
	c.want(t, into.ID, runtime.StateRunning)

	// As the interface says, a StartPrepared that fails (here, of a
	// sandbox that was not prepared) removes the sandbox.
	if err := p.StartPrepared(t.Context(), into.ID); err == nil {
		t.Error("StartPrepared of a running sandbox succeeded")
	}
	c.wantGone(t, into.ID)
}

// cleanup: Cleanup removes every sandbox but those kept.
func (c *contract) cleanup(t *testing.T) {
	keep, drop := c.start(t), c.start(t)
	if err := c.d.Cleanup(t.Context(), map[string]bool{keep.ID: true}); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	c.want(t, keep.ID, runtime.StateRunning)
	c.wantGone(t, drop.ID)
}
