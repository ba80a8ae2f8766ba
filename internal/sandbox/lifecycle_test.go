package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

func createReq() node.CreateRequest { return node.CreateRequest{Timeout: time.Minute} }

// TestTransitionTable pins the state machine: which operation may start
// from which phase.
func TestTransitionTable(t *testing.T) {
	phases := []phase{phaseStarting, phaseRunning, phasePaused, phaseOnDisk, phaseGone}
	want := map[op]string{ // the phases each op accepts, in the order above
		opPause:         ".R...",
		opSpill:         "..P..",
		opResume:        "..PD.",
		opSnapshot:      ".RPD.",
		opFork:          ".RPD.",
		opSetTimeout:    ".R...",
		opUpdateNetwork: ".RPD.",
		opFinish:        "S....",
	}
	letters := "SRPDG"
	n := 0
	for o, accept := range want {
		for i, p := range phases {
			err := allowed(o, "x", p)
			ok := accept[i] == letters[i]
			n++
			switch {
			case ok && err != nil:
				t.Errorf("%s from %s: refused: %v", o, p, err)
			case !ok && p == phaseGone && !errors.Is(err, node.ErrNotFound):
				t.Errorf("%s from gone: %v, want not found", o, err)
			case !ok && p != phaseGone && !errors.Is(err, node.ErrConflict):
				t.Errorf("%s from %s: %v, want conflict", o, p, err)
			}
		}
	}
	if len(want) != len(transitions) {
		t.Errorf("table covers %d operations, transitions has %d", len(want), len(transitions))
	}
	t.Logf("%d (operation, phase) pairs checked", n)
}

func TestCreateAndKill(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	if sb.State != store.StateRunning || w.record(sb.ID).State != store.StateRunning {
		t.Fatalf("state %s, record %+v", sb.State, w.record(sb.ID))
	}
	if w.driver.state(sb.ID) != runtime.StateRunning {
		t.Fatalf("instance %s", w.driver.state(sb.ID))
	}
	if err := w.m.Kill(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	w.empty()
	if err := w.m.Kill(context.Background(), sb.ID); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
}

// A kill whose caller has gone (a closed browser tab, a client's timeout)
// still finishes: the instance and its record go together.
func TestKillFinishesWhenItsCallerGoes(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	w.empty()
}

// Every step of create can fail; none may leave anything behind.
func TestCreateFailureLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		step string
		err  error
		want error
	}{
		{"acquire", errInjected, errInjected},
		{"policy", errInjected, errInjected},
		{"store.create", errInjected, errInjected},
		{"store.create", errDiskFull, node.ErrInsufficientStorage},
		{"start", errInjected, errInjected},
		{"init", errInjected, nil},
		{"store.update:running", errInjected, errInjected},
		{"store.update:running", errDiskFull, node.ErrInsufficientStorage},
	} {
		t.Run(tc.step, func(t *testing.T) {
			w := newWorld(t)
			w.faults.set(tc.step, tc.err)
			_, err := w.m.Create(context.Background(), createReq())
			if err == nil {
				t.Fatal("create succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			w.empty()
		})
	}
}

// A record the failed create could not delete (the disk is full) is
// hidden at once and removed when the store recovers.
func TestCreateFailureWithUndeletableRecord(t *testing.T) {
	w := newWorld(t)
	w.faults.set("start", errInjected)
	w.faults.set("store.delete", errDiskFull)
	if _, err := w.m.Create(context.Background(), createReq()); err == nil {
		t.Fatal("create succeeded")
	}
	list, err := w.m.List(context.Background(), store.SandboxFilter{})
	if err != nil || len(list) != 0 {
		t.Fatalf("listed %d records (%v)", len(list), err)
	}
	w.faults.set("store.delete", nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, _ := w.store.Store.ListSandboxes(context.Background(), store.SandboxFilter{})
		if len(all) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("orphan record never removed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.empty()
}

func TestPauseResume(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	ctx := context.Background()
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if w.driver.state(sb.ID) != runtime.StatePaused || w.record(sb.ID).State != store.StatePaused {
		t.Fatalf("after pause: instance %s, record %s", w.driver.state(sb.ID), w.record(sb.ID).State)
	}
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{}); !errors.Is(err, node.ErrConflict) {
		t.Fatalf("pause of a paused sandbox: %v", err)
	}
	if err := w.m.SetTimeout(ctx, sb.ID, time.Minute); !errors.Is(err, node.ErrConflict) {
		t.Fatalf("timeout of a paused sandbox: %v", err)
	}
	got, was, err := w.m.Resume(ctx, sb.ID, 0, false)
	if err != nil || !was || got.State != store.StateRunning {
		t.Fatalf("resume: %v %v %+v", err, was, got)
	}
	if _, was, err := w.m.Resume(ctx, sb.ID, 0, false); err != nil || was {
		t.Fatalf("resume of a running sandbox: was paused %v, %v", was, err)
	}
}

// A failed pause or resume leaves the sandbox exactly as it was: the
// instance and the record agree.
func TestPauseResumeFailuresUndo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prepare  func(w *world, id string)
		step     string
		err      error
		act      func(w *world, id string) error
		instance runtime.State
		record   store.SandboxState
		want     error
	}{
		{"pause: runtime fails", nil, "pause", errInjected,
			func(w *world, id string) error { return w.m.Pause(context.Background(), id, node.PauseOptions{}) },
			runtime.StateRunning, store.StateRunning, errInjected},
		{"pause: record fails", nil, "store.update:paused", errDiskFull,
			func(w *world, id string) error { return w.m.Pause(context.Background(), id, node.PauseOptions{}) },
			runtime.StateRunning, store.StateRunning, node.ErrInsufficientStorage},
		{"resume: runtime fails", pause, "resume", errInjected,
			func(w *world, id string) error {
				_, _, err := w.m.Resume(context.Background(), id, 0, false)
				return err
			},
			runtime.StatePaused, store.StatePaused, errInjected},
		{"resume: record fails", pause, "store.update:running", errDiskFull,
			func(w *world, id string) error {
				_, _, err := w.m.Resume(context.Background(), id, 0, false)
				return err
			},
			runtime.StatePaused, store.StatePaused, node.ErrInsufficientStorage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			sb := w.create()
			if tc.prepare != nil {
				tc.prepare(w, sb.ID)
			}
			w.faults.set(tc.step, tc.err)
			if err := tc.act(w, sb.ID); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if got := w.driver.state(sb.ID); got != tc.instance {
				t.Errorf("instance %s, want %s", got, tc.instance)
			}
			if got := w.record(sb.ID).State; got != tc.record {
				t.Errorf("record %s, want %s", got, tc.record)
			}
			// And it still works afterwards.
			w.faults.set(tc.step, nil)
			if tc.record == store.StatePaused {
				if _, _, err := w.m.Resume(context.Background(), sb.ID, 0, false); err != nil {
					t.Fatalf("resume afterwards: %v", err)
				}
			} else if err := w.m.Pause(context.Background(), sb.ID, node.PauseOptions{}); err != nil {
				t.Fatalf("pause afterwards: %v", err)
			}
		})
	}
}

func pause(w *world, id string) {
	if err := w.m.Pause(context.Background(), id, node.PauseOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func TestPauseToDiskAndBack(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	ctx := context.Background()
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{ToDisk: true}); err != nil {
		t.Fatal(err)
	}
	rec := w.record(sb.ID)
	if rec.ImageDir == "" || rec.SlotIndex != -1 || !imageComplete(rec.ImageDir) {
		t.Fatalf("record %+v", rec)
	}
	w.settle(0)
	if len(w.driver.ids()) != 0 {
		t.Fatalf("instance kept after spill: %v", w.driver.ids())
	}
	if _, was, err := w.m.Resume(ctx, sb.ID, 0, false); err != nil || !was {
		t.Fatalf("resume: %v", err)
	}
	if rec := w.record(sb.ID); rec.ImageDir != "" || rec.State != store.StateRunning {
		t.Fatalf("record after resume %+v", rec)
	}
	if imgs := w.images(); len(imgs) != 0 {
		t.Fatalf("image kept after resume: %v", imgs)
	}
	if err := w.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	w.empty()
}

// A pause without memory keeps the files only, and the resume boots a
// fresh sandbox over them; such a sandbox cannot be forked until resumed.
func TestPauseWithoutMemory(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sb := w.create()
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{DropMemory: true}); err != nil {
		t.Fatal(err)
	}
	rec := w.record(sb.ID)
	if !filesystemOnly(rec.ImageDir) || !rec.RebootOnResume || imageBytes(rec.ImageDir) != 0 {
		t.Fatalf("record %+v: want a filesystem-only image", rec)
	}
	w.settle(0)
	if _, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: sb.ID, Count: 1}); !errors.Is(err, node.ErrConflict) {
		t.Fatalf("fork of a sandbox paused without memory: %v", err)
	}
	starts := w.faults.count("start")
	got, was, err := w.m.Resume(ctx, sb.ID, 0, false)
	if err != nil || !was || got.RebootOnResume || got.ImageDir != "" {
		t.Fatalf("resume: %v %v %+v", err, was, got)
	}
	if w.faults.count("start") != starts+1 || w.faults.count("restore") != 0 {
		t.Fatalf("resume did not boot afresh (starts %d→%d, restores %d)", starts, w.faults.count("start"), w.faults.count("restore"))
	}
	if imgs := w.images(); len(imgs) != 0 {
		t.Fatalf("image kept after resume: %v", imgs)
	}
	// A failed export leaves it as it was: running (see
	// TestFailedPauseToDiskLeavesSandboxRunning).
	sb2 := w.create()
	w.faults.set("export", errInjected)
	if err := w.m.Pause(ctx, sb2.ID, node.PauseOptions{DropMemory: true}); !errors.Is(err, errInjected) {
		t.Fatalf("pause with a failing export: %v", err)
	}
	if w.driver.state(sb2.ID) != runtime.StateRunning || w.record(sb2.ID).ImageDir != "" {
		t.Fatalf("after a failed export: instance %s, record %+v", w.driver.state(sb2.ID), w.record(sb2.ID))
	}
}

// A spill that fails at any step (a full disk, a failing record) leaves the
// sandbox paused in memory and resumable, never half-way.
func TestSpillFailureKeepsSandbox(t *testing.T) {
	for _, tc := range []struct {
		step string
		err  error
		want error
	}{
		{"checkpoint", errInjected, errInjected},
		{"store.update:paused", errDiskFull, node.ErrInsufficientStorage},
	} {
		t.Run(tc.step, func(t *testing.T) {
			w := newWorld(t)
			sb := w.create()
			pause(w, sb.ID)
			w.faults.set(tc.step, tc.err)
			// Paused already: spill as the timer would.
			e := w.m.entry(sb.ID)
			e.mu.Lock()
			err := w.m.spillLocked(context.Background(), e, false)
			e.mu.Unlock()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if w.driver.state(sb.ID) != runtime.StatePaused {
				t.Fatalf("instance %s", w.driver.state(sb.ID))
			}
			if rec := w.record(sb.ID); rec.ImageDir != "" || rec.State != store.StatePaused {
				t.Fatalf("record %+v", rec)
			}
			if imgs := w.images(); len(imgs) != 0 {
				t.Fatalf("partial image kept: %v", imgs)
			}
			w.faults.set(tc.step, nil)
			if _, _, err := w.m.Resume(context.Background(), sb.ID, 0, false); err != nil {
				t.Fatalf("resume: %v", err)
			}
		})
	}
}

// A crash in the middle of a spill (after the checkpoint, before the
// record) loses nothing: the instance is still paused in memory, because
// the checkpoint leaves it running until the image is recorded.
func TestCrashDuringSpillKeepsSandbox(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	pause(w, sb.ID)
	w.faults.setHang("store.update:paused", true)
	done := make(chan error, 1)
	e := w.m.entry(sb.ID)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		done <- w.m.spillLocked(ctx, e, false)
	}()
	waitFor(t, func() bool { return w.faults.count("store.update:paused") >= 2 })
	if w.driver.state(sb.ID) != runtime.StatePaused {
		t.Fatalf("instance during spill: %s", w.driver.state(sb.ID))
	}
	cancel() // the process dies here
	<-done
	w.faults.setHang("store.update:paused", false)
	w.crash()
	rec := w.record(sb.ID)
	if rec == nil || rec.State != store.StatePaused {
		t.Fatalf("record after restart: %+v", rec)
	}
	if _, was, err := w.m.Resume(context.Background(), sb.ID, 0, false); err != nil || !was {
		t.Fatalf("resume after restart: %v", err)
	}
	if w.driver.state(sb.ID) != runtime.StateRunning {
		t.Fatalf("instance %s", w.driver.state(sb.ID))
	}
}

// A failed resume from disk keeps the image and the sandbox on disk, and
// gives back the slot and instance it made.
func TestResumeFromDiskFailureKeepsImage(t *testing.T) {
	for _, tc := range []struct {
		step string
		err  error
	}{
		{"acquire", errInjected},
		{"restore", errInjected},
		{"init", errInjected},
		{"store.update:running", errDiskFull},
	} {
		t.Run(tc.step, func(t *testing.T) {
			w := newWorld(t)
			sb := w.create()
			if err := w.m.Pause(context.Background(), sb.ID, node.PauseOptions{ToDisk: true}); err != nil {
				t.Fatal(err)
			}
			w.settle(0)
			w.faults.set(tc.step, tc.err)
			if _, _, err := w.m.Resume(context.Background(), sb.ID, 0, false); err == nil {
				t.Fatal("resume succeeded")
			}
			w.settle(0)
			if ids := w.driver.ids(); len(ids) != 0 {
				t.Fatalf("instances left: %v", ids)
			}
			rec := w.record(sb.ID)
			if rec.State != store.StatePaused || rec.ImageDir == "" || !imageComplete(rec.ImageDir) {
				t.Fatalf("record %+v", rec)
			}
			w.faults.set(tc.step, nil)
			if _, _, err := w.m.Resume(context.Background(), sb.ID, 0, false); err != nil {
				t.Fatalf("resume afterwards: %v", err)
			}
		})
	}
}

func TestSnapshotAndCreateFromIt(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	ctx := context.Background()
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	child, err := w.m.Create(ctx, node.CreateRequest{Template: snap.ID})
	if err != nil {
		t.Fatalf("create from snapshot: %v", err)
	}
	if child.TemplateID != snap.ID || w.driver.state(child.ID) != runtime.StateRunning {
		t.Fatalf("child %+v", child)
	}
	// A failed record write removes the image it took.
	w.faults.set("store.putTemplate", errDiskFull)
	if _, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Kind: store.KindSnapshot}); !errors.Is(err, node.ErrInsufficientStorage) {
		t.Fatalf("snapshot on a full disk: %v", err)
	}
	if imgs := w.images(); len(imgs) != 1 {
		t.Fatalf("images %v, want only the first snapshot's", imgs)
	}
}

// Deleting a snapshot must not delete the root filesystem it shares with
// its template; a template still in use cannot be deleted.
func TestDeleteSnapshotKeepsTemplateRootfs(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// An image template owning its rootfs under the templates dir.
	rootfs := filepath.Join(w.dir, "templates", "img1", "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	img := &store.Template{ID: "img10000000000000000", Name: "img1", RootfsPath: rootfs, Kind: store.KindRootfs, CreatedAt: time.Now()}
	if err := w.store.PutTemplate(ctx, img); err != nil {
		t.Fatal(err)
	}
	sb, err := w.m.Create(ctx, node.CreateRequest{Template: "img1"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Name: "snap1", Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	err = w.m.DeleteTemplate(ctx, "img1")
	if !errors.Is(err, node.ErrConflict) || !strings.Contains(err.Error(), "snapshot snap1") || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("delete of a template in use: %v", err)
	}
	if err := w.m.DeleteTemplate(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("deleting the snapshot removed the template's rootfs: %v", err)
	}
	if _, err := os.Stat(snap.ImageDir); !os.IsNotExist(err) {
		t.Fatalf("snapshot image kept: %v", err)
	}
	if err := w.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.m.DeleteTemplate(ctx, "img1"); err != nil {
		t.Fatalf("delete of an unused template: %v", err)
	}
	if _, err := os.Stat(rootfs); !os.IsNotExist(err) {
		t.Fatalf("template rootfs kept: %v", err)
	}
}

// A snapshot deleted while a sandbox is being restored from it keeps its
// image until that restore is done.
func TestDeleteSnapshotDuringRestore(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sb := w.create()
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: sb.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	w.faults.setHang("init", true)
	created := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := w.m.Create(rctx, node.CreateRequest{Template: snap.ID})
		created <- err
	}()
	waitFor(t, func() bool { return w.faults.count("init") >= 2 })
	if err := w.m.DeleteTemplate(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if !imageComplete(snap.ImageDir) {
		t.Fatal("image removed under a restore")
	}
	cancel()
	<-created
	if _, err := os.Stat(snap.ImageDir); !os.IsNotExist(err) {
		t.Fatalf("image kept after the restore ended: %v", err)
	}
}

func TestFork(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	parent := w.create()
	res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{parent.ID: true}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("child: %v", r.Err)
		}
		if ids[r.Sandbox.ID] || r.Sandbox.AccessToken == parent.AccessToken || r.Sandbox.State != store.StateRunning {
			t.Fatalf("child %+v", r.Sandbox)
		}
		ids[r.Sandbox.ID] = true
		if w.record(r.Sandbox.ID).State != store.StateRunning {
			t.Fatal("child not recorded running")
		}
	}
	if imgs := w.images(); len(imgs) != 0 {
		t.Fatalf("fork image kept: %v", imgs)
	}
}

// One child failing does not fail the others.
func TestForkPartialFailure(t *testing.T) {
	w := newWorld(t)
	parent := w.create()
	w.slots.n = 3 // parent + 2 children fit; capacity is checked first
	res, err := w.m.Fork(context.Background(), node.ForkRequest{SandboxID: parent.ID, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	okCount := 0
	for _, r := range res {
		if r.Err == nil {
			okCount++
		}
	}
	if okCount != 2 {
		t.Fatalf("%d children", okCount)
	}
	if _, err := w.m.Fork(context.Background(), node.ForkRequest{SandboxID: parent.ID, Count: 2}); !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("fork past capacity: %v", err)
	}
	// Children whose restore fails are reported, the others made.
	w.slots.n = 16
	failFirst := failFirstInit(w)
	res, err = w.m.Fork(context.Background(), node.ForkRequest{SandboxID: parent.ID, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range res {
		if r.Err != nil {
			failed++
		}
	}
	if failed != 1 || !failFirst() {
		t.Fatalf("%d children failed, want 1", failed)
	}
}

// failFirstInit makes envd's /init fail for the first sandbox that
// reaches it, and reports whether it did.
func failFirstInit(w *world) func() bool {
	var fired atomic.Bool
	w.driver.mu.Lock()
	w.driver.onInit = func(id string) {
		if fired.CompareAndSwap(false, true) {
			w.faults.set("init:"+id, errInjected)
		}
	}
	w.driver.mu.Unlock()
	return fired.Load
}

// A fork whose request is cancelled, or whose answer a crash cuts, leaves
// no children nobody knows of.
func TestForkCancelledOrCrashedLeavesNoChildren(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		w := newWorld(t)
		parent := w.create()
		ctx, cancel := context.WithCancel(context.Background())
		w.faults.setHang("init", true)
		done := make(chan []node.ForkResult, 1)
		go func() {
			res, _ := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 3})
			done <- res
		}()
		waitFor(t, func() bool { return w.faults.count("init") >= 3 })
		cancel()
		res := <-done
		for _, r := range res {
			if r.Err == nil {
				t.Fatalf("child %s made by a cancelled fork", r.Sandbox.ID)
			}
		}
		w.faults.setHang("init", false)
		w.settle(1)
		if ids := w.driver.ids(); len(ids) != 1 {
			t.Fatalf("instances: %v", ids)
		}
	})
	t.Run("crash before the answer", func(t *testing.T) {
		w := newWorld(t)
		parent := w.create()
		// Children are up; the process dies while recording the first one
		// running.
		w.faults.setHang("store.update:running", true)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 3})
			close(done)
		}()
		waitFor(t, func() bool { return w.faults.count("store.update:running") >= 1 })
		cancel()
		<-done
		w.faults.setHang("store.update:running", false)
		w.crash()
		all, _ := w.store.Store.ListSandboxes(context.Background(), store.SandboxFilter{})
		if len(all) != 1 || all[0].ID != parent.ID {
			t.Fatalf("records after restart: %d", len(all))
		}
		if ids := w.driver.ids(); len(ids) != 1 {
			t.Fatalf("instances after restart: %v", ids)
		}
	})
}

// Reads never wait for a lifecycle operation: a fork whose checkpoint
// hangs holds the sandbox's lock, and traffic still resolves.
func TestReadsDoNotWaitForLifecycle(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	w.faults.setHang("checkpoint", true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.m.Fork(ctx, node.ForkRequest{SandboxID: sb.ID, Count: 1})
	waitFor(t, func() bool { return w.faults.count("checkpoint") >= 1 })
	start := time.Now()
	tgt, err := w.m.Reach(context.Background(), sb.ID, 8080)
	if err != nil {
		t.Fatal(err)
	}
	tgt.Release()
	if _, ok := w.m.SandboxByToken(func(tok string) bool { return tok == sb.AccessToken }); !ok {
		t.Fatal("token lookup failed")
	}
	if _, err := w.m.Stats(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.m.NetworkCounters(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("reads took %s behind a hung fork", d)
	}
	// A kill interrupts the hung operation rather than waiting for it.
	killed := make(chan error, 1)
	go func() { killed <- w.m.Kill(context.Background(), sb.ID) }()
	select {
	case err := <-killed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kill waited for a hung checkpoint")
	}
}

// Calls in flight end the moment their sandbox stops, and say why.
func TestCallsEndWhenSandboxStops(t *testing.T) {
	for _, tc := range []struct {
		why  string
		stop func(w *world, id string)
	}{
		{"was killed", func(w *world, id string) { w.m.Kill(context.Background(), id) }},
		{"was paused", func(w *world, id string) { pause(w, id) }},
		{"reached its deadline and was killed", func(w *world, id string) {
			w.m.SetTimeout(context.Background(), id, time.Millisecond)
		}},
		{"died", func(w *world, id string) {
			w.driver.mu.Lock()
			w.driver.inst[id].state = runtime.StateStopped
			w.driver.mu.Unlock()
			w.m.checkLiveness(context.Background())
		}},
	} {
		t.Run(tc.why, func(t *testing.T) {
			w := newWorld(t)
			sb := w.create()
			tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
			if err != nil {
				t.Fatal(err)
			}
			defer tgt.Release()
			tc.stop(w, sb.ID)
			select {
			case <-tgt.Ctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("call still running after the sandbox stopped")
			}
			cause := context.Cause(tgt.Ctx)
			if !errors.Is(cause, node.ErrStopped) || !strings.Contains(cause.Error(), tc.why) {
				t.Fatalf("cause %v, want %q", cause, tc.why)
			}
		})
	}
}

// A kill cuts the streams of calls in flight; they must know why before
// it does, or they answer with what the cut looked like (a truncated
// envelope) rather than "was killed".
func TestCallsKnowWhyBeforeTheKill(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Release()
	causeAtKill := make(chan error, 1)
	reachAtKill := make(chan error, 1)
	w.driver.onKill = func(string) {
		causeAtKill <- context.Cause(tgt.Ctx)
		// A client whose stream was cut probes the sandbox at once (the
		// E2B SDK asks envd's /health); it must find it gone, not
		// running, or it reports the cut rather than the kill.
		late, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
		if err == nil {
			late.Release()
		}
		reachAtKill <- err
	}
	if err := w.m.Kill(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if cause := <-causeAtKill; !errors.Is(cause, node.ErrStopped) || !strings.Contains(cause.Error(), "was killed") {
		t.Fatalf("cause when the instance was killed: %v, want it to say \"was killed\"", cause)
	}
	if err := <-reachAtKill; !errors.Is(err, node.ErrStopped) {
		t.Fatalf("a call made while the kill runs: %v, want ErrStopped", err)
	}
}

// A kill that fails leaves the sandbox as it was: reachable again.
func TestFailedKillLeavesSandboxReachable(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	w.faults.set("kill", errInjected)
	if err := w.m.Kill(context.Background(), sb.ID); !errors.Is(err, errInjected) {
		t.Fatalf("kill: %v, want the injected fault", err)
	}
	w.faults.set("kill", nil)
	tgt, err := w.m.Reach(context.Background(), sb.ID, node.EnvdPort)
	if err != nil {
		t.Fatalf("reach after a failed kill: %v", err)
	}
	tgt.Release()
}

func TestDeadline(t *testing.T) {
	t.Run("kill", func(t *testing.T) {
		w := newWorld(t)
		sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		w.m.SetTimeout(context.Background(), sb.ID, 10*time.Millisecond)
		// The sandbox leaves the live set, then its record goes.
		waitFor(t, func() bool { return w.m.LiveCount() == 0 && w.record(sb.ID) == nil })
		w.empty()
	})
	t.Run("autopause", func(t *testing.T) {
		w := newWorld(t)
		sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Second, AutoPause: true})
		if err != nil {
			t.Fatal(err)
		}
		w.m.SetTimeout(context.Background(), sb.ID, 10*time.Millisecond)
		// The runtime pauses first, then the record says so.
		waitFor(t, func() bool {
			return w.driver.state(sb.ID) == runtime.StatePaused && w.record(sb.ID).State == store.StatePaused
		})
	})
	t.Run("autopause without memory", func(t *testing.T) {
		w := newWorld(t)
		sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Second, AutoPause: true,
			AutoPauseDropMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		w.m.SetTimeout(context.Background(), sb.ID, 10*time.Millisecond)
		waitFor(t, func() bool {
			rec := w.record(sb.ID)
			return rec.State == store.StatePaused && rec.ImageDir != "" && rec.RebootOnResume
		})
		if dir := w.record(sb.ID).ImageDir; !filesystemOnly(dir) {
			t.Fatalf("image %s holds more than the files", dir)
		}
		w.settle(0)
		if ids := w.driver.ids(); len(ids) != 0 {
			t.Fatalf("memory kept: instances %v", ids)
		}
		got, was, err := w.m.Resume(context.Background(), sb.ID, 0, false)
		if err != nil || !was || got.RebootOnResume {
			t.Fatalf("resume: %v %v %+v", err, was, got)
		}
	})
	// E2B's setTimeout accepts 0: the deadline is now, and the sandbox
	// meets it as it would any other (killed, or paused with autoPause).
	t.Run("timeout 0 kills at once", func(t *testing.T) {
		w := newWorld(t)
		sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.m.SetTimeout(context.Background(), sb.ID, 0); err != nil {
			t.Fatalf("set timeout 0: %v", err)
		}
		waitFor(t, func() bool { return w.m.LiveCount() == 0 && w.record(sb.ID) == nil })
	})
	t.Run("timeout 0 pauses at once with autopause", func(t *testing.T) {
		w := newWorld(t)
		sb, err := w.m.Create(context.Background(), node.CreateRequest{Timeout: time.Hour, AutoPause: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.m.SetTimeout(context.Background(), sb.ID, 0); err != nil {
			t.Fatalf("set timeout 0: %v", err)
		}
		waitFor(t, func() bool { return w.record(sb.ID).State == store.StatePaused })
		// The lifetime a resume without a timeout gets is kept.
		if got := w.record(sb.ID).TimeoutSecs; got != 3600 {
			t.Fatalf("TimeoutSecs %d after timeout 0, want 3600 kept", got)
		}
	})
	t.Run("negative timeout is refused", func(t *testing.T) {
		w := newWorld(t)
		sb := w.create()
		if err := w.m.SetTimeout(context.Background(), sb.ID, -time.Second); !errors.Is(err, node.ErrInvalid) {
			t.Fatalf("set timeout -1s: %v, want ErrInvalid", err)
		}
	})
	t.Run("failing kill backs off", func(t *testing.T) {
		w := newWorld(t)
		sb := w.create()
		w.faults.set("kill", errInjected)
		w.m.SetTimeout(context.Background(), sb.ID, time.Millisecond)
		time.Sleep(1500 * time.Millisecond)
		if n := w.faults.count("kill"); n < 1 || n > 3 {
			t.Fatalf("%d kill attempts in 1.5 s, want 1 to 3 (back-off)", n)
		}
		w.faults.set("kill", nil)
		waitFor(t, func() bool { return w.m.LiveCount() == 0 })
	})
}

// After Shutdown returns, no timer, monitor or release touches the store.
func TestNothingRunsAfterShutdown(t *testing.T) {
	w := newWorld(t, func(c *Config) {
		c.MonitorInterval = time.Millisecond
		c.PauseToDiskAfter = 20 * time.Millisecond
	})
	a := w.create()
	b := w.create()
	w.m.SetTimeout(context.Background(), a.ID, 30*time.Millisecond)
	pause(w, b.ID)
	w.stop()
	w.store.markClosed()
	time.Sleep(200 * time.Millisecond)
	if n := w.store.lateCalls(); n != 0 {
		t.Fatalf("%d store calls after shutdown", n)
	}
}

func TestMonitorMarksDead(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.MonitorInterval = 5 * time.Millisecond })
	a := w.create()
	b := w.create()
	// b's runtime hangs on every call; a dies: a must still be noticed.
	w.faults.setHang("list", true)
	w.faults.setHang("state:"+b.ID, true)
	w.driver.mu.Lock()
	w.driver.inst[a.ID].state = runtime.StateStopped
	w.driver.mu.Unlock()
	waitFor(t, func() bool {
		rec := w.record(a.ID)
		return rec != nil && rec.State == store.StateDead
	})
	if got := w.record(b.ID).State; got != store.StateRunning {
		t.Fatalf("b is %s", got)
	}
	w.faults.setHang("list", false)
	w.faults.setHang("state:"+b.ID, false)
}

// Reconcile after a crash: running and paused sandboxes are adopted,
// half-made ones removed, and a sandbox whose spill completed but was not
// recorded comes back paused on disk.
func TestReconcile(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	run := w.create()
	paused := w.create()
	pause(w, paused.ID)
	spilled := w.create()
	pause(w, spilled.ID)
	// The spill's checkpoint completed, the instance was stopped, and the
	// process died before the record said so (and before its monitor saw
	// the instance exit).
	w.halt()
	if err := w.m.checkpoint(ctx, spilled.ID, w.m.pauseImageDir(spilled.ID), false); err != nil {
		t.Fatal(err)
	}
	w.driver.Kill(ctx, spilled.ID)
	// A half-created sandbox.
	half := &store.Sandbox{ID: NewID(), TemplateID: w.base.ID, State: store.StateStarting, SlotIndex: 9,
		StartedAt: time.Now(), EndAt: time.Now().Add(time.Minute), UpdatedAt: time.Now()}
	w.store.Store.CreateSandbox(ctx, half)
	w.driver.Start(ctx, runtimeSpec(half.ID))
	w.crash()

	if w.record(half.ID) != nil || w.driver.state(half.ID) != "" {
		t.Fatal("half-created sandbox kept")
	}
	if rec := w.record(spilled.ID); rec.State != store.StatePaused || rec.ImageDir == "" {
		t.Fatalf("spilled: %+v", rec)
	}
	for _, id := range []string{run.ID, paused.ID, spilled.ID} {
		if _, _, err := w.m.Resume(ctx, id, 0, false); err != nil {
			t.Fatalf("resume %s: %v", id, err)
		}
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	w.empty()
}

func runtimeSpec(id string) runtime.Spec { return runtime.Spec{ID: id} }

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestInsecureSandbox checks E2B's secure: false: no token in the record,
// none in envd, even when restored from a secure sandbox's snapshot, and
// none in its fork children; a secure sandbox from an insecure one's
// snapshot gets one.
func TestInsecureSandbox(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	envdToken := func(id string) string {
		w.driver.mu.Lock()
		defer w.driver.mu.Unlock()
		return w.driver.inst[id].token
	}
	secure := w.create()
	if secure.AccessToken == "" || envdToken(secure.ID) != secure.AccessToken {
		t.Fatalf("secure sandbox: record token %q, envd token %q", secure.AccessToken, envdToken(secure.ID))
	}
	snap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: secure.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	for _, tpl := range []string{"", snap.ID} {
		sb, err := w.m.Create(ctx, node.CreateRequest{Template: tpl, Timeout: time.Minute, Insecure: true})
		if err != nil {
			t.Fatalf("create insecure from %q: %v", tpl, err)
		}
		if sb.AccessToken != "" || envdToken(sb.ID) != "" {
			t.Fatalf("insecure sandbox from %q: record token %q, envd token %q", tpl, sb.AccessToken, envdToken(sb.ID))
		}
		if id, ok := w.m.SandboxByToken(func(token string) bool { return token == "" }); ok && id == sb.ID {
			t.Fatalf("a signed URL routed to insecure sandbox %s", sb.ID)
		}
	}
	insecure, err := w.m.Create(ctx, node.CreateRequest{Timeout: time.Minute, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	results, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: insecure.ID, Count: 1})
	if err != nil || len(results) != 1 || results[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, results)
	}
	if child := results[0].Sandbox; child.AccessToken != "" || envdToken(child.ID) != "" {
		t.Fatalf("child of an insecure sandbox: record token %q, envd token %q", child.AccessToken, envdToken(child.ID))
	}
	insecureSnap, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: insecure.ID, Kind: store.KindSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := w.m.Create(ctx, node.CreateRequest{Template: insecureSnap.ID, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if sb.AccessToken == "" || envdToken(sb.ID) != sb.AccessToken {
		t.Fatalf("secure sandbox from an insecure snapshot: record token %q, envd token %q", sb.AccessToken, envdToken(sb.ID))
	}
}

// TestForkChildKilledBeforeFinish: a fork child is listed (starting) as
// soon as it is recorded, so it can be killed before its fork finishes
// it; the fork then answers, without that child, and leaves nothing.
func TestForkChildKilledBeforeFinish(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.ForkParallelism = 1 })
	ctx := context.Background()
	parent := w.create()
	var mu sync.Mutex
	var children []string
	w.driver.mu.Lock()
	w.driver.onInit = func(id string) {
		mu.Lock()
		children = append(children, id)
		first, n := children[0], len(children)
		mu.Unlock()
		if n == 2 {
			// The second child is coming up; the first waits for
			// finish. Kill it now.
			if err := w.m.Kill(ctx, first); err != nil {
				t.Errorf("kill the first child: %v", err)
			}
		}
	}
	w.driver.mu.Unlock()
	res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: parent.ID, Count: 2})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	ok := 0
	for _, r := range res {
		if r.Err == nil {
			ok++
			if err := w.m.Kill(ctx, r.Sandbox.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ok != 1 {
		t.Errorf("%d children came through, want the one not killed: %+v", ok, res)
	}
	if err := w.m.Kill(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.stoppedEmpty()
}

// A timer callback that fired before its timer was stopped, and waited for
// the lock meanwhile, finds itself stale: a failing kill re-arming the
// deadline and then its back-off must not run two kills.
func TestStaleTimerCallbackDoesNothing(t *testing.T) {
	w := newWorld(t)
	sb := w.create()
	e := w.m.entry(sb.ID)
	fired := make(chan struct{})
	current := make(chan bool, 1)
	e.mu.Lock()
	e.arm(0, func(ctx context.Context, e *entry, seq uint64) {
		close(fired)
		e.mu.Lock()
		defer e.mu.Unlock()
		current <- e.armed(seq)
	})
	<-fired // fired, now waiting for the lock
	e.arm(time.Hour, func(context.Context, *entry, uint64) {})
	e.mu.Unlock()
	if <-current {
		t.Fatal("a replaced timer's callback still counted as armed")
	}
}

// Pages of the list leave out orphans (records a failed create could not
// delete) and read past them: every page is full while more follow, and
// the walk sees every other record once, in order.
func TestListPagesPastOrphans(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	base := time.Unix(1700000000, 0).UTC()
	var want []string
	for i := range 10 {
		sb := &store.Sandbox{ID: fmt.Sprintf("sb%02d", i), TemplateID: w.base.ID, State: store.StateDead,
			StartedAt: base.Add(time.Duration(10-i) * time.Second), UpdatedAt: time.Now(), EndAt: base, SlotIndex: -1}
		if err := w.store.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if i%3 == 1 {
			w.m.mu.Lock()
			w.m.orphans[sb.ID] = true
			w.m.mu.Unlock()
		} else {
			want = append(want, sb.ID)
		}
	}
	var got []string
	f := store.SandboxFilter{States: []store.SandboxState{store.StateDead}}
	for range 10 {
		f.Limit = 3
		page, err := w.m.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			got = append(got, sb.ID)
		}
		if len(page) < 3 {
			break
		}
		last := page[len(page)-1]
		f.After = &store.ListCursor{At: last.StartedAt, ID: last.ID}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages of 3 gave %v, want %v", got, want)
	}
}

// Running is what the usage sampler reads each round, from memory: the
// running sandboxes, not the paused or killed.
func TestRunningFromMemory(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, b, c := w.create(), w.create(), w.create()
	if err := w.m.Pause(ctx, b.ID, node.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.m.Kill(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sb := range w.m.Running() {
		got = append(got, sb.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint([]string{a.ID}) {
		t.Fatalf("running: %v, want only %s", got, a.ID)
	}
}
