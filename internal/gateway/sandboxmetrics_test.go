package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
	"github.com/aenv-dev/aenv/internal/wire"
)

// sandboxStore is the fake database with sandbox records, listed as the
// store lists them (by team, state and IDs). A list without IDs fails the
// test: the gateway must read only the records it was asked about.
type sandboxStore struct {
	*fakeStore
	sandboxes []*store.Sandbox
	lists     int
	listErr   error
}

func (s *sandboxStore) ListSandboxes(_ context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	if s.listErr != nil {
		return nil, s.listErr
	}
	if f.IDs == nil {
		return nil, errors.New("a list of every live sandbox, not of the IDs asked")
	}
	var out []*store.Sandbox
	for _, sb := range s.sandboxes {
		if (f.TeamID == "" || sb.TeamID == f.TeamID) && (len(f.States) == 0 || slices.Contains(f.States, sb.State)) &&
			slices.Contains(f.IDs, sb.ID) {
			c := *sb
			out = append(out, &c)
		}
	}
	return out, nil
}

func (s *sandboxStore) listCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// metricsCall is what a node was asked: for which team, which sandboxes.
type metricsCall struct {
	team string
	ids  string
}

// metricsNodeLog records the batch metrics calls the fake nodes get.
type metricsNodeLog struct {
	mu    sync.Mutex
	calls map[string][]metricsCall // by node
}

func (l *metricsNodeLog) of(node string) []metricsCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls[node])
}

// metricsNodeHandler answers GET /sandboxes/metrics as a node does: with
// the cluster secret only, for the team the gateway names, a reading of
// each named sandbox of that team it holds.
func metricsNodeHandler(t *testing.T, id string, log *metricsNodeLog, teamOf map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/sandboxes/metrics" || r.Header.Get("X-API-Key") != "secret" {
			t.Errorf("node %s got %s %s with key %q", id, r.Method, r.URL, r.Header.Get("X-API-Key"))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		team, admin := r.Header.Get(api.HeaderTeam), r.Header.Get(api.HeaderAdmin) == "1"
		ids, err := api.ParseSandboxIDs(r.URL.Query())
		if err != nil {
			t.Errorf("node %s: %v", id, err)
		}
		log.mu.Lock()
		log.calls[id] = append(log.calls[id], metricsCall{team: team, ids: strings.Join(ids, ",")})
		log.mu.Unlock()
		out := wire.SandboxesWithMetrics{Sandboxes: map[string]wire.SandboxMetric{}}
		for _, sb := range ids {
			if owner, ok := teamOf[sb]; ok && (admin || owner == team) {
				now := time.Now().UTC().Truncate(time.Second)
				out.Sandboxes[sb] = wire.SandboxMetric{Timestamp: now, TimestampUnix: now.Unix(), CpuCount: 1, MemTotal: 512 << 20}
			}
		}
		// One it was not asked about, which the gateway must not pass on.
		out.Sandboxes["not-asked"] = wire.SandboxMetric{CpuCount: 1}
		writeJSON(w, http.StatusOK, out)
	}
}

// metricsCluster is a gateway over nodes that each hold some sandboxes:
// n1 and n2 answer, n3 is down (no heartbeat), n4 fails, n5 drops the
// connection.
func metricsCluster(t *testing.T) (*Gateway, *sandboxStore, *metricsNodeLog) {
	t.Helper()
	log := &metricsNodeLog{calls: map[string][]metricsCall{}}
	teamOf := map[string]string{"a1": "team-a", "a2": "team-a", "a3": "team-a", "a4": "team-a", "a5": "team-a",
		"a6": "team-a", "b1": "team-b"}
	n1 := newFakeNode(t, "n1", metricsNodeHandler(t, "n1", log, teamOf))
	n2 := newFakeNode(t, "n2", metricsNodeHandler(t, "n2", log, teamOf))
	n3 := newFakeNode(t, "n3", metricsNodeHandler(t, "n3", log, teamOf))
	n4 := newFakeNode(t, "n4", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"code":500,"message":"broken"}`, http.StatusInternalServerError)
	})
	n5 := newFakeNode(t, "n5", cutConnection)
	db := &sandboxStore{fakeStore: newFakeStore()}
	db.nodes = []postgres.Node{nodeRecord(n1, 10, 0, false), nodeRecord(n2, 10, 0, false), nodeRecord(n3, 10, 0, true),
		nodeRecord(n4, 10, 0, false), nodeRecord(n5, 10, 0, false)}
	record := func(id, node string, state store.SandboxState) *store.Sandbox {
		return &store.Sandbox{ID: id, TeamID: teamOf[id], NodeID: node, State: state}
	}
	db.sandboxes = []*store.Sandbox{
		record("a1", "n1", store.StateRunning),
		record("a2", "n2", store.StatePaused),
		record("a3", "n3", store.StateRunning), // its node is down
		record("a4", "n4", store.StateRunning), // its node fails
		record("a5", "n5", store.StateRunning), // its node drops the call
		record("a6", "n1", store.StateDead),
		record("b1", "n1", store.StateRunning),
	}
	g, err := New(context.Background(), Config{NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20, ClusterSecret: "secret",
		APIKey: testKey}, db, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g, db, log
}

// getMetrics calls GET /sandboxes/metrics?<query> on g with the test key,
// acting as team ("" for the operator).
func getMetrics(t *testing.T, g http.Handler, team, query string) (int, []string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/sandboxes/metrics?"+query, nil)
	r.Header.Set("X-API-Key", testKey)
	if team != "" {
		r.Header.Set(api.HeaderTeam, team)
	}
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return w.Code, nil
	}
	var out wire.SandboxesWithMetrics
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Sandboxes == nil {
		t.Fatalf("answer %s: %v", w.Body, err)
	}
	return w.Code, slices.Sorted(maps.Keys(out.Sandboxes))
}

// TestBatchMetricsThroughGateway: the gateway asks each node holding a
// named sandbox of the caller's once, as the caller's team, and merges the
// answers; sandboxes of other teams, unknown or dead ones are sent to no
// node, and those of a node down, failing or cut off are left out of a
// 200.
func TestBatchMetricsThroughGateway(t *testing.T) {
	all := "sandbox_ids=a1,a2,a3,a4,a5,a6,b1,nope,a1"
	tests := []struct {
		name, team, query string
		status            int
		want              []string
		asked             map[string][]metricsCall // by node; nodes not named are asked nothing
	}{
		{"team a", "team-a", all, 200, []string{"a1", "a2"}, map[string][]metricsCall{
			"n1": {{"team-a", "a1"}}, "n2": {{"team-a", "a2"}}}},
		{"team b", "team-b", all, 200, []string{"b1"}, map[string][]metricsCall{"n1": {{"team-b", "b1"}}}},
		{"the operator", "", all, 200, []string{"a1", "a2", "b1"}, map[string][]metricsCall{
			"n1": {{auth.DefaultTeam, "a1,b1"}}, "n2": {{auth.DefaultTeam, "a2"}}}},
		{"another team's only", "team-a", "sandbox_ids=b1", 200, nil, nil},
		{"only on a node that is down", "team-a", "sandbox_ids=a3", 200, nil, nil},
		{"missing", "team-a", "", 400, nil, nil},
		{"too many", "team-a", "sandbox_ids=" + manyMetricsIDs(api.MaxMetricsSandboxes+1), 400, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, log := metricsCluster(t)
			status, got := getMetrics(t, g, tt.team, tt.query)
			if status != tt.status || !slices.Equal(got, tt.want) {
				t.Errorf("status %d, sandboxes %v; want %d, %v", status, got, tt.status, tt.want)
			}
			for _, n := range []string{"n1", "n2", "n3"} {
				if calls := log.of(n); !slices.Equal(calls, tt.asked[n]) {
					t.Errorf("node %s was asked %v, want %v", n, calls, tt.asked[n])
				}
			}
		})
	}
}

// manyMetricsIDs is n different sandbox IDs, joined by commas.
func manyMetricsIDs(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("sb", i)
	}
	return strings.Join(ids, ",")
}

// Routes once read cost a poll no database query; a route cached for
// another team's sandbox (by any call naming it) reaches its node, which
// keeps to the caller's team. Without a database, a poll of known routes
// is still answered, one needing a read is 503.
func TestBatchMetricsRoutes(t *testing.T) {
	g, db, log := metricsCluster(t)
	if _, got := getMetrics(t, g, "team-a", "sandbox_ids=a1,a2"); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("first poll: %v", got)
	}
	lists := db.listCount()
	for range 3 {
		if _, got := getMetrics(t, g, "team-a", "sandbox_ids=a1,a2"); !slices.Equal(got, []string{"a1", "a2"}) {
			t.Fatalf("poll: %v", got)
		}
	}
	if n := db.listCount() - lists; n != 0 {
		t.Errorf("polls of known routes read the database %d times", n)
	}

	g.routes.put("b1", "n1")
	if _, got := getMetrics(t, g, "team-a", "sandbox_ids=b1"); len(got) != 0 {
		t.Errorf("team a got another team's sandbox through a cached route: %v", got)
	}
	if calls := log.of("n1"); calls[len(calls)-1] != (metricsCall{"team-a", "b1"}) {
		t.Errorf("node n1's last call %v, want team a's of b1", calls[len(calls)-1])
	}

	db.mu.Lock()
	db.listErr = errors.New("connection refused")
	db.mu.Unlock()
	if status, got := getMetrics(t, g, "team-a", "sandbox_ids=a1,a2"); status != 200 || !slices.Equal(got, []string{"a1", "a2"}) {
		t.Errorf("poll of known routes without a database: %d %v", status, got)
	}
	if status, _ := getMetrics(t, g, "team-a", "sandbox_ids=a1,nope"); status != http.StatusServiceUnavailable {
		t.Errorf("poll needing a read without a database: %d, want 503", status)
	}
}
