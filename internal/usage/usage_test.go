package usage

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
)

// fakeSource is a node whose sandboxes and figures the test sets.
type fakeSource struct {
	mu        sync.Mutex
	sandboxes []*store.Sandbox
	stats     map[string]runtime.Stats
}

func (f *fakeSource) List(ctx context.Context, flt store.SandboxFilter) ([]*store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*store.Sandbox
	for _, sb := range f.sandboxes {
		for _, st := range flt.States {
			if sb.State == st {
				out = append(out, sb)
			}
		}
	}
	return out, nil
}

func (f *fakeSource) Running() []*store.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*store.Sandbox
	for _, sb := range f.sandboxes {
		if sb.State == store.StateRunning {
			out = append(out, sb)
		}
	}
	return out
}

func (f *fakeSource) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.stats[id]
	if !ok {
		return st, errors.New("not running")
	}
	return st, nil
}

func (f *fakeSource) set(sandboxes []*store.Sandbox, stats map[string]runtime.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes, f.stats = sandboxes, stats
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newHistory returns a History that is never started: the tests drive
// record and sampleAll themselves.
func newHistory(src Source, capacity int) *History {
	return &History{src: src, cfg: Config{Interval: time.Second, Capacity: capacity}, logger: quiet(),
		series: map[string]*series{}}
}

func TestRecordAndRange(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	sb := &store.Sandbox{ID: "a", VCPU: 2, MemoryMB: 512, StartedAt: t0}
	for _, tc := range []struct {
		name       string
		capacity   int
		samples    int // one per second from t0+1s, CPU growing by 0.5 s each
		start, end time.Time
		wantFirst  int // second of the first sample returned (after t0)
		wantCount  int
	}{
		{"all", 10, 5, time.Time{}, time.Time{}, 1, 5},
		{"from start", 10, 5, t0.Add(3 * time.Second), time.Time{}, 3, 3},
		{"up to end", 10, 5, time.Time{}, t0.Add(2 * time.Second), 1, 2},
		{"window", 10, 5, t0.Add(2 * time.Second), t0.Add(4 * time.Second), 2, 3},
		{"empty window", 10, 5, t0.Add(10 * time.Second), time.Time{}, 0, 0},
		{"ring keeps the newest", 3, 7, time.Time{}, time.Time{}, 5, 3},
		{"ring and window", 4, 9, t0.Add(7 * time.Second), time.Time{}, 7, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistory(nil, tc.capacity)
			for i := 1; i <= tc.samples; i++ {
				st := runtime.Stats{CPUUsageNanos: uint64(i) * 5e8, MemoryBytes: uint64(i) << 20}
				h.record(sb, st, t0.Add(time.Duration(i)*time.Second))
			}
			got := h.Range("a", tc.start, tc.end)
			if len(got) != tc.wantCount {
				t.Fatalf("got %d samples, want %d", len(got), tc.wantCount)
			}
			for i, s := range got {
				sec := tc.wantFirst + i
				if want := t0.Add(time.Duration(sec) * time.Second); !s.At.Equal(want) {
					t.Errorf("sample %d at %v, want %v", i, s.At, want)
				}
				// 0.5 s of CPU per second on 2 vCPUs.
				if s.CPUUsedPct != 25 || s.CPUCount != 2 || s.MemUsed != uint64(sec)<<20 || s.MemTotal != 512<<20 {
					t.Errorf("sample %d: %+v", i, s)
				}
			}
		})
	}
}

func TestCPUPercent(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name         string
		vcpu         int
		lastCPU, cpu uint64
		elapsed      time.Duration
		want         float64
	}{
		{"idle", 1, 1e9, 1e9, time.Second, 0},
		{"one full vCPU of two", 2, 0, 1e9, time.Second, 50},
		{"counter restarted after a restore", 1, 5e9, 2.5e8, time.Second, 25},
		{"clamped", 1, 0, 3e9, time.Second, 100},
		{"no time passed", 1, 0, 1e9, 0, 0},
		{"no vCPU count", 0, 0, 1e9, time.Second, 0},
	} {
		s := &series{vcpu: tc.vcpu, lastCPU: tc.lastCPU, lastAt: t0}
		if got := s.cpuPct(tc.cpu, t0.Add(tc.elapsed)); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPruneForgetsGoneSandboxes(t *testing.T) {
	now := time.Now()
	running := &store.Sandbox{ID: "run", State: store.StateRunning, VCPU: 1, MemoryMB: 256, StartedAt: now}
	paused := &store.Sandbox{ID: "pau", State: store.StatePaused, VCPU: 1, MemoryMB: 256, StartedAt: now}
	src := &fakeSource{}
	src.set([]*store.Sandbox{running, paused}, map[string]runtime.Stats{"run": {MemoryBytes: 1 << 20}})
	h := newHistory(src, 10)
	h.record(paused, runtime.Stats{MemoryBytes: 1}, now) // sampled before it was paused

	h.sampleAll(context.Background())
	if n := len(h.Range("run", time.Time{}, time.Time{})); n != 1 {
		t.Fatalf("running sandbox: %d samples, want 1", n)
	}
	if n := len(h.Range("pau", time.Time{}, time.Time{})); n != 1 {
		t.Fatalf("a paused sandbox keeps its history without new samples: %d samples", n)
	}

	h.prune(context.Background())
	if n := len(h.Range("pau", time.Time{}, time.Time{})); n != 1 {
		t.Fatalf("a paused sandbox's history was pruned: %d samples", n)
	}

	src.set([]*store.Sandbox{running}, map[string]runtime.Stats{"run": {MemoryBytes: 2 << 20}})
	h.sampleAll(context.Background())
	h.prune(context.Background())
	if h.Range("pau", time.Time{}, time.Time{}) != nil || h.Tracked() != 1 {
		t.Fatalf("the history of a sandbox that is gone must be freed (tracked %d)", h.Tracked())
	}
	if n := len(h.Range("run", time.Time{}, time.Time{})); n != 2 {
		t.Fatalf("running sandbox: %d samples, want 2", n)
	}
}

func TestStartSamplesUntilStopped(t *testing.T) {
	src := &fakeSource{}
	src.set([]*store.Sandbox{{ID: "a", State: store.StateRunning, VCPU: 1, MemoryMB: 64, StartedAt: time.Now()}},
		map[string]runtime.Stats{"a": {MemoryBytes: 1 << 20}})
	h := Start(context.Background(), src, Config{Interval: 10 * time.Millisecond, Capacity: 100}, quiet())
	deadline := time.Now().Add(30 * time.Second)
	for len(h.Range("a", time.Time{}, time.Time{})) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 3 samples after 30 s at a 10 ms interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.Stop()
	select {
	case <-h.done:
	default:
		t.Fatal("Stop returned before the sampler did")
	}
}
