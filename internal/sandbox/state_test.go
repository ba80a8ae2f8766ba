package sandbox

import (
	"testing"

	"github.com/aenv-dev/aenv/internal/store"
)

func TestMoves(t *testing.T) {
	all := []phase{phaseStarting, phaseRunning, phasePaused, phaseOnDisk, phaseGone}
	allowedMoves := map[[2]phase]bool{
		{phaseStarting, phaseRunning}: true, {phaseStarting, phaseGone}: true,
		{phaseRunning, phaseRunning}: true, {phaseRunning, phasePaused}: true, {phaseRunning, phaseGone}: true,
		{phasePaused, phasePaused}: true, {phasePaused, phaseRunning}: true, {phasePaused, phaseOnDisk}: true,
		{phasePaused, phaseGone}:   true,
		{phaseOnDisk, phaseOnDisk}: true, {phaseOnDisk, phaseRunning}: true, {phaseOnDisk, phaseGone}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got, want := canMove(from, to), allowedMoves[[2]phase{from, to}]; got != want {
				t.Errorf("canMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestStoredState(t *testing.T) {
	for _, tc := range []struct {
		p    phase
		want store.SandboxState
	}{
		{phaseStarting, store.StateStarting},
		{phaseRunning, store.StateRunning},
		{phasePaused, store.StatePaused},
		{phaseOnDisk, store.StatePaused},
		{phaseGone, store.StateDead},
	} {
		if got := tc.p.stored(); got != tc.want {
			t.Errorf("%s.stored() = %s, want %s", tc.p, got, tc.want)
		}
	}
}

// Every operation the transition table lets start from a phase ends in a
// phase the move table has: an operation cannot be allowed to begin and
// then be refused at its end.
func TestOperationsEndInAllowedMoves(t *testing.T) {
	ends := map[op]func(from phase) phase{
		opPause:         func(phase) phase { return phasePaused },
		opSpill:         func(phase) phase { return phaseOnDisk },
		opResume:        func(phase) phase { return phaseRunning },
		opSnapshot:      func(from phase) phase { return from },
		opFork:          func(from phase) phase { return from },
		opSetTimeout:    func(from phase) phase { return from },
		opUpdateNetwork: func(from phase) phase { return from },
		opFinish:        func(phase) phase { return phaseRunning },
	}
	for o, froms := range transitions {
		end, ok := ends[o]
		if !ok {
			t.Errorf("operation %q has no end phase in this test", o)
			continue
		}
		for _, from := range froms {
			if to := end(from); !canMove(from, to) {
				t.Errorf("%s from %s ends in %s, which the move table lacks", o, from, to)
			}
		}
	}
}

func TestNextAndTransition(t *testing.T) {
	sb := &store.Sandbox{ID: "s1", State: store.StateRunning}
	e := newEntry(newView(phaseRunning, sb, nil, nil))
	run := e.view().run
	if run == nil {
		t.Fatal("a running view has no running stretch")
	}

	// A move within running keeps the stretch: calls bound to it go on.
	same, err := e.next(phaseRunning)
	if err != nil {
		t.Fatal(err)
	}
	e.transition(phaseRunning, same, nil, nil, nil)
	if e.view().run != run || run.ctx.Err() != nil {
		t.Fatal("a record change of a running sandbox ended its running stretch")
	}

	// Pausing ends it, and the record copy says paused; the original
	// record is untouched (views are immutable).
	paused, err := e.next(phasePaused)
	if err != nil {
		t.Fatal(err)
	}
	if paused.State != store.StatePaused || sb.State != store.StateRunning {
		t.Fatalf("next(paused): copy %s, original %s", paused.State, sb.State)
	}
	e.transition(phasePaused, paused, nil, nil, stoppedError("s1", "was paused"))
	if run.ctx.Err() == nil || e.view().run != nil {
		t.Fatal("pausing left the running stretch open")
	}

	// From paused, starting is not a move: refused before any work.
	if _, err := e.next(phaseStarting); err == nil {
		t.Fatal("next(starting) from paused was allowed")
	}

	// A transition the table lacks, or a record in the wrong state, is a
	// defect: it panics rather than publishing.
	for name, fn := range map[string]func(){
		"bad move":  func() { e.transition(phaseStarting, &store.Sandbox{State: store.StateStarting}, nil, nil, nil) },
		"bad state": func() { e.transition(phaseRunning, &store.Sandbox{State: store.StatePaused}, nil, nil, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: transition did not panic", name)
				}
			}()
			fn()
		}()
	}
	if e.view().phase != phasePaused {
		t.Fatalf("after refused transitions the phase is %s", e.view().phase)
	}
}
