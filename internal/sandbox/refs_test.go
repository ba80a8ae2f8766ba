package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// refsRun is the shared state of a randomized run: the sandboxes believed
// live, and what went wrong.
type refsRun struct {
	w  *world
	mu sync.Mutex
	// live are the sandboxes made and not killed by the run.
	live map[string]bool
	// tally counts the outcomes of each operation, for the log.
	tally map[string]int
}

func (r *refsRun) note(op string, err error) {
	outcome := "ok"
	switch {
	case errors.Is(err, node.ErrNotFound):
		outcome = "not found"
	case errors.Is(err, node.ErrConflict):
		outcome = "conflict"
	case err != nil:
		outcome = "other"
	}
	r.mu.Lock()
	r.tally[op+" "+outcome]++
	r.mu.Unlock()
}

func (r *refsRun) add(id string) {
	r.mu.Lock()
	r.live[id] = true
	r.mu.Unlock()
}

// pick removes (take) or returns a live sandbox at random; "" if none.
func (r *refsRun) pick(rnd *rand.Rand, take bool) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.live))
	for id := range r.live {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	id := ids[rnd.IntN(len(ids))]
	if take {
		delete(r.live, id)
	}
	return id
}

func (r *refsRun) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// build records template name with a root filesystem of its own, as a
// build does, unless the name is taken.
func (r *refsRun) build(ctx context.Context, name string) error {
	id := NewID()
	rootfs := filepath.Join(r.w.dir, "templates", id, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return err
	}
	tpl := &store.Template{ID: id, Name: name, RootfsPath: rootfs, Kind: store.KindRootfs,
		CreatedAt: time.Now().UTC(), DefaultUser: "user"}
	err := r.w.store.PutTemplate(ctx, tpl)
	if errors.Is(err, store.ErrConflict) {
		return os.RemoveAll(filepath.Dir(rootfs))
	}
	return err
}

// expected says whether err is an answer a race may give: the template,
// snapshot or sandbox went meanwhile, or is in use.
func expected(err error) bool {
	return err == nil || errors.Is(err, node.ErrNotFound) || errors.Is(err, node.ErrConflict) ||
		errors.Is(err, node.ErrStopped) || errors.Is(err, node.ErrUnavailable)
}

// Creates, forks, snapshot replaces, kills, template builds and template
// and snapshot deletes race each other, with the prepared pool filling
// behind them. No root filesystem is removed while a sandbox or a prepared
// instance uses it (nor is an instance made from one removed), and once
// everything is deleted nothing is left that nothing refers to.
func TestRefsRandomized(t *testing.T) {
	w := newWorld(t, withPrepared(4), func(c *Config) { c.SnapshotPool = 1; c.MaxForkCount = 2 })
	w.driver.mu.Lock()
	w.driver.checkRootfs = true
	w.driver.mu.Unlock()
	ctx := context.Background()
	r := &refsRun{w: w, live: map[string]bool{}, tally: map[string]int{}}
	const apps, snaps, workers, opsEach, maxLive = 3, 3, 6, 60, 6
	appName := func(k int) string { return fmt.Sprintf("app-%d", k) }
	snapName := func(k int) string { return fmt.Sprintf("snap-%d", k) }
	for k := range apps {
		if err := r.build(ctx, appName(k)); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(g)))
			for range opsEach {
				op := rnd.IntN(10)
				if op <= 2 && r.count() >= maxLive {
					op = 3
				}
				switch op {
				case 0, 1, 2: // create, from a template or a snapshot
					name := appName(rnd.IntN(apps))
					if rnd.IntN(3) == 0 {
						name = snapName(rnd.IntN(snaps))
					}
					sb, err := w.m.Create(ctx, node.CreateRequest{Template: name, Timeout: time.Minute})
					r.note("create", err)
					if err == nil {
						r.add(sb.ID)
					} else if !expected(err) {
						t.Errorf("create from %s: %v", name, err)
					}
				case 3: // kill
					if id := r.pick(rnd, true); id != "" {
						if err := w.m.Kill(ctx, id); !expected(err) {
							t.Errorf("kill %s: %v", id, err)
						}
					}
				case 4: // fork
					if id := r.pick(rnd, false); id != "" && r.count() < maxLive {
						res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: id, Count: 1 + rnd.IntN(2)})
						r.note("fork", err)
						if !expected(err) {
							t.Errorf("fork %s: %v", id, err)
						}
						for _, c := range res {
							if c.Err == nil {
								r.add(c.Sandbox.ID)
							} else if !expected(c.Err) {
								t.Errorf("fork child of %s: %v", id, c.Err)
							}
						}
					}
				case 5: // snapshot, replacing the one of its name
					if id := r.pick(rnd, false); id != "" {
						name := snapName(rnd.IntN(snaps))
						_, err := w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: id, Name: name,
							Kind: store.KindSnapshot, Replace: true})
						r.note("snapshot", err)
						if !expected(err) {
							t.Errorf("snapshot %s as %s: %v", id, name, err)
						}
					}
				case 6: // snapshot delete
					err := w.m.DeleteTemplate(ctx, snapName(rnd.IntN(snaps)))
					r.note("delete snapshot", err)
					if !expected(err) {
						t.Errorf("delete snapshot: %v", err)
					}
				case 7: // template delete
					name := appName(rnd.IntN(apps))
					tpl, err := w.store.GetTemplate(ctx, name)
					if err != nil {
						continue
					}
					err = w.m.DeleteTemplate(ctx, tpl.ID)
					r.note("delete template", err)
					if !expected(err) {
						t.Errorf("delete template %s: %v", name, err)
					}
					if err == nil {
						// Deleted: nothing may still run on its files.
						if on := w.driver.on(tpl.RootfsPath); len(on) > 0 {
							t.Errorf("template %s deleted while instances %v use its root filesystem", name, on)
						}
					}
				case 8: // build a template anew
					if err := r.build(ctx, appName(rnd.IntN(apps))); err != nil {
						t.Errorf("build: %v", err)
					}
				case 9: // snapshots of every kind are listed and read meanwhile
					if _, err := w.m.ListTemplates(ctx); err != nil {
						t.Errorf("list templates: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("outcomes: %v", r.tally)
	w.checkRootfsInUse()
	w.checkRefs(false)

	// Everything goes; then nothing is left that nothing refers to.
	for id := r.pick(rand.New(rand.NewPCG(seed, 0)), true); id != ""; id = r.pick(rand.New(rand.NewPCG(seed, 0)), true) {
		if err := w.m.Kill(ctx, id); err != nil && !errors.Is(err, node.ErrNotFound) {
			t.Fatalf("kill %s: %v", id, err)
		}
	}
	for k := range snaps {
		if err := w.m.DeleteTemplate(ctx, snapName(k)); err != nil && !errors.Is(err, node.ErrNotFound) {
			t.Fatalf("delete %s: %v", snapName(k), err)
		}
	}
	for k := range apps {
		w.deleteEventually(appName(k))
	}
	w.checkRootfsInUse()
	w.checkRefs(true)
	entries, err := os.ReadDir(filepath.Join(w.dir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "base" {
			t.Errorf("template files left with every template deleted: %s", e.Name())
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(w.images()) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if imgs := w.images(); len(imgs) > 0 {
		t.Errorf("images left with every snapshot deleted: %v", imgs)
	}
}

// deleteEventually deletes template name, waiting out a prepared sandbox
// being made from it (which holds it until the pool lets it go).
func (w *world) deleteEventually(name string) {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := w.m.DeleteTemplate(context.Background(), name)
		if err == nil || errors.Is(err, node.ErrNotFound) {
			return
		}
		if !errors.Is(err, node.ErrConflict) || time.Now().After(deadline) {
			w.t.Fatalf("delete %s: %v", name, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkRootfsInUse fails the test if an instance was made from a root
// filesystem that was gone, or lives on one that is gone.
func (w *world) checkRootfsInUse() {
	w.t.Helper()
	w.driver.mu.Lock()
	gone := slices.Clone(w.driver.noRootfs)
	w.driver.mu.Unlock()
	if len(gone) > 0 {
		w.t.Errorf("instances made from a removed root filesystem: %v", gone)
	}
	for id, rootfs := range w.driver.rootfsOf() {
		if _, err := os.Stat(rootfs); rootfs != "" && err != nil {
			w.t.Errorf("instance %s lives on a removed root filesystem: %v", id, err)
		}
	}
}

// A template deleted between a create's read of it and the create's
// record: the delete does not see the create, so the create must fail
// (not found) rather than boot from files being removed.
func TestDeleteTemplateBetweenReadAndCreate(t *testing.T) {
	w := newWorld(t)
	w.driver.mu.Lock()
	w.driver.checkRootfs = true
	w.driver.mu.Unlock()
	ctx := context.Background()
	r := &refsRun{w: w, live: map[string]bool{}}
	if err := r.build(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	tpl, err := w.store.GetTemplate(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	var deleteErr error
	w.store.beforeCreate = func() {
		w.store.beforeCreate = nil
		deleteErr = w.m.DeleteTemplate(ctx, "app")
	}
	sb, err := w.m.Create(ctx, node.CreateRequest{Template: "app", Timeout: time.Minute})
	if deleteErr != nil {
		t.Fatalf("delete of a template no record uses: %v", deleteErr)
	}
	if !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("create from a template deleted meanwhile: %+v, %v; want not found", sb, err)
	}
	if _, err := os.Stat(filepath.Dir(tpl.RootfsPath)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleted template's files: %v", err)
	}
	w.checkRootfsInUse()
	w.checkRefs(true)
	w.empty()
}

// A snapshot that replaces another by name writes its record in place of
// the old one's: when the write fails, the old snapshot is still there,
// image and all.
func TestSnapshotReplaceKeepsOldOnFailure(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	sb := w.create()
	req := node.SnapshotRequest{SandboxID: sb.ID, Name: "snap", Kind: store.KindSnapshot, Replace: true}
	first, err := w.m.Snapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	w.faults.set("store.putTemplate", errInjected)
	if _, err := w.m.Snapshot(ctx, req); !errors.Is(err, errInjected) {
		t.Fatalf("replace whose write fails: %v", err)
	}
	w.faults.set("store.putTemplate", nil)
	got, err := w.m.GetTemplate(ctx, "snap")
	if err != nil || got.ID != first.ID {
		t.Fatalf("snap after a failed replace: %+v, %v; want %s", got, err, first.ID)
	}
	if imgs := w.images(); len(imgs) != 1 || imgs[0] != first.ID {
		t.Fatalf("images %v, want only %s", imgs, first.ID)
	}
	restored, err := w.m.Create(ctx, node.CreateRequest{Template: "snap", Timeout: time.Minute})
	if err != nil {
		t.Fatalf("create from the kept snapshot: %v", err)
	}
	for _, id := range []string{restored.ID, sb.ID} {
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.m.DeleteTemplate(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	w.checkRefs(true)
	w.empty()
}
