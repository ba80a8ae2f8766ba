package sandbox

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// TestTimersFollowPhase drives sandboxes through random lifecycle
// operations and checks, after each, that every sandbox's timer is the one
// its phase needs (settle): a deadline while running, a spill while paused
// in memory, none otherwise. A move that forgot its timer would leave a
// running sandbox that never expires, or a sandbox on disk with a deadline
// that kills it.
func TestTimersFollowPhase(t *testing.T) {
	for _, spill := range []time.Duration{0, time.Hour} {
		t.Run("spill="+spill.String(), func(t *testing.T) {
			w := newWorld(t, func(c *Config) { c.PauseToDiskAfter = spill })
			ctx := context.Background()
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rnd := rand.New(rand.NewPCG(seed, 0))
			var ids []string
			for range 3 {
				sb, err := w.m.Create(ctx, node.CreateRequest{Template: "base", Timeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, sb.ID)
			}
			for i := range 80 {
				id := ids[rnd.IntN(len(ids))]
				var what string
				var err error
				switch rnd.IntN(8) {
				case 0:
					what, err = "pause", w.m.Pause(ctx, id, node.PauseOptions{})
				case 1:
					what, err = "pause to disk", w.m.Pause(ctx, id, node.PauseOptions{ToDisk: true})
				case 2:
					what = "resume"
					_, _, err = w.m.Resume(ctx, id, time.Minute, false)
				case 3:
					what, err = "set timeout", w.m.SetTimeout(ctx, id, time.Duration(1+rnd.IntN(60))*time.Minute)
				case 4:
					what = "fork"
					var res []node.ForkResult
					res, err = w.m.Fork(ctx, node.ForkRequest{SandboxID: id, Count: 1})
					for _, r := range res {
						if r.Err == nil {
							ids = append(ids, r.Sandbox.ID)
						}
					}
				case 5:
					what = "snapshot"
					_, err = w.m.Snapshot(ctx, node.SnapshotRequest{SandboxID: id})
				case 6:
					if len(ids) > 2 {
						what, err = "kill", w.m.Kill(ctx, id)
					}
				case 7: // a kill the runtime refuses: the sandbox stays as it was
					w.faults.set("kill", errors.New("runsc kill timed out"))
					what, err = "failed kill", w.m.Kill(ctx, id)
					w.faults.set("kill", nil)
					if err != nil && !expected(err) {
						err = nil // refused, as it should be
					}
				}
				if err != nil && !expected(err) {
					t.Fatalf("step %d: %s %s: %v", i, what, id, err)
				}
				for _, e := range w.m.entries() {
					checkTimer(t, w.m, e, what)
				}
			}
		})
	}
}

// checkTimer fails t unless e's timer is the one its phase needs.
func checkTimer(t *testing.T, m *Manager, e *entry, after string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.view().phase
	want := p == phaseRunning || (p == phasePaused && m.cfg.PauseToDiskAfter > 0)
	if got := e.timer != nil; got != want {
		t.Fatalf("after %s: sandbox %s %s has a timer: %v, want %v", after, e.id, p, got, want)
	}
}

// Changes that keep a sandbox paused (its network policy) keep its
// spill to disk where the pause put it: a policy updated every few minutes
// must not postpone the spill for ever.
func TestPausedChangesKeepSpill(t *testing.T) {
	w := newWorld(t, func(c *Config) { c.PauseToDiskAfter = time.Hour })
	ctx := context.Background()
	sb, err := w.m.Create(ctx, node.CreateRequest{Template: "base", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	e := w.m.entry(sb.ID)
	timerOf := func() *time.Timer {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.timer
	}
	spill := timerOf()
	if spill == nil {
		t.Fatal("paused without a spill timer")
	}
	if err := w.m.UpdateNetwork(ctx, sb.ID, &store.NetworkPolicy{DenyOut: []string{"10.0.0.0/8"}}); err != nil {
		t.Fatal(err)
	}
	if timerOf() != spill {
		t.Fatal("a change to a paused sandbox re-armed its spill")
	}
	// Resumed and paused again: a new pause, a new spill.
	if _, _, err := w.m.Resume(ctx, sb.ID, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if timerOf() == spill || timerOf() == nil {
		t.Fatal("a new pause kept the old spill")
	}
}
