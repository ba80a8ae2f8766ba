package usage

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// memLedger is a Ledger in memory; failing makes its adds fail.
type memLedger struct {
	mu      sync.Mutex
	days    map[teamDay]TeamDay
	failing bool
}

func (l *memLedger) AddTeamUsage(ctx context.Context, days []TeamDay) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failing {
		return errors.New("database away")
	}
	for _, d := range days {
		k := teamDay{d.TeamID, d.Day}
		cur := l.days[k]
		cur.TeamID, cur.Day = d.TeamID, d.Day
		cur.add(d)
		l.days[k] = cur
	}
	return nil
}

func (l *memLedger) ListTeamUsage(ctx context.Context, f LedgerFilter) ([]TeamDay, error) {
	return nil, nil
}

func (l *memLedger) get(team string, at time.Time) TeamDay {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.days[teamDay{team, at.UTC().Format(DayLayout)}]
}

// Each running sandbox's samples add the time they stand for to its
// team's day, weighed by what it was given, with the CPU it used; paused
// sandboxes add nothing; a gap counts one interval; a failed write is
// kept and written by the next flush.
func TestTeamUsage(t *testing.T) {
	ledger := &memLedger{days: map[teamDay]TeamDay{}}
	src := &fakeSource{}
	h := newHistory(src, 10)
	h.cfg.Ledger, h.pending = ledger, map[teamDay]*TeamDay{}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	a := &store.Sandbox{ID: "a", TeamID: "lab-a", State: store.StateRunning, VCPU: 2, MemoryMB: 1024, StartedAt: t0}
	b := &store.Sandbox{ID: "b", TeamID: "lab-b", State: store.StateRunning, VCPU: 1, MemoryMB: 512, StartedAt: t0}

	// The first sample of a sandbox running long before stands for one
	// interval (1 s); the next ones for the time since the last.
	h.record(a, runtime.Stats{CPUUsageNanos: uint64(400 * time.Millisecond)}, t0.Add(time.Hour))
	h.record(a, runtime.Stats{CPUUsageNanos: uint64(900 * time.Millisecond)}, t0.Add(time.Hour+time.Second))
	h.record(b, runtime.Stats{}, t0.Add(time.Hour))
	// A gap of a minute (a pause) stands for one interval.
	h.record(b, runtime.Stats{}, t0.Add(time.Hour+time.Minute))
	if err := h.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := t0.Add(time.Hour)
	gotA, gotB := ledger.get("lab-a", at), ledger.get("lab-b", at)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if !near(gotA.SandboxSeconds, 2) || !near(gotA.MemoryMBSeconds, 2048) || !near(gotA.VCPUSeconds, 4) || !near(gotA.CPUSeconds, 0.9) {
		t.Errorf("lab-a: %+v, want 2 s, 2048 MiB·s, 4 vCPU·s, 0.9 CPU s", gotA)
	}
	if !near(gotB.SandboxSeconds, 2) || !near(gotB.MemoryMBSeconds, 1024) {
		t.Errorf("lab-b: %+v, want 2 s (the gap counts one interval), 1024 MiB·s", gotB)
	}

	// A failed write keeps what it had; the next flush writes it with
	// what came meanwhile.
	ledger.failing = true
	h.record(a, runtime.Stats{CPUUsageNanos: uint64(900 * time.Millisecond)}, t0.Add(time.Hour+2*time.Second))
	if err := h.Flush(context.Background()); err == nil {
		t.Fatal("a failed write reported no error")
	}
	h.record(a, runtime.Stats{CPUUsageNanos: uint64(900 * time.Millisecond)}, t0.Add(time.Hour+3*time.Second))
	ledger.failing = false
	if err := h.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := ledger.get("lab-a", at); !near(got.SandboxSeconds, 4) {
		t.Errorf("lab-a after a failed flush and a good one: %v s, want 4", got.SandboxSeconds)
	}

	// sampleAll skips paused sandboxes.
	// (Its stats answer, as a paused instance's would: only its state
	// keeps it out.)
	b.State = store.StatePaused
	src.set([]*store.Sandbox{b}, map[string]runtime.Stats{"b": {CPUUsageNanos: 1}})
	h.sampleAll(context.Background())
	if len(h.pending) != 0 {
		t.Errorf("a paused sandbox was accounted: %v", h.pending)
	}
	b.State = store.StateRunning
	h.sampleAll(context.Background())
	if len(h.pending) != 1 {
		t.Errorf("the same sandbox running was not accounted: %v", h.pending)
	}
}

// storageFunc is a StorageSource of a function.
type storageFunc func() (map[string]int64, error)

func (f storageFunc) StoredBytes(ctx context.Context) (map[string]int64, error) { return f() }

// What a team keeps stored is weighed by the time since the last account:
// the first account, and one after a gap, stand for one FlushEvery; a
// failed read adds nothing; teams storing nothing get no row.
func TestTeamStorage(t *testing.T) {
	ledger := &memLedger{days: map[teamDay]TeamDay{}}
	stored := map[string]int64{"lab-a": 2 << 20, "lab-b": 0}
	var fail error
	h := newHistory(&fakeSource{}, 10)
	h.cfg.Ledger, h.pending, h.cfg.FlushEvery = ledger, map[teamDay]*TeamDay{}, 10*time.Second
	h.cfg.Storage = storageFunc(func() (map[string]int64, error) { return stored, fail })
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }

	h.accountStorage(ctx, t0)                     // the first: 10 s
	h.accountStorage(ctx, t0.Add(15*time.Second)) // 15 s since
	h.accountStorage(ctx, t0.Add(5*time.Minute))  // a gap: 10 s
	fail = errors.New("database away")
	h.accountStorage(ctx, t0.Add(5*time.Minute+5*time.Second)) // nothing
	if err := h.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ledger.get("lab-a", t0); !near(got.StoredMBSeconds, 2*35) || got.SandboxSeconds != 0 {
		t.Errorf("lab-a: %+v, want 70 MiB·s stored and nothing else", got)
	}
	if got := ledger.get("lab-b", t0); got != (TeamDay{}) {
		t.Errorf("lab-b, storing nothing: %+v, want no row", got)
	}
	// An interval across midnight counts to each day its part.
	fail = nil
	next := time.Date(2026, 12, 2, 0, 0, 5, 0, time.UTC)
	h.accountStorage(ctx, next) // a gap again: 10 s, 5 of them on the first day
	if err := h.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ledger.get("lab-a", next); !near(got.StoredMBSeconds, 10) {
		t.Errorf("lab-a on the next day: %+v, want 10 MiB·s", got)
	}
	if got := ledger.get("lab-a", t0); !near(got.StoredMBSeconds, 80) {
		t.Errorf("lab-a on the first day: %+v, want 80 MiB·s", got)
	}
}

func TestDaysOf(t *testing.T) {
	at := func(day, h, m, s int) time.Time { return time.Date(2026, 12, day, h, m, s, 0, time.UTC) }
	for _, tc := range []struct {
		name       string
		start, end time.Time
		want       []dayPart
	}{
		{"within a day", at(1, 10, 0, 0), at(1, 10, 0, 10), []dayPart{{"2026-12-01", 10 * time.Second}}},
		{"across midnight", at(1, 23, 59, 55), at(2, 0, 0, 5),
			[]dayPart{{"2026-12-01", 5 * time.Second}, {"2026-12-02", 5 * time.Second}}},
		{"ending at midnight", at(1, 23, 59, 50), at(2, 0, 0, 0), []dayPart{{"2026-12-01", 10 * time.Second}}},
		{"over a whole day", at(1, 23, 0, 0), at(3, 1, 0, 0),
			[]dayPart{{"2026-12-01", time.Hour}, {"2026-12-02", 24 * time.Hour}, {"2026-12-03", time.Hour}}},
		{"in another zone", at(1, 23, 59, 58).In(time.FixedZone("UTC+5", 5*3600)), at(2, 0, 0, 1),
			[]dayPart{{"2026-12-01", 2 * time.Second}, {"2026-12-02", time.Second}}},
		{"empty", at(1, 10, 0, 0), at(1, 10, 0, 0), nil},
	} {
		if got := daysOf(tc.start, tc.end); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
