package cluster

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/sandbox"
	"github.com/aenv-dev/aenv/internal/store"
)

// fakeNode answers creates and forks, holding each create until release
// is closed; Use counts the sandboxes it made, each of memoryMB. Other
// Node methods (Get among them: admission must not read the store) are
// not called by Admission's tests.
type fakeNode struct {
	node.Node
	release  chan struct{}
	made     atomic.Int64
	memoryMB int
	forked   atomic.Int64 // children asked of the inner Fork
	team     string       // the team of the sandboxes it forks
}

func (f *fakeNode) Create(ctx context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.made.Add(1)
	return &store.Sandbox{ID: "sb"}, nil
}

func (f *fakeNode) Fork(ctx context.Context, req node.ForkRequest) ([]node.ForkResult, error) {
	f.forked.Add(int64(req.Count))
	out := make([]node.ForkResult, req.Count)
	for i := range out {
		out[i].Sandbox = &store.Sandbox{ID: "child"}
	}
	f.made.Add(int64(req.Count))
	return out, nil
}

func (f *fakeNode) SandboxSize(id string) (sandbox.Size, bool) {
	return sandbox.Size{MemoryMB: f.memoryMB, VCPUs: 1, TeamID: f.team}, true
}

// GetTemplate knows base (no size of its own) and snap, a snapshot of
// 256 MiB and 1 vCPU.
func (f *fakeNode) GetTemplate(_ context.Context, name string) (*store.Template, error) {
	switch name {
	case "base":
		return &store.Template{ID: "base", Name: "base", Kind: store.KindRootfs}, nil
	case "snap":
		return &store.Template{ID: "snap", Name: "snap", Kind: store.KindSnapshot, MemoryMB: 256, VCPU: 1}, nil
	}
	return nil, store.ErrNotFound
}

func (f *fakeNode) Use() sandbox.Use {
	n := int(f.made.Load())
	return sandbox.Use{Sandboxes: n, MemoryMB: n * f.memoryMB}
}

func newFake(memoryMB int) *fakeNode {
	return &fakeNode{release: make(chan struct{}), memoryMB: memoryMB}
}

func TestAdmissionLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limits  Limits
		creates int // at once
		wantOK  int
	}{
		{"count", Limits{MaxSandboxes: 3, DefaultMemoryMB: 100}, 5, 3},
		{"memory", Limits{MemoryMB: 250, DefaultMemoryMB: 100}, 5, 2},
		{"overcommitted memory", Limits{MemoryMB: 1000, DefaultMemoryMB: 100}, 5, 5},
		{"no limits", Limits{DefaultMemoryMB: 100}, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(100)
			a := NewAdmission(f, tc.limits)
			// All creates are in flight at once: the reservations, not the
			// node's reported use, must hold the limit.
			var wg sync.WaitGroup
			var ok, full atomic.Int64
			for range tc.creates {
				wg.Go(func() {
					_, err := a.Create(context.Background(), node.CreateRequest{})
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, node.ErrUnavailable):
						full.Add(1)
					default:
						t.Error(err)
					}
				})
			}
			waitUntil(t, func() bool { return full.Load() == int64(tc.creates-tc.wantOK) })
			close(f.release)
			wg.Wait()
			if ok.Load() != int64(tc.wantOK) {
				t.Errorf("%d creates admitted, want %d", ok.Load(), tc.wantOK)
			}
			// Reservations are released: what is made now counts as use.
			if _, err := a.Create(context.Background(), node.CreateRequest{}); tc.wantOK < tc.creates && err == nil {
				t.Error("a create past the limit was admitted after the burst")
			}
		})
	}
}

func TestAdmissionDraining(t *testing.T) {
	f := newFake(100)
	close(f.release)
	a := NewAdmission(f, Limits{})
	a.SetDraining(true)
	if _, err := a.Create(context.Background(), node.CreateRequest{}); !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("create on a drained node: %v", err)
	}
	if _, err := a.Fork(context.Background(), node.ForkRequest{SandboxID: "p", Count: 2}); !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("fork on a drained node: %v", err)
	}
	a.SetDraining(false)
	if _, err := a.Create(context.Background(), node.CreateRequest{}); err != nil {
		t.Fatalf("create after undrain: %v", err)
	}
}

// A fork beyond the node's room makes what fits and answers the rest
// child by child.
func TestAdmissionForkPartial(t *testing.T) {
	f := newFake(100)
	close(f.release)
	a := NewAdmission(f, Limits{MaxSandboxes: 5})
	f.made.Store(2)
	results, err := a.Fork(context.Background(), node.ForkRequest{SandboxID: "p", Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 5 || f.forked.Load() != 3 {
		t.Fatalf("%d results, %d children asked of the node; want 5 and 3", len(results), f.forked.Load())
	}
	for i, r := range results {
		if made := r.Sandbox != nil; made != (i < 3) || (!made && !errors.Is(r.Err, node.ErrUnavailable)) {
			t.Errorf("child %d: %+v", i, r)
		}
	}
}

// Children are counted at the source's memory size, which the node
// reports from memory (no store read).
func TestAdmissionForkSizedBySource(t *testing.T) {
	f := newFake(300)
	a := NewAdmission(f, Limits{MemoryMB: 1000, DefaultMemoryMB: 50})
	results, err := a.Fork(context.Background(), node.ForkRequest{SandboxID: "p", Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 5 || f.forked.Load() != 3 {
		t.Fatalf("%d results, %d children asked of the node; want 5 and 3 (1000 MiB / 300 MiB)", len(results), f.forked.Load())
	}
}

// Starts beyond MaxStarting wait for a turn, and give up with their
// context.
func TestAdmissionStartingBound(t *testing.T) {
	f := newFake(100)
	a := NewAdmission(f, Limits{MaxStarting: 1})
	first := make(chan error, 1)
	go func() { _, err := a.Create(context.Background(), node.CreateRequest{}); first <- err }()
	waitUntil(t, func() bool { return len(a.starting) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.Create(ctx, node.CreateRequest{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second start while one runs: %v, want to wait and give up", err)
	}
	close(f.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), node.CreateRequest{}); err != nil {
		t.Fatalf("start after the turn came free: %v", err)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeTeams is the store's teams and what their sandboxes hold.
type fakeTeams struct {
	mu    sync.Mutex
	teams map[string]auth.Team
	use   map[string]auth.Usage
	reads atomic.Int64
}

func (f *fakeTeams) GetTeam(_ context.Context, id string) (*auth.Team, error) {
	f.reads.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.teams[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	return &t, nil
}

func (f *fakeTeams) TeamUse(_ context.Context, id string) (auth.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.use[id], nil
}

func (f *fakeTeams) set(id string, u auth.Usage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.use[id] = u
}

// A create or fork of a team at one of its limits is refused on arrival,
// before the node reserves room or the inner node is asked; other teams'
// and unlimited ones go on.
func TestAdmissionTeamAtLimitRefusedOnArrival(t *testing.T) {
	teams := &fakeTeams{
		teams: map[string]auth.Team{
			"full":  {ID: "full", MaxSandboxes: 2},
			"mem":   {ID: "mem", MaxMemoryMB: 1024},
			"rate":  {ID: "rate", CreatesPerSecond: 1, Bucket: auth.Bucket{Tokens: 0, At: time.Now().Add(time.Hour)}},
			"free":  {ID: "free"},
			"roomy": {ID: "roomy", MaxSandboxes: 10},
		},
		use: map[string]auth.Usage{"full": {Sandboxes: 2}, "mem": {Sandboxes: 1, MemoryMB: 768}, "roomy": {Sandboxes: 9}},
	}
	for _, tc := range []struct {
		team     string
		template string
		memoryMB int
		refused  bool
	}{
		{team: "full", refused: true},
		{team: "mem", memoryMB: 512, refused: true},
		{team: "mem", memoryMB: 256},
		// A snapshot restores at its own size (256 MiB), whatever is asked.
		{team: "mem", template: "snap", memoryMB: 1024},
		{team: "mem"}, // size not known yet: the store's check decides
		{team: "rate", refused: true},
		{team: "free"},
		{team: "roomy"},
		{team: "gone"},
		{team: ""},
	} {
		f := newFake(100)
		close(f.release)
		a := NewAdmission(f, Limits{MaxStarting: 1, MaxSandboxes: 100})
		a.CheckTeams(teams, time.Hour)
		_, err := a.Create(context.Background(), node.CreateRequest{TeamID: tc.team, Template: tc.template, MemoryMB: tc.memoryMB})
		if refused := errors.Is(err, store.ErrLimit); refused != tc.refused || (!refused && err != nil) {
			t.Errorf("create of team %q from %q (%d MiB): %v, want refused %v", tc.team, tc.template, tc.memoryMB, err, tc.refused)
		}
		if tc.refused && (f.made.Load() != 0 || a.reserved != 0 || len(a.starting) != 0) {
			t.Errorf("team %q: a refused create reached the node or kept a reservation", tc.team)
		}
		f.team = tc.team
		_, err = a.Fork(context.Background(), node.ForkRequest{SandboxID: "p", Count: 2})
		if refused := errors.Is(err, store.ErrLimit); tc.memoryMB == 0 && (refused != tc.refused || (!refused && err != nil)) {
			t.Errorf("fork of a sandbox of team %q: %v, want refused %v", tc.team, err, tc.refused)
		}
	}
}

// A create waiting for a turn is refused once its team fills up (read
// at most recheck late), and waits on while its team has room; the
// team's rate limits (starting, creates per second) are not held against
// a create already in line.
func TestAdmissionTeamFillsWhileWaiting(t *testing.T) {
	teams := &fakeTeams{
		teams: map[string]auth.Team{"a": {ID: "a", MaxSandboxes: 2, MaxStarting: 1}, "b": {ID: "b", MaxSandboxes: 2}},
		use:   map[string]auth.Usage{},
	}
	f := newFake(100)
	a := NewAdmission(f, Limits{MaxStarting: 1})
	a.CheckTeams(teams, 5*time.Millisecond)
	first := make(chan error, 1)
	go func() { _, err := a.Create(context.Background(), node.CreateRequest{}); first <- err }()
	waitUntil(t, func() bool { return len(a.starting) == 1 })

	waiting := make(chan error, 2)
	for _, team := range []string{"a", "b"} {
		go func() { _, err := a.Create(context.Background(), node.CreateRequest{TeamID: team}); waiting <- err }()
	}
	waitUntil(t, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.reserved == 3 })
	// Team a now has one starting (its limit): no refusal for that.
	teams.set("a", auth.Usage{Sandboxes: 1, Starting: 1})
	reads := teams.reads.Load()
	waitUntil(t, func() bool { return teams.reads.Load() >= reads+6 })
	select {
	case err := <-waiting:
		t.Fatalf("a create in line was ended while its team had room: %v", err)
	default:
	}
	teams.set("a", auth.Usage{Sandboxes: 2})
	select {
	case err := <-waiting:
		if !errors.Is(err, store.ErrLimit) {
			t.Fatalf("the waiting create of the full team: %v, want ErrLimit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting create of a full team was not refused")
	}
	close(f.release)
	for _, c := range []chan error{first, waiting} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if a.reserved != 0 || len(a.starting) != 0 {
		t.Errorf("left reserved %d, starting %d", a.reserved, len(a.starting))
	}
}
