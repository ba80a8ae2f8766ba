package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/aenv-dev/aenv/internal/usage"
	"github.com/aenv-dev/aenv/internal/wire"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

func TestParseSandboxIDs(t *testing.T) {
	tests := []struct {
		name  string
		query string
		want  []string // nil: a bad request
	}{
		{"one", "sandbox_ids=a", []string{"a"}},
		{"comma-separated, in order", "sandbox_ids=c,a,b", []string{"c", "a", "b"}},
		{"duplicates count once", "sandbox_ids=a,b,a,a", []string{"a", "b"}},
		{"repeated parameter", "sandbox_ids=a&sandbox_ids=b,a", []string{"a", "b"}},
		{"empty items skipped", "sandbox_ids=,a,,b,", []string{"a", "b"}},
		{"escaped comma", "sandbox_ids=a%2Cb", []string{"a", "b"}},
		{"missing", "", nil},
		{"empty", "sandbox_ids=", nil},
		{"only commas", "sandbox_ids=,,", nil},
		{"other parameter only", "ids=a", nil},
		{"the limit", "sandbox_ids=" + manyIDs(MaxMetricsSandboxes), strings.Split(manyIDs(MaxMetricsSandboxes), ",")},
		{"the limit with duplicates", "sandbox_ids=" + manyIDs(MaxMetricsSandboxes) + ",sb0,sb1", strings.Split(manyIDs(MaxMetricsSandboxes), ",")},
		{"over the limit", "sandbox_ids=" + manyIDs(MaxMetricsSandboxes+1), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseSandboxIDs(q)
			if tt.want == nil {
				if code, _ := statusOf(err); err == nil || code != http.StatusBadRequest {
					t.Errorf("ParseSandboxIDs(%q) = %v, %v; want a bad request", tt.query, got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("ParseSandboxIDs(%q) = %v, %v; want %v", tt.query, got, err, tt.want)
			}
		})
	}
}

// manyIDs is n different sandbox IDs, joined by commas.
func manyIDs(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb%d", i)
	}
	return strings.Join(ids, ",")
}

// metricsNode is a node over a real store (its List filters by team and
// state as a node's does) whose running sandboxes measure stats.
type metricsNode struct {
	storeNode
	stats runtime.Stats
}

func (n metricsNode) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	sb, err := n.st.GetSandbox(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	if sb.State != store.StateRunning {
		return runtime.Stats{}, fmt.Errorf("%w: sandbox %s is %s", node.ErrConflict, id, sb.State)
	}
	return n.stats, nil
}

// sampledSource is what a usage history samples: sandboxes running as far
// as it knows, each with the same stats.
type sampledSource struct {
	running []*store.Sandbox
	stats   runtime.Stats
}

func (s sampledSource) Running() []*store.Sandbox { return s.running }

func (s sampledSource) List(context.Context, store.SandboxFilter) ([]*store.Sandbox, error) {
	return s.running, nil
}

func (s sampledSource) Stats(context.Context, string) (runtime.Stats, error) { return s.stats, nil }

// sampledHistory is a usage history holding one round of samples of
// sandboxes, taken now.
func sampledHistory(t *testing.T, sandboxes []*store.Sandbox, stats runtime.Stats) *usage.History {
	t.Helper()
	h := usage.Start(context.Background(), sampledSource{running: sandboxes, stats: stats}, usage.Config{Interval: time.Hour},
		slog.New(slog.DiscardHandler))
	deadline := time.Now().Add(10 * time.Second)
	for h.Tracked() < len(sandboxes) {
		if time.Now().After(deadline) {
			t.Fatalf("history tracks %d sandboxes, want %d", h.Tracked(), len(sandboxes))
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.Stop()
	return h
}

// TestBatchMetrics: GET /sandboxes/metrics gives the latest reading of
// each named sandbox of the caller's team, from the history or taken now;
// other teams' sandboxes, unknown, dead and paused ones without readings
// are absent alike. Every answer is checked against the OpenAPI document.
func TestBatchMetrics(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, team := range []string{"a", "b"} {
		if err := st.CreateTeam(ctx, &auth.Team{ID: team, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now().Add(-10 * time.Second)
	record := func(id, team string, state store.SandboxState) *store.Sandbox {
		sb := &store.Sandbox{ID: id, TeamID: team, TemplateID: "base", State: state, VCPU: 2, MemoryMB: 512,
			StartedAt: started, EndAt: started.Add(time.Hour)}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	record("a-new", "a", store.StateRunning) // no history yet: sampled now
	sampled := []*store.Sandbox{
		record("a-sampled", "a", store.StateRunning),
		record("a-paused-sampled", "a", store.StatePaused), // sampled before its pause
		record("a-dead", "a", store.StateDead),             // its history not yet pruned
	}
	record("a-paused", "a", store.StatePaused) // paused before any sample
	record("b-new", "b", store.StateRunning)

	history := sampledHistory(t, sampled, runtime.Stats{MemoryBytes: 100 << 20, CPUUsageNanos: 1e9})
	principals := map[string]auth.Principal{
		"key-a": {TeamID: "a"}, "key-b": {TeamID: "b"}, "admin": auth.Operator(),
	}
	s := New(Config{APIKey: "unused", Usage: history,
		Authorize: func(r *http.Request) (auth.Principal, bool) {
			p, ok := principals[RequestKey(r)]
			return p, ok
		}}, metricsNode{storeNode: storeNode{st: st}, stats: runtime.Stats{MemoryBytes: 64 << 20, CPUUsageNanos: 2e9}},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry(), http.NotFoundHandler())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: wiretest.Transport(t, nil)}

	all := "a-new,a-sampled,a-paused-sampled,a-dead,a-paused,b-new,nope"
	tests := []struct {
		name, key, query string
		status           int
		want             []string
	}{
		{"team a", "key-a", "sandbox_ids=" + all, 200, []string{"a-new", "a-paused-sampled", "a-sampled"}},
		{"team b", "key-b", "sandbox_ids=" + all, 200, []string{"b-new"}},
		{"admin", "admin", "sandbox_ids=" + all, 200, []string{"a-new", "a-paused-sampled", "a-sampled", "b-new"}},
		{"another team's only", "key-a", "sandbox_ids=b-new", 200, nil},
		{"unknown only", "key-a", "sandbox_ids=nope", 200, nil},
		{"duplicates", "key-a", "sandbox_ids=a-new,a-new,a-sampled", 200, []string{"a-new", "a-sampled"}},
		{"repeated parameter", "key-a", "sandbox_ids=a-new&sandbox_ids=a-sampled", 200, []string{"a-new", "a-sampled"}},
		{"missing", "key-a", "", 400, nil},
		{"empty", "key-a", "sandbox_ids=", 400, nil},
		{"too many", "key-a", "sandbox_ids=" + manyIDs(MaxMetricsSandboxes+1), 400, nil},
		{"no key", "", "sandbox_ids=a-new", 401, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", srv.URL+"/sandboxes/metrics?"+tt.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.key != "" {
				req.Header.Set("X-API-Key", tt.key)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.status)
			}
			if tt.status != 200 {
				return
			}
			var out wire.SandboxesWithMetrics
			if err := json.Unmarshal(body, &out); err != nil || out.Sandboxes == nil {
				t.Fatalf("answer %s: %v", body, err)
			}
			var got []string
			for id := range out.Sandboxes {
				got = append(got, id)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("sandboxes %v, want %v", got, tt.want)
			}
		})
	}

	// The values: a sample taken now for the new sandbox, the history's
	// last for the others.
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/metrics?sandbox_ids=a-new,a-sampled,a-paused-sampled", nil)
	req.Header.Set("X-API-Key", "key-a")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out wire.SandboxesWithMetrics
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	for id, wantMem := range map[string]int64{"a-new": 64 << 20, "a-sampled": 100 << 20, "a-paused-sampled": 100 << 20} {
		m := out.Sandboxes[id]
		age := time.Since(time.Unix(m.TimestampUnix, 0))
		if m.CpuCount != 2 || m.MemTotal != 512<<20 || m.MemUsed != wantMem || age < -time.Second || age > time.Minute {
			t.Errorf("%s: %+v, want 2 CPUs, 512 MiB of which %d used, sampled lately", id, m, wantMem)
		}
	}
	if m := out.Sandboxes["a-new"]; m.CPUUsedPct <= 0 {
		t.Errorf("a-new's CPU use %v, want the share of its 2 s of CPU since it started", m.CPUUsedPct)
	}
}
