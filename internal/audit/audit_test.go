package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
)

// memStore is a Store in memory, for the Log's own behaviour.
type memStore struct {
	mu      sync.Mutex
	events  []Event
	appends int
	block   chan struct{} // when set, appends wait for it
	failing bool
}

func (m *memStore) AppendAudit(ctx context.Context, events []Event) error {
	if m.block != nil {
		<-m.block
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failing {
		return errors.New("database away")
	}
	m.appends++
	for _, e := range events {
		e.Seq = int64(len(m.events) + 1)
		m.events = append(m.events, e)
	}
	return nil
}

func (m *memStore) ListAudit(ctx context.Context, f Filter) ([]Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.events)
	slices.Reverse(out)
	return out[:min(len(out), f.Limit)], nil
}

func (m *memStore) PurgeAudit(ctx context.Context, before time.Time) (int64, error) { return 0, nil }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// List reads the caller's own events: those queued are written first,
// in batches, and copied to the file as JSON lines.
func TestLogListReadsOwnWrites(t *testing.T) {
	st := &memStore{}
	var file bytes.Buffer
	l := New(st, Options{File: &file}, discard())
	defer l.Close()
	for i := range 3 {
		l.Record(Event{Action: "POST /sandboxes", Object: string(rune('a' + i))})
	}
	got, err := l.List(context.Background(), Filter{Limit: 10})
	if err != nil || len(got) != 3 || got[0].Object != "c" {
		t.Fatalf("list right after recording: %+v %v", got, err)
	}
	lines := strings.Split(strings.TrimSpace(file.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("file: %q", file.String())
	}
	var e Event
	if err := json.Unmarshal([]byte(lines[2]), &e); err != nil || e.Object != "c" || e.Action != "POST /sandboxes" {
		t.Fatalf("last line %q: %+v %v", lines[2], e, err)
	}
}

// A failed write loses nothing: the events are stored by the next one,
// and copied to the file once.
func TestLogKeepsEventsAFailedWriteDidNotStore(t *testing.T) {
	st := &memStore{failing: true}
	var file bytes.Buffer
	l := New(st, Options{File: &file}, discard())
	defer l.Close()
	for i := range 3 {
		l.Record(Event{Action: "POST /sandboxes", Object: string(rune('a' + i))})
	}
	l.Flush(context.Background())
	st.mu.Lock()
	st.failing = false
	st.mu.Unlock()
	got, err := l.List(context.Background(), Filter{Limit: 10})
	if err != nil || len(got) != 3 {
		t.Fatalf("after the database came back: %+v %v", got, err)
	}
	if lines := strings.Count(file.String(), "\n"); lines != 3 {
		t.Fatalf("the file has %d lines, want 3:\n%s", lines, file.String())
	}
}

// A store that does not keep up never slows a request: past the queue's
// bound events are dropped and counted; Close writes what was queued.
func TestLogDropsPastItsQueue(t *testing.T) {
	st := &memStore{block: make(chan struct{})}
	l := New(st, Options{Queue: 4}, discard())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			l.Record(Event{Action: "DELETE /sandboxes/{id}"})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Record blocked on a store that does not answer")
	}
	if l.Dropped() == 0 {
		t.Fatal("nothing dropped past a queue of 4 with the store stuck")
	}
	close(st.block)
	l.Close()
	if kept := int64(len(st.events)); kept+l.Dropped() != 100 {
		t.Fatalf("kept %d and dropped %d of 100", kept, l.Dropped())
	}
}

// The object is the route's first naming path value, as the mux that
// routed the request found it.
func TestPathObject(t *testing.T) {
	for _, tc := range []struct{ pattern, path, want string }{
		{"POST /sandboxes/{id}/pause", "/sandboxes/sb1/pause", "sb1"},
		{"DELETE /api-keys/{key}", "/api-keys/k9", "k9"},
		{"PATCH /teams/{team}", "/teams/lab-a", "lab-a"},
		{"POST /v2/templates/{templateID}/builds/{buildID}", "/v2/templates/t1/builds/b2", "t1"},
		{"DELETE /volumes/{volumeID}", "/volumes/vol-9", "vol-9"},
		{"/sandboxes/{id}/{rest...}", "/sandboxes/sb2/files/a/b", "sb2"},
		{"POST /sandboxes", "/sandboxes", ""},
		{"POST /cluster/nodes/{id}/drain", "/cluster/nodes/node-a/drain", "node-a"},
	} {
		mux := http.NewServeMux()
		got := "(not routed)"
		mux.HandleFunc(tc.pattern, func(w http.ResponseWriter, r *http.Request) { got = pathObject(r) })
		method, _, ok := strings.Cut(tc.pattern, " ")
		if !ok {
			method = http.MethodPost
		}
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, tc.path, nil))
		if got != tc.want {
			t.Errorf("pattern %q, path %q: object %q, want %q", tc.pattern, tc.path, got, tc.want)
		}
	}
}

// The middleware records a change with who made it (from the request's
// context), by its route's name; a subtree by its first segment; not what
// works inside a sandbox; and a nil Log adds nothing.
func TestMiddleware(t *testing.T) {
	st := &memStore{}
	l := New(st, Options{}, discard())
	defer l.Close()
	const pattern = "/sandboxes/{id}/{rest...}"
	mux := http.NewServeMux()
	mux.Handle(pattern, l.Middleware(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	p := auth.Principal{TeamID: "lab", KeyID: "k1", KeyName: "trainer"}
	for _, path := range []string{"/sandboxes/sb9/pause/anything/else", "/sandboxes/sb9/execute", "/sandboxes/sb9/files/write"} {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		mux.ServeHTTP(httptest.NewRecorder(), r.WithContext(auth.WithPrincipal(r.Context(), p)))
	}
	got, err := l.List(context.Background(), Filter{Limit: 10})
	if err != nil || len(got) != 1 {
		t.Fatalf("recorded %+v (%v), want the pause alone", got, err)
	}
	if e := got[0]; e.Action != "POST /sandboxes/{id}/pause" || e.Object != "sb9" || e.KeyName != "trainer" ||
		e.TeamID != "lab" || e.Status != http.StatusNoContent {
		t.Fatalf("event %+v", e)
	}
	next := http.NotFoundHandler()
	if h := (*Log)(nil).Middleware(pattern, next); fmt.Sprint(h) != fmt.Sprint(next) {
		t.Fatal("a nil Log wrapped the handler")
	}
}

// A caller's long path is clipped, not stored whole.
func TestEventClipsLongValues(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	r := httptest.NewRequest(http.MethodPost, "/sandboxes/"+long+"/pause", nil)
	e := NewWriter(httptest.NewRecorder()).Event(r, auth.Principal{}, "POST /sandboxes/{id}/"+long, long, time.Now())
	if len(e.Action) > maxField || len(e.Object) > maxField {
		t.Fatalf("kept %d and %d bytes", len(e.Action), len(e.Object))
	}
}

func TestRecorded(t *testing.T) {
	for _, tc := range []struct {
		method, action string
		want           bool
	}{
		{"POST", "POST /sandboxes", true},
		{"DELETE", "DELETE /sandboxes/{id}", true},
		{"GET", "GET /sandboxes", false},
		{"POST", "POST /sandboxes/{id}/refreshes", false},
		{"POST", "", false},
		{"PATCH", "PATCH /teams/{team}", true},
		{"POST", "POST /sandboxes/{id}/execute", false},
		{"PUT", "PUT /sandboxes/{id}/files", false},
		{"POST", "POST /sandboxes/{id}/files/write", false},
		{"PUT", "PUT /build-uploads/{id}", false},
		{"POST", "POST /sandboxes/{id}/fork", true},
	} {
		if got := Recorded(tc.method, tc.action); got != tc.want {
			t.Errorf("Recorded(%s, %q) = %v", tc.method, tc.action, got)
		}
	}
}

// A create's event names what its answer made; a failure its status.
func TestWriterEvent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"sandbox", 201, `{"sandboxID":"sb1","templateID":"base"}`, "sb1"},
		{"volume", 201, `{"volumeID":"vol-1","name":"data","token":"vtok_x"}`, "vol-1"},
		{"fork children", 201, `[{"sandboxID":"c1"},{"sandboxID":"c2"}]`, "c1"},
		{"key", 201, `{"id":"k1","teamID":"lab"}`, "k1"},
		{"team", 201, `{"teamID":"lab"}`, "lab"},
		{"refused", 429, `{"code":429,"message":"limit"}`, ""},
		{"cut list", 201, `[{"sandboxID":"c1"},{"sandboxID":"c2` + strings.Repeat("x", 5000), "c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			w := NewWriter(rec)
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
			r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
			r.RemoteAddr = "192.0.2.7:5000"
			e := w.Event(r, auth.Principal{TeamID: "lab", KeyID: "k", KeyName: "trainer"}, "POST /sandboxes", "", time.Now())
			if e.Object != tc.want || e.Status != tc.status || e.Remote != "192.0.2.7" || e.TeamID != "lab" || e.KeyName != "trainer" {
				t.Fatalf("event %+v, want object %q status %d", e, tc.want, tc.status)
			}
		})
	}
}

func TestCheckFilter(t *testing.T) {
	f := Filter{}
	if err := CheckFilter(&f); err != nil || f.Limit != 100 {
		t.Fatalf("default: %+v %v", f, err)
	}
	for _, bad := range []Filter{{Limit: -1}, {Limit: MaxLimit + 1}, {Before: -3}} {
		if err := CheckFilter(&bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// BenchmarkRecordRequest is a request through the middleware: routing,
// wrapping its writer, building its event and queueing it (the store's
// write is batched off the request's path).
func BenchmarkRecordRequest(b *testing.B) {
	l := New(&memStore{}, Options{Queue: 1 << 20}, discard())
	defer l.Close()
	const pattern = "POST /sandboxes/{id}/pause"
	mux := http.NewServeMux()
	body := []byte(`{"sandboxID":"sb1"}`)
	mux.Handle(pattern, l.Middleware(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})))
	r := httptest.NewRequest(http.MethodPost, "/sandboxes/sb1/pause", nil)
	r = r.WithContext(auth.WithPrincipal(r.Context(), auth.Principal{TeamID: "lab", KeyID: "k", KeyName: "trainer"}))
	b.ReportAllocs()
	for b.Loop() {
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}
}
