package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// testKey is the gateway's own key; otherKey another caller's, in the
// database.
const testKey, otherKey = "test-key", "other-key"

// fakeStore is the cluster's database in memory: nodes, template copies
// and idempotency keys (with the SQL's claim rules). Methods the tests do
// not reach are left to the nil embedded Store.
type fakeStore struct {
	Store

	mu        sync.Mutex
	nodes     []postgres.Node
	templates []*store.Template
	idem      map[string]*fakeIdem
	now       func() time.Time
	teams     map[string]*auth.Team
	teamUse   map[string]auth.Usage
	volumes   map[string]*store.Volume
	reads     int // volume reads
	// holders hold volumes by ID (a move is refused); aborted lists the
	// volumes whose moves were aborted.
	holders map[string][]store.Ref
	aborted []string
}

type fakeIdem struct {
	row        postgres.IdempotencyRow
	leaseUntil time.Time
	expiresAt  time.Time
}

func newFakeStore() *fakeStore {
	return &fakeStore{idem: map[string]*fakeIdem{}, now: time.Now}
}

func (f *fakeStore) ListNodes(context.Context) ([]postgres.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]postgres.Node(nil), f.nodes...), nil
}

func (f *fakeStore) KeyByDigest(_ context.Context, digest string) (*auth.Key, error) {
	if digest != auth.Digest(otherKey) {
		return nil, store.ErrNotFound
	}
	return &auth.Key{ID: "other", TeamID: auth.DefaultTeam, Name: "other", Digest: digest}, nil
}

func (f *fakeStore) TouchKey(context.Context, string, time.Time) error { return nil }

func (f *fakeStore) GetVolume(_ context.Context, team, idOrName string) (*store.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	for _, v := range f.volumes {
		if v.ID == idOrName || (v.TeamID == team && v.Name == idOrName) {
			c := *v
			return &c, nil
		}
	}
	return nil, store.ErrNotFound
}

func (f *fakeStore) BeginVolumeMove(_ context.Context, id, from, to string) (int64, []store.Ref, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.volumes[id]
	switch {
	case !ok:
		return 0, nil, store.ErrNotFound
	case len(f.holders[id]) > 0:
		return 0, f.holders[id], store.ErrConflict
	case v.NodeID != from || v.MovingTo != "":
		return 0, nil, store.ErrConflict
	}
	v.MovingTo, v.MoveToken = to, v.MoveToken+1
	return v.MoveToken, nil, nil
}

// finishMove is what a node's import does at its end.
func (f *fakeStore) finishMove(id, to string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.volumes[id]; v != nil && v.MovingTo == to {
		v.NodeID, v.MovingTo = to, ""
	}
}

func (f *fakeStore) AbortVolumeMove(_ context.Context, id string, token int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.volumes[id]; v != nil && v.MoveToken == token && v.MovingTo != "" {
		v.MovingTo = ""
		f.aborted = append(f.aborted, id)
	}
	return nil
}

func (f *fakeStore) DeleteVolume(_ context.Context, id string) ([]store.Ref, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.volumes[id]; !ok {
		return nil, store.ErrNotFound
	}
	delete(f.volumes, id)
	return nil, nil
}

func (f *fakeStore) PurgeKeys(context.Context, time.Time) (int64, error) { return 0, nil }

func (f *fakeStore) GetTeam(_ context.Context, id string) (*auth.Team, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.teams[id]; ok {
		c := *t
		return &c, nil
	}
	return nil, store.ErrNotFound
}

func (f *fakeStore) TeamUse(_ context.Context, id string) (auth.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.teamUse[id], nil
}

func (f *fakeStore) TemplateCopies(_ context.Context, idOrName string) ([]*store.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*store.Template
	for _, t := range f.templates {
		if t.ID == idOrName || t.Name == idOrName {
			c := *t
			out = append(out, &c)
		}
	}
	return out, nil
}

func (f *fakeStore) DeleteTemplate(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, t := range f.templates {
		if t.ID == id {
			f.templates = append(f.templates[:i], f.templates[i+1:]...)
			return nil
		}
	}
	return store.ErrNotFound
}

// removeCopy is a node deleting its own copy's record.
func (f *fakeStore) removeCopy(id string) { f.DeleteTemplate(context.Background(), id) }

func (f *fakeStore) ClaimIdempotency(_ context.Context, key, body []byte, owner string, lease, ttl time.Duration) (
	bool, string, *postgres.IdempotencyRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	e, ok := f.idem[string(key)]
	switch {
	case !ok || !e.expiresAt.After(now):
		f.idem[string(key)] = &fakeIdem{row: postgres.IdempotencyRow{BodySHA256: body, State: postgres.IdempotencyPending,
			Owner: owner}, leaseUntil: now.Add(lease), expiresAt: now.Add(ttl)}
		return true, "", nil, nil
	case e.row.State == postgres.IdempotencyPending && !e.leaseUntil.After(now) && bytes.Equal(e.row.BodySHA256, body):
		e.row.Owner, e.leaseUntil = owner, now.Add(lease)
		return true, e.row.Note, nil, nil
	}
	row := e.row
	return false, "", &row, nil
}

func (f *fakeStore) held(key []byte, owner string, do func(e *fakeIdem)) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.idem[string(key)]
	if !ok || e.row.Owner != owner || e.row.State != postgres.IdempotencyPending {
		return false, nil
	}
	do(e)
	return true, nil
}

func (f *fakeStore) RenewIdempotency(_ context.Context, key []byte, owner string, lease time.Duration) (bool, error) {
	return f.held(key, owner, func(e *fakeIdem) { e.leaseUntil = f.now().Add(lease) })
}

func (f *fakeStore) NoteIdempotency(_ context.Context, key []byte, owner, note string) (bool, error) {
	return f.held(key, owner, func(e *fakeIdem) { e.row.Note = note })
}

func (f *fakeStore) FinishIdempotency(_ context.Context, key []byte, owner string, status int,
	header map[string][]string, body []byte, ttl time.Duration) (bool, error) {
	return f.held(key, owner, func(e *fakeIdem) {
		e.row.State, e.row.Status, e.row.Header, e.row.Body = postgres.IdempotencyDone, status, header, body
		e.expiresAt = f.now().Add(ttl)
	})
}

func (f *fakeStore) DropIdempotency(_ context.Context, key []byte, owner string) (bool, error) {
	return f.held(key, owner, func(*fakeIdem) { delete(f.idem, string(key)) })
}

func (f *fakeStore) ReleaseIdempotency(_ context.Context, key []byte, owner string) (bool, error) {
	return f.held(key, owner, func(e *fakeIdem) { e.leaseUntil = f.now() })
}

func (f *fakeStore) DeleteExpiredIdempotency(context.Context) (int64, error) { return 0, nil }

// lapse makes every held key's lease run out, as when its gateway died.
func (f *fakeStore) lapse() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.idem {
		e.leaseUntil = f.now()
	}
}

// fakeNode is a node's API, answering what its test scripts.
type fakeNode struct {
	id  string
	srv *httptest.Server
	mu  sync.Mutex
	// calls counts requests by "METHOD path".
	calls map[string]int
}

func (n *fakeNode) count(key string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[key]
}

// newFakeNode starts a node answering with h; a nil h gives an address
// nothing listens on (connections refused).
func newFakeNode(t *testing.T, id string, h http.HandlerFunc) *fakeNode {
	t.Helper()
	n := &fakeNode{id: id, calls: map[string]int{}}
	if h == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.srv = &httptest.Server{URL: "http://" + l.Addr().String()}
		l.Close()
		return n
	}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		n.calls[r.Method+" "+r.URL.Path]++
		n.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *fakeNode) addr() string { return strings.TrimPrefix(n.srv.URL, "http://") }

// cutConnection is a node that takes the request and drops the
// connection without an answer (it failed, or died, mid-call).
func cutConnection(w http.ResponseWriter, _ *http.Request) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		c.Close()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// nodeRecord is a node's row: reachable (fresh heartbeat) unless down,
// with room for max sandboxes of which used are taken.
func nodeRecord(n *fakeNode, max, used int, down bool) postgres.Node {
	// A node registers with its release's protocol.
	rec := postgres.Node{ID: n.id, Address: n.addr(), SharedImages: true, Protocol: cluster.Protocol}
	rec.Capacity.MaxSandboxes = max
	rec.Use.Sandboxes = used
	if down {
		rec.HeartbeatAge = time.Hour
	}
	return rec
}

// newTestGateway is a gateway over db, its nodes read once.
func newTestGateway(t *testing.T, db *fakeStore) *Gateway {
	t.Helper()
	g, err := New(context.Background(), Config{NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20, ClusterSecret: "secret",
		APIKey: testKey}, db, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// call makes a request of g as a client with the test key.
func call(t *testing.T, g http.Handler, ctx context.Context, method, path, idemKey string, body any) *httptest.ResponseRecorder {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	r := httptest.NewRequestWithContext(ctx, method, path, rd)
	r.Header.Set("X-API-Key", testKey)
	if idemKey != "" {
		r.Header.Set("Idempotency-Key", idemKey)
	}
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	return w
}

func errorMessage(w *httptest.ResponseRecorder) string {
	var e struct {
		Message string `json:"message"`
	}
	json.Unmarshal(w.Body.Bytes(), &e)
	return e.Message
}

// ListSnapshots pages through the fake's snapshots as the store does:
// newest first, IDs descending at equal times.
func (f *fakeStore) ListSnapshots(_ context.Context, sf store.SnapshotFilter) ([]*store.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*store.Template
	for _, t := range f.templates {
		if t.Kind != store.KindSnapshot || sf.TeamID != "" && t.TeamID != "" && t.TeamID != sf.TeamID {
			continue
		}
		if c := sf.After; c != nil && !(t.CreatedAt.Before(c.At) || t.CreatedAt.Equal(c.At) && t.ID < c.ID) {
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *store.Template) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if sf.Limit > 0 && len(out) > sf.Limit {
		out = out[:sf.Limit]
	}
	return out, nil
}
