package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// answer is a scripted node's answer to a create.
func answer(status int, sandboxID string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if status == http.StatusCreated {
			writeJSON(w, status, map[string]string{"sandboxID": sandboxID})
			return
		}
		writeJSON(w, status, map[string]any{"code": status, "message": "scripted refusal"})
	}
}

// A create goes to the freer node first and moves on only when the node
// surely made nothing: it refused (full, busy) or never took the
// connection. A node that took the call and dropped it may have made the
// sandbox: the create is not offered elsewhere.
func TestCreateAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		first       http.HandlerFunc // nil: refuses connections
		firstDown   bool             // no heartbeat in the view
		second      http.HandlerFunc
		wantStatus  int
		wantID      string
		wantMessage string
		secondCalls int
	}{
		{name: "first full", first: answer(503, ""), second: answer(201, "sb-b"), wantStatus: 201, wantID: "sb-b", secondCalls: 1},
		{name: "first busy", first: answer(429, ""), second: answer(201, "sb-b"), wantStatus: 201, wantID: "sb-b", secondCalls: 1},
		{name: "first refuses connections", second: answer(201, "sb-b"), wantStatus: 201, wantID: "sb-b", secondCalls: 1},
		{name: "first unreachable", first: answer(201, "sb-a"), firstDown: true, second: answer(201, "sb-b"),
			wantStatus: 201, wantID: "sb-b", secondCalls: 1},
		{name: "first takes the call and drops it", first: cutConnection, second: answer(201, "sb-b"),
			wantStatus: 503, wantMessage: "failed during the create", secondCalls: 0},
		{name: "first answers", first: answer(201, "sb-a"), second: answer(201, "sb-b"), wantStatus: 201, wantID: "sb-a"},
		{name: "first refuses the request", first: answer(400, ""), second: answer(201, "sb-b"), wantStatus: 400},
		{name: "all full", first: answer(503, ""), second: answer(503, ""), wantStatus: 503,
			wantMessage: "no node could take the sandbox", secondCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeNode(t, "a", tc.first), newFakeNode(t, "b", tc.second)
			db := newFakeStore()
			// a has the more room: it is offered the create first.
			db.nodes = []postgres.Node{nodeRecord(a, 10, 0, tc.firstDown), nodeRecord(b, 10, 5, false)}
			db.templates = []*store.Template{{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded}}
			g := newTestGateway(t, db)
			w := call(t, g, context.Background(), http.MethodPost, "/sandboxes", "", map[string]string{"templateID": "base"})
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.wantStatus)
			}
			var got struct {
				SandboxID string `json:"sandboxID"`
			}
			json.Unmarshal(w.Body.Bytes(), &got)
			if got.SandboxID != tc.wantID {
				t.Errorf("sandbox %q, want %q", got.SandboxID, tc.wantID)
			}
			if !strings.Contains(errorMessage(w), tc.wantMessage) {
				t.Errorf("message %q, want it to say %q", errorMessage(w), tc.wantMessage)
			}
			if n := b.count("POST /sandboxes"); n != tc.secondCalls {
				t.Errorf("second node asked %d times, want %d", n, tc.secondCalls)
			}
		})
	}
}

// A team's sandbox goes only to a node that keeps sandboxes in teams
// (cluster protocol 2 and later): a node of an older release would make
// it in no team, out of its team's sight. The operator's creates may go
// anywhere, as before.
func TestTeamCreatesSkipOldNodes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		key         string
		newNode     bool // b is of this release; a, with the more room, is old
		wantStatus  int
		wantID      string
		wantMessage string
	}{
		{name: "a team's create goes to the new node", key: otherKey, newNode: true, wantStatus: 201, wantID: "sb-b"},
		{name: "the operator's may go to the old one", key: testKey, newNode: true, wantStatus: 201, wantID: "sb-a"},
		{name: "a team's create with old nodes only", key: otherKey, wantStatus: 503,
			wantMessage: "too old to keep a team's sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeNode(t, "a", answer(201, "sb-a")), newFakeNode(t, "b", answer(201, "sb-b"))
			old := nodeRecord(a, 10, 0, false)
			old.Protocol = 1
			other := nodeRecord(b, 10, 5, false)
			if !tc.newNode {
				other.Protocol = 1
			}
			db := newFakeStore()
			db.nodes = []postgres.Node{old, other}
			db.templates = []*store.Template{{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded}}
			g := newTestGateway(t, db)
			r := httptest.NewRequest(http.MethodPost, "/sandboxes", strings.NewReader(`{"templateID":"base"}`))
			r.Header.Set("X-API-Key", tc.key)
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.wantStatus)
			}
			if tc.wantID != "" && sandboxOf(t, w) != tc.wantID {
				t.Errorf("sandbox %s, want %s", sandboxOf(t, w), tc.wantID)
			}
			if !strings.Contains(errorMessage(w), tc.wantMessage) {
				t.Errorf("message %q, want it to say %q", errorMessage(w), tc.wantMessage)
			}
		})
	}
}

// The code interpreter template (by name or alias) is built on a node's
// first use: with no copy anywhere a create still goes to a node (the
// first ready one with room, by ID, so that a retry finds the build going
// on there), a node holding a copy is offered it first, and the node
// builds it when every holder is full. Other templates no node holds are
// not found.
func TestCreateBuiltOnFirstUse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		template   string
		holders    []string // nodes with a copy of code-interpreter-v1
		full       []string // nodes with no room
		down       []string // nodes without a heartbeat
		wantStatus int
		wantCalls  []string // in order
	}{
		{name: "no copy: the first node by ID builds it", template: "code-interpreter-v1",
			wantStatus: 201, wantCalls: []string{"a"}},
		{name: "the alias is the same template", template: "code-interpreter",
			wantStatus: 201, wantCalls: []string{"a"}},
		{name: "no copy, first node down", template: "code-interpreter", down: []string{"a"},
			wantStatus: 201, wantCalls: []string{"b"}},
		{name: "no copy, first node full", template: "code-interpreter-v1", full: []string{"a"},
			wantStatus: 201, wantCalls: []string{"b"}},
		{name: "the holder is offered it first", template: "code-interpreter", holders: []string{"c"},
			wantStatus: 201, wantCalls: []string{"c"}},
		{name: "the holder full: another builds it", template: "code-interpreter-v1", holders: []string{"c"},
			full: []string{"c"}, wantStatus: 201, wantCalls: []string{"a"}},
		{name: "an unknown template is not found", template: "no-such-template", wantStatus: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			var got []string // template IDs the nodes were sent
			handler := func(id string) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					var req struct {
						TemplateID string `json:"templateID"`
					}
					json.NewDecoder(r.Body).Decode(&req)
					mu.Lock()
					calls = append(calls, id)
					got = append(got, req.TemplateID)
					mu.Unlock()
					writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": "sb-" + id})
				}
			}
			db := newFakeStore()
			for _, id := range []string{"a", "b", "c"} {
				n := newFakeNode(t, id, handler(id))
				used := 0
				if slices.Contains(tc.full, id) {
					used = 10
				}
				db.nodes = append(db.nodes, nodeRecord(n, 10, used, slices.Contains(tc.down, id)))
			}
			for _, id := range tc.holders {
				db.templates = append(db.templates, &store.Template{ID: "tpl-" + id, Name: "code-interpreter-v1", NodeID: id,
					MemoryMB: 1024})
			}
			g := newTestGateway(t, db)
			w := call(t, g, context.Background(), http.MethodPost, "/sandboxes", "", map[string]string{"templateID": tc.template})
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.wantStatus)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("nodes asked %v, want %v", calls, tc.wantCalls)
			}
			for _, id := range got {
				// The node resolves the name as the client gave it.
				if id != tc.template {
					t.Errorf("node sent template %q, want %q", id, tc.template)
				}
			}
		})
	}
}

// forkNode answers a fork share with count children named after node.
func forkNode(id string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Count int `json:"count"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		items := make([]any, req.Count)
		for i := range items {
			items[i] = map[string]any{"sandbox": map[string]string{"sandboxID": fmt.Sprintf("%s-%d", id, i)}}
		}
		writeJSON(w, http.StatusCreated, items)
	}
}

// A fork of a shared snapshot is split over the nodes; a node that
// refuses its share has it placed on the others in the next round, one
// that took its share and failed has its children answered as errors
// (never made again elsewhere), and children no node takes are errors.
func TestForkRounds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handlers map[string]http.HandlerFunc // by node; nil: refuses connections
		count    int
		// wantMade counts the children made per node; wantErrors the
		// children answered as errors, by code.
		wantMade   map[string]int
		wantErrors map[int]int
		// wantCalls counts fork calls per node.
		wantCalls map[string]int
	}{
		{name: "all take their share", count: 6,
			handlers:  map[string]http.HandlerFunc{"a": forkNode("a"), "b": forkNode("b"), "c": forkNode("c")},
			wantMade:  map[string]int{"a": 2, "b": 2, "c": 2},
			wantCalls: map[string]int{"a": 1, "b": 1, "c": 1}},
		{name: "one full, its share placed on the others", count: 6,
			handlers:  map[string]http.HandlerFunc{"a": answer(503, ""), "b": forkNode("b"), "c": forkNode("c")},
			wantMade:  map[string]int{"b": 3, "c": 3},
			wantCalls: map[string]int{"a": 1, "b": 2, "c": 2}},
		{name: "one refuses connections", count: 6,
			handlers:  map[string]http.HandlerFunc{"a": nil, "b": forkNode("b"), "c": forkNode("c")},
			wantMade:  map[string]int{"b": 3, "c": 3},
			wantCalls: map[string]int{"b": 2, "c": 2}},
		{name: "one drops the call: its children are not made again", count: 6,
			handlers:   map[string]http.HandlerFunc{"a": cutConnection, "b": forkNode("b"), "c": forkNode("c")},
			wantMade:   map[string]int{"b": 2, "c": 2},
			wantErrors: map[int]int{http.StatusBadGateway: 2},
			wantCalls:  map[string]int{"a": 1, "b": 1, "c": 1}},
		{name: "all full", count: 3,
			handlers:   map[string]http.HandlerFunc{"a": answer(503, ""), "b": answer(503, ""), "c": answer(429, "")},
			wantErrors: map[int]int{http.StatusServiceUnavailable: 3},
			wantCalls:  map[string]int{"a": 1, "b": 1, "c": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newFakeStore()
			nodes := map[string]*fakeNode{}
			for _, id := range []string{"a", "b", "c"} {
				nodes[id] = newFakeNode(t, id, tc.handlers[id])
				db.nodes = append(db.nodes, nodeRecord(nodes[id], 100, 0, false))
			}
			db.templates = []*store.Template{{ID: "snap", Name: "snap", NodeID: "a", Upload: store.UploadUploaded}}
			g := newTestGateway(t, db)
			w := call(t, g, context.Background(), http.MethodPost, "/snapshots/snap/fork", "", map[string]int{"count": tc.count})
			if w.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			var items []struct {
				Sandbox *struct {
					SandboxID string `json:"sandboxID"`
				} `json:"sandbox"`
				Error *struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &items); err != nil || len(items) != tc.count {
				t.Fatalf("%d items (%v), want %d: %s", len(items), err, tc.count, w.Body)
			}
			made, errs := map[string]int{}, map[int]int{}
			for _, it := range items {
				switch {
				case it.Sandbox != nil:
					made[strings.SplitN(it.Sandbox.SandboxID, "-", 2)[0]]++
				case it.Error != nil:
					errs[it.Error.Code]++
				}
			}
			if fmt.Sprint(made) != fmt.Sprint(nonNil(tc.wantMade)) || fmt.Sprint(errs) != fmt.Sprint(nonNil(tc.wantErrors)) {
				t.Errorf("made %v, errors %v; want %v, %v", made, errs, tc.wantMade, tc.wantErrors)
			}
			for id, n := range nodes {
				if got := n.count("POST /snapshots/snap/fork"); got != tc.wantCalls[id] {
					t.Errorf("node %s asked %d times, want %d", id, got, tc.wantCalls[id])
				}
			}
		})
	}
}

func nonNil[K comparable](m map[K]int) map[K]int {
	if m == nil {
		return map[K]int{}
	}
	return m
}

// A template's copies are deleted on every node holding one, or none is
// when a holder is down: a delete never leaves a template half gone
// because a node was unreachable. A node failing mid-delete is named with
// the copies already deleted, and a retry deletes the rest.
func TestDeleteTemplateAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		// bDown: b has no heartbeat; bRefuses: b refuses connections;
		// bConflict: b answers 409 (the copy is in use) on the first try.
		bDown, bRefuses, bConflict, aGone bool
		wantStatus                        int
		wantMessage                       string
		wantLeft                          []string // copies left after the first delete
	}{
		{name: "every holder up", wantStatus: 204},
		{name: "a copy already gone on its node", aGone: true, wantStatus: 204},
		{name: "a holder unreachable: nothing deleted", bDown: true, wantStatus: 503,
			wantMessage: "nothing was deleted", wantLeft: []string{"tpl-gone", "tpl-a", "tpl-b"}},
		{name: "a holder refuses connections", bRefuses: true, wantStatus: 503,
			wantMessage: "already deleted", wantLeft: []string{"tpl-b"}},
		{name: "a holder refuses the delete", bConflict: true, wantStatus: 409,
			wantMessage: "already deleted", wantLeft: []string{"tpl-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newFakeStore()
			var conflict atomic.Bool
			conflict.Store(tc.bConflict)
			deleter := func(w http.ResponseWriter, r *http.Request) {
				id := strings.TrimPrefix(r.URL.Path, "/templates/")
				if id == "tpl-a" && tc.aGone {
					// Deleted by a delete that ended on the node meanwhile.
					db.removeCopy(id)
					writeJSON(w, http.StatusNotFound, map[string]any{"code": 404, "message": "not found"})
					return
				}
				if id == "tpl-b" && conflict.Load() {
					writeJSON(w, http.StatusConflict, map[string]any{"code": 409, "message": "template is in use"})
					return
				}
				if err := db.DeleteTemplate(r.Context(), id); err != nil {
					writeJSON(w, http.StatusNotFound, map[string]any{"code": 404, "message": "not found"})
					return
				}
				w.WriteHeader(http.StatusNoContent)
			}
			a := newFakeNode(t, "a", deleter)
			var bHandler http.HandlerFunc = deleter
			if tc.bRefuses {
				bHandler = nil
			}
			b := newFakeNode(t, "b", bHandler)
			db.nodes = []postgres.Node{nodeRecord(a, 10, 0, false), nodeRecord(b, 10, 0, tc.bDown)}
			// Copies on a and b, and one of a node removed from the cluster
			// kept in the object store (its record only is left).
			db.templates = []*store.Template{
				{ID: "tpl-gone", Name: "snap", NodeID: "removed", Upload: store.UploadUploaded},
				{ID: "tpl-a", Name: "snap", NodeID: "a"},
				{ID: "tpl-b", Name: "snap", NodeID: "b"},
			}
			g := newTestGateway(t, db)
			w := call(t, g, context.Background(), http.MethodDelete, "/templates/snap", "", nil)
			if w.Code != tc.wantStatus || !strings.Contains(errorMessage(w), tc.wantMessage) {
				t.Errorf("status %d %q, want %d saying %q", w.Code, errorMessage(w), tc.wantStatus, tc.wantMessage)
			}
			left, _ := db.TemplateCopies(context.Background(), "snap")
			var ids []string
			for _, c := range left {
				ids = append(ids, c.ID)
			}
			if fmt.Sprint(ids) != fmt.Sprint(tc.wantLeft) && !(len(ids) == 0 && len(tc.wantLeft) == 0) {
				t.Fatalf("copies left %v, want %v", ids, tc.wantLeft)
			}
			if tc.bDown && a.count("DELETE /templates/tpl-a") != 0 {
				t.Error("a's copy was deleted although b's could not be")
			}
			if tc.bConflict {
				// The copy is no longer in use: a retry deletes the rest.
				conflict.Store(false)
				if w := call(t, g, context.Background(), http.MethodDelete, "/templates/snap", "", nil); w.Code != 204 {
					t.Fatalf("retry: %d %s", w.Code, w.Body)
				}
				if left, _ := db.TemplateCopies(context.Background(), "snap"); len(left) != 0 {
					t.Fatalf("copies left after the retry: %v", left)
				}
			}
		})
	}
}

// idemNode is a node keeping its creates' answers by Idempotency-Key, as
// a node's API does; proceed, when set, holds each create until closed.
type idemNode struct {
	mu      sync.Mutex
	made    map[string]string // key -> sandbox
	keys    []string          // the keys creates came with
	creates int
	arrived chan struct{}
	proceed chan struct{}
}

func (n *idemNode) handler(id string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(api.HeaderIdempotencyKey)
		if n.arrived != nil {
			select {
			case n.arrived <- struct{}{}:
			default:
			}
		}
		if n.proceed != nil {
			<-n.proceed
		}
		n.mu.Lock()
		n.keys = append(n.keys, key)
		sb, ok := n.made[key]
		if !ok || key == "" {
			n.creates++
			sb = fmt.Sprintf("%s-sb%d", id, n.creates)
			n.made[key] = sb
		}
		n.mu.Unlock()
		writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": sb})
	}
}

func sandboxOf(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var got struct {
		SandboxID string `json:"sandboxID"`
	}
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &got) != nil {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	return got.SandboxID
}

// Two gateways over one database: a create whose client left before the
// answer is finished, and its retry through the other gateway gets the
// same sandbox; a key whose gateway died after sending the create to a
// node is taken over and the create resent to that node under the same
// node key; a key whose node is unreachable is never made twice.
func TestIdempotentCreateAcrossGateways(t *testing.T) {
	body := map[string]string{"templateID": "base"}
	setup := func(t *testing.T, aDown bool) (*fakeStore, *Gateway, *Gateway, *idemNode, *idemNode) {
		db := newFakeStore()
		na, nb := &idemNode{made: map[string]string{}}, &idemNode{made: map[string]string{}}
		a, b := newFakeNode(t, "a", na.handler("a")), newFakeNode(t, "b", nb.handler("b"))
		db.nodes = []postgres.Node{nodeRecord(a, 10, 0, aDown), nodeRecord(b, 10, 5, false)}
		db.templates = []*store.Template{{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded}}
		return db, newTestGateway(t, db), newTestGateway(t, db), na, nb
	}

	t.Run("client left, retry through the other gateway", func(t *testing.T) {
		db, g1, g2, na, nb := setup(t, false)
		na.arrived, na.proceed = make(chan struct{}, 1), make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan struct{})
		go func() {
			defer close(first)
			call(t, g1, ctx, http.MethodPost, "/sandboxes", "k1", body)
		}()
		<-na.arrived
		cancel() // the client leaves while the node creates
		// a takes no more: a retry placed afresh would land on b.
		db.mu.Lock()
		db.nodes[0].Draining = true
		db.mu.Unlock()
		if err := g2.nodes.refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		retry := make(chan string)
		go func() {
			retry <- sandboxOf(t, call(t, g2, context.Background(), http.MethodPost, "/sandboxes", "k1", body))
		}()
		close(na.proceed)
		if id := <-retry; id != "a-sb1" {
			t.Errorf("retry got %s, want a-sb1", id)
		}
		<-first
		if na.creates+nb.creates != 1 {
			t.Errorf("%d sandboxes made for one key", na.creates+nb.creates)
		}
		// Another caller's same key is another create.
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		r.Header.Set("X-API-Key", otherKey)
		r.Header.Set("Idempotency-Key", "k1")
		g2.ServeHTTP(w, r)
		if w.Code != http.StatusCreated || na.creates+nb.creates != 2 {
			t.Errorf("another caller's key: %d %s, %d made", w.Code, w.Body, na.creates+nb.creates)
		}
	})

	// A gateway that died after noting node a: its hold lapses.
	died := func(t *testing.T, db *fakeStore, g *Gateway, key string) string {
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
		r.Header.Set("X-API-Key", testKey)
		r.Header.Set("Idempotency-Key", key)
		raw, _ := json.Marshal(body)
		_, run, err := g.idem.Claim(context.Background(), api.IdempotencyScope(r), sha256.Sum256(raw))
		if err != nil || run == nil {
			t.Fatalf("claim: %v", err)
		}
		held := run.(*sharedRun)
		if err := held.Note(context.Background(), noteNode+"a"); err != nil {
			t.Fatal(err)
		}
		held.stop() // renewals end with the gateway
		held.done.Wait()
		db.lapse()
		return held.NodeKey()
	}

	t.Run("taken over: resent to the noted node", func(t *testing.T) {
		db, g1, g2, na, nb := setup(t, false)
		nodeKey := died(t, db, g1, "k2")
		// The node had made the sandbox under the node key.
		na.made[nodeKey], na.creates = "a-made", 1
		if id := sandboxOf(t, call(t, g2, context.Background(), http.MethodPost, "/sandboxes", "k2", body)); id != "a-made" {
			t.Errorf("takeover got %s, want a-made", id)
		}
		if na.creates != 1 || nb.creates != 0 || na.keys[0] != nodeKey {
			t.Errorf("made a:%d b:%d, node keys %v (want %s)", na.creates, nb.creates, na.keys, nodeKey)
		}
	})

	t.Run("taken over: the noted node unreachable", func(t *testing.T) {
		db, g1, g2, na, nb := setup(t, true)
		died(t, db, g1, "k3")
		for range 2 {
			w := call(t, g2, context.Background(), http.MethodPost, "/sandboxes", "k3", body)
			if w.Code != http.StatusServiceUnavailable || !strings.Contains(errorMessage(w), "not known") {
				t.Fatalf("status %d %q, want 503 saying the outcome is not known", w.Code, errorMessage(w))
			}
		}
		if na.creates+nb.creates != 0 {
			t.Errorf("%d sandboxes made while a may hold one", na.creates+nb.creates)
		}
	})

	t.Run("taken over: the noted node left the cluster", func(t *testing.T) {
		db, g1, g2, _, nb := setup(t, false)
		died(t, db, g1, "k4")
		db.mu.Lock()
		db.nodes = db.nodes[1:]
		db.mu.Unlock()
		if err := g2.nodes.refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if id := sandboxOf(t, call(t, g2, context.Background(), http.MethodPost, "/sandboxes", "k4", body)); id != "b-sb1" || nb.creates != 1 {
			t.Errorf("got %s (%d made on b), want b-sb1 placed afresh", id, nb.creates)
		}
	})

	t.Run("same key, other body", func(t *testing.T) {
		_, g1, g2, _, _ := setup(t, false)
		sandboxOf(t, call(t, g1, context.Background(), http.MethodPost, "/sandboxes", "k5", body))
		w := call(t, g2, context.Background(), http.MethodPost, "/sandboxes", "k5", map[string]string{"templateID": "base", "x": "y"})
		if w.Code != http.StatusUnprocessableEntity {
			t.Errorf("status %d, want 422", w.Code)
		}
	})
}

// A fork of a shared snapshot with an Idempotency-Key is made once across
// gateways; one whose gateway died mid-fork is never forked again under
// that key (which children were made is not known).
func TestIdempotentForkAcrossGateways(t *testing.T) {
	db := newFakeStore()
	var nodes []*fakeNode
	for _, id := range []string{"a", "b"} {
		n := newFakeNode(t, id, forkNode(id))
		nodes = append(nodes, n)
		db.nodes = append(db.nodes, nodeRecord(n, 100, 0, false))
	}
	db.templates = []*store.Template{{ID: "snap", Name: "snap", NodeID: "a", Upload: store.UploadUploaded}}
	g1, g2 := newTestGateway(t, db), newTestGateway(t, db)
	forks := func() int {
		return nodes[0].count("POST /snapshots/snap/fork") + nodes[1].count("POST /snapshots/snap/fork")
	}
	body := map[string]int{"count": 4}

	w1 := call(t, g1, context.Background(), http.MethodPost, "/snapshots/snap/fork", "f1", body)
	w2 := call(t, g2, context.Background(), http.MethodPost, "/snapshots/snap/fork", "f1", body)
	if w1.Code != http.StatusCreated || w2.Body.String() != w1.Body.String() || forks() != 2 {
		t.Fatalf("retry: %d %s / %d %s, %d node calls (want 2)", w1.Code, w1.Body, w2.Code, w2.Body, forks())
	}

	// A gateway that died after noting its fork.
	r := httptest.NewRequest(http.MethodPost, "/snapshots/snap/fork", nil)
	r.Header.Set("X-API-Key", testKey)
	r.Header.Set("Idempotency-Key", "f2")
	raw, _ := json.Marshal(body)
	_, run, err := g1.idem.Claim(context.Background(), api.IdempotencyScope(r), sha256.Sum256(raw))
	if err != nil {
		t.Fatal(err)
	}
	held := run.(*sharedRun)
	held.Note(context.Background(), "fork")
	held.stop()
	held.done.Wait()
	db.lapse()
	w := call(t, g2, context.Background(), http.MethodPost, "/snapshots/snap/fork", "f2", body)
	if w.Code != http.StatusServiceUnavailable || forks() != 2 {
		t.Errorf("taken over: %d %s, %d node calls; want 503 and no fork", w.Code, w.Body, forks())
	}
}

// A create or a snapshot's fork by a team at one of its limits is refused
// by the gateway, as the node would (429, Aenv-Limit: team), without being
// sent to a node to wait there for room; with room it goes on.
func TestTeamAtLimitRefusedByGateway(t *testing.T) {
	a := newFakeNode(t, "a", answer(201, "sb-a"))
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(a, 10, 0, false)}
	db.templates = []*store.Template{
		{ID: "tpl-a", Name: "base", NodeID: "a", Upload: store.UploadUploaded, MemoryMB: 512, VCPU: 1, Kind: store.KindRootfs},
	}
	db.teams = map[string]*auth.Team{auth.DefaultTeam: {ID: auth.DefaultTeam, MaxSandboxes: 2, MaxMemoryMB: 2048}}
	db.teamUse = map[string]auth.Usage{auth.DefaultTeam: {Sandboxes: 2, MemoryMB: 1024, VCPUs: 2}}
	g := newTestGateway(t, db)
	send := func(path string, body any) *httptest.ResponseRecorder {
		raw, _ := json.Marshal(body)
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(raw))
		r.Header.Set("X-API-Key", otherKey)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct {
		name    string
		use     auth.Usage
		path    string
		body    any
		want    int
		message string
	}{
		{name: "create at the sandbox limit", use: auth.Usage{Sandboxes: 2}, path: "/sandboxes",
			body: map[string]string{"templateID": "base"}, want: 429, message: "limit of 2 sandboxes"},
		{name: "create past the memory limit at the template's size", use: auth.Usage{Sandboxes: 1, MemoryMB: 1600},
			path: "/sandboxes", body: map[string]string{"templateID": "base"}, want: 429, message: "2048 MiB"},
		{name: "fork of a snapshot at the limit", use: auth.Usage{Sandboxes: 2}, path: "/snapshots/base/fork",
			body: map[string]int{"count": 2}, want: 429, message: "limit of 2 sandboxes"},
		{name: "create with room", use: auth.Usage{Sandboxes: 1, MemoryMB: 512}, path: "/sandboxes",
			body: map[string]string{"templateID": "base"}, want: 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db.mu.Lock()
			db.teamUse[auth.DefaultTeam] = tc.use
			db.mu.Unlock()
			before := a.count("POST /sandboxes") + a.count("POST /snapshots/base/fork")
			w := send(tc.path, tc.body)
			if w.Code != tc.want {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.want)
			}
			sent := a.count("POST /sandboxes") + a.count("POST /snapshots/base/fork") - before
			if tc.want == 429 {
				if !strings.Contains(errorMessage(w), tc.message) || w.Header().Get("Aenv-Limit") != "team" ||
					w.Header().Get("Retry-After") == "" {
					t.Errorf("refusal %q, headers %v", errorMessage(w), w.Header())
				}
				if sent != 0 {
					t.Errorf("a refused request was sent to the node %d times", sent)
				}
			} else if sent != 1 {
				t.Errorf("sent to the node %d times, want 1", sent)
			}
		})
	}
}
