package sandbox

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// walkUse is Use counted the slow way, entry by entry.
func walkUse(m *Manager) Use {
	var u Use
	for _, e := range m.entries() {
		u = u.plus(e.view().use())
	}
	return u
}

// Use is kept as sandboxes come, change phase and go: it always equals
// a walk over the live entries, and costs nothing per sandbox.
func TestUseKeptUpToDate(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	check := func(step string, want Use) {
		t.Helper()
		got, walked := w.m.Use(), walkUse(w.m)
		if got != want || walked != want {
			t.Fatalf("after %s: Use %+v, walk %+v, want %+v", step, got, walked, want)
		}
	}
	forkOne := func(id string) string {
		t.Helper()
		res, err := w.m.Fork(ctx, node.ForkRequest{SandboxID: id, Count: 1})
		if err != nil || res[0].Err != nil {
			t.Fatalf("fork %s: %v %v", id, err, res)
		}
		return res[0].Sandbox.ID
	}

	check("start", Use{})
	a := w.create() // 512 MiB, the default
	check("a create", Use{1, 0, 512})
	req := createReq()
	req.MemoryMB = 1024
	b, err := w.m.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	check("a second create", Use{2, 0, 1536})
	pause(w, a.ID)
	check("a pause in memory", Use{2, 0, 1536})
	if err := w.m.Pause(ctx, b.ID, node.PauseOptions{ToDisk: true}); err != nil {
		t.Fatal(err)
	}
	check("a pause to disk", Use{1, 0, 512})
	if size, ok := w.m.SandboxSize(b.ID); size.MemoryMB != 1024 || size.VCPUs < 1 || !ok {
		t.Fatalf("size of a sandbox on disk: %+v %v", size, ok)
	}
	forkOne(a.ID)
	check("a fork of a paused sandbox", Use{2, 0, 1024})
	c := forkOne(b.ID)
	check("a fork of a sandbox on disk", Use{3, 0, 2048})
	if _, _, err := w.m.Resume(ctx, b.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	check("a resume from disk", Use{4, 0, 3072})
	if _, _, err := w.m.Resume(ctx, a.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	check("a resume from memory", Use{4, 0, 3072})
	for _, id := range []string{a.ID, c} {
		if err := w.m.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	check("kills", Use{2, 0, 1536})
	if _, ok := w.m.SandboxSize(a.ID); ok {
		t.Fatal("size of a killed sandbox reported")
	}
	// Admission asks at every create: Use must not walk (or copy) the
	// live set.
	if n := testing.AllocsPerRun(100, func() { w.m.Use() }); n != 0 {
		t.Errorf("Use allocates %v times per call", n)
	}

	// Many operations at once, watched while they run.
	w.slots.n = 32
	var mu sync.Mutex
	ids := []string{b.ID}
	for _, r := range w.m.entries() {
		if r.id != b.ID {
			ids = append(ids, r.id)
		}
	}
	pick := func(rnd *rand.Rand) string {
		mu.Lock()
		defer mu.Unlock()
		return ids[rnd.IntN(len(ids))]
	}
	add := func(id string) {
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
	}
	stop := make(chan struct{})
	watched := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				watched <- nil
				return
			default:
			}
			if u := w.m.Use(); u.Sandboxes < 0 || u.Starting < 0 || u.Starting > u.Sandboxes || u.MemoryMB < 0 {
				watched <- errors.New("impossible use")
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for worker := range 4 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(worker), 1))
			for range 25 {
				var err error
				switch id := pick(rnd); rnd.IntN(6) {
				case 0:
					req := createReq()
					req.MemoryMB = 256 << rnd.IntN(3)
					var sb *store.Sandbox
					if sb, err = w.m.Create(ctx, req); err == nil {
						add(sb.ID)
					}
				case 1:
					err = w.m.Pause(ctx, id, node.PauseOptions{})
				case 2:
					err = w.m.Pause(ctx, id, node.PauseOptions{ToDisk: true})
				case 3:
					_, _, err = w.m.Resume(ctx, id, 0, false)
				case 4:
					err = w.m.Kill(ctx, id)
				case 5:
					var res []node.ForkResult
					if res, err = w.m.Fork(ctx, node.ForkRequest{SandboxID: id, Count: 1 + rnd.IntN(2)}); err == nil {
						for _, r := range res {
							if r.Err == nil {
								add(r.Sandbox.ID)
							}
						}
					}
				}
				// Operations meet each other: a sandbox is in the wrong
				// phase, gone, or killed midway (which ends the operation).
				if err != nil && !errors.Is(err, node.ErrConflict) && !errors.Is(err, node.ErrNotFound) &&
					!errors.Is(err, node.ErrUnavailable) && !errors.Is(err, context.Canceled) {
					t.Errorf("worker %d: %v", worker, err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	if got, walked := w.m.Use(), walkUse(w.m); got != walked {
		t.Fatalf("after concurrent operations: Use %+v, walk %+v", got, walked)
	}
	for _, e := range w.m.entries() {
		if err := w.m.Kill(ctx, e.id); err != nil {
			t.Fatal(err)
		}
	}
	check("killing everything", Use{})
}
