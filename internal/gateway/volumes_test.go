package gateway

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// The content API's calls reach the volume's node with the volume's token
// (and no key of the cluster's); a wrong or missing token, an escaped path
// or an unknown route is refused here, most of them without a database
// read.
func TestVolumeContentRouting(t *testing.T) {
	const id, token = "vol-abcdefghijklmnopqrst", "vtok_GOOD"
	var gotAuth, gotKey string
	a := newFakeNode(t, "a", func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotKey = r.Header.Get("Authorization"), r.Header.Get("X-API-Key")
		w.WriteHeader(http.StatusOK)
	})
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(a, 10, 0, false)}
	db.volumes = map[string]*store.Volume{id: {ID: id, Name: "data", TeamID: auth.DefaultTeam, Token: token, NodeID: "a"}}
	g := newTestGateway(t, db)
	for _, tc := range []struct {
		name, path, auth string
		want             int
		forwarded, read  bool
	}{
		{name: "the volume's token", path: "/volumecontent/" + id + "/file?path=/x", auth: "Bearer " + token,
			want: 200, forwarded: true, read: true},
		{name: "a wrong token", path: "/volumecontent/" + id + "/file?path=/x", auth: "Bearer vtok_BAD", want: 401, read: true},
		{name: "no token", path: "/volumecontent/" + id + "/file?path=/x", want: 401},
		{name: "the API key", path: "/volumecontent/" + id + "/file?path=/x", auth: "Bearer " + testKey, want: 401, read: true},
		{name: "an ID of the wrong shape", path: "/volumecontent/data/file?path=/x", auth: "Bearer " + token, want: 401},
		{name: "an escaped ID", path: "/volumecontent/" + id + "%2Fx/file?path=/x", auth: "Bearer " + token, want: 404},
		{name: "an unknown route", path: "/volumecontent/" + id + "/files?path=/x", auth: "Bearer " + token, want: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotAuth, gotKey = "", ""
			db.mu.Lock()
			db.reads = 0
			db.mu.Unlock()
			before := a.count("GET /volumecontent/" + id + "/file")
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body, tc.want)
			}
			forwarded := a.count("GET /volumecontent/"+id+"/file") > before
			if forwarded != tc.forwarded {
				t.Errorf("forwarded %v, want %v", forwarded, tc.forwarded)
			}
			if forwarded && (gotAuth != "Bearer "+token || gotKey != "") {
				t.Errorf("the node got Authorization %q, X-API-Key %q; want the volume's token alone", gotAuth, gotKey)
			}
			db.mu.Lock()
			read := db.reads > 0
			db.mu.Unlock()
			if read != tc.read {
				t.Errorf("database read %v, want %v", read, tc.read)
			}
		})
	}
}

// A volume of another team is not found through the gateway; one whose
// node has left the cluster can still be deleted (its record).
func TestVolumeRecordsThroughGateway(t *testing.T) {
	a := newFakeNode(t, "a", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(a, 10, 0, false)}
	db.volumes = map[string]*store.Volume{
		"vol-theirs": {ID: "vol-theirs", Name: "x", TeamID: "other-team", Token: "t1", NodeID: "a"},
		"vol-mine":   {ID: "vol-mine", Name: "mine", TeamID: auth.DefaultTeam, Token: "t2", NodeID: "a"},
		"vol-orphan": {ID: "vol-orphan", Name: "orphan", TeamID: auth.DefaultTeam, Token: "t3", NodeID: "gone"},
	}
	g := newTestGateway(t, db)
	send := func(method, path string) int {
		r := httptest.NewRequest(method, path, nil)
		r.Header.Set("X-API-Key", otherKey) // the default team's, not an admin
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		return w.Code
	}
	if code := send("DELETE", "/volumes/vol-theirs"); code != 404 {
		t.Errorf("delete another team's volume: %d, want 404", code)
	}
	if code := send("DELETE", "/volumes/mine"); code != 204 || a.count("DELETE /volumes/mine") != 1 {
		t.Errorf("delete by name: %d, node asked %d times", code, a.count("DELETE /volumes/mine"))
	}
	if code := send("DELETE", "/volumes/vol-orphan"); code != 204 {
		t.Errorf("delete a volume whose node left: %d, want 204", code)
	}
	if _, ok := db.volumes["vol-orphan"]; ok {
		t.Error("the record of a volume whose node left is still there")
	}
}

// Volumes are made only on nodes whose release keeps them; with none
// ready, the create is refused saying why.
func TestVolumeCreatePlacedByProtocol(t *testing.T) {
	answered := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }
	old, current := newFakeNode(t, "old", answered), newFakeNode(t, "new", answered)
	db := newFakeStore()
	oldRec := nodeRecord(old, 100, 0, false) // the more room
	oldRec.Protocol = cluster.VolumesProtocol - 1
	db.nodes = []postgres.Node{oldRec, nodeRecord(current, 10, 5, false)}
	g := newTestGateway(t, db)
	if w := call(t, g, t.Context(), http.MethodPost, "/volumes", "", map[string]string{"name": "data"}); w.Code != 201 ||
		current.count("POST /volumes") != 1 || old.count("POST /volumes") != 0 {
		t.Fatalf("create: %d; the new node asked %d times, the old %d", w.Code, current.count("POST /volumes"), old.count("POST /volumes"))
	}

	db = newFakeStore()
	db.nodes = []postgres.Node{oldRec}
	g = newTestGateway(t, db)
	w := call(t, g, t.Context(), http.MethodPost, "/volumes", "", map[string]string{"name": "data"})
	if w.Code != 503 || !strings.Contains(errorMessage(w), "upgrade the nodes") {
		t.Fatalf("create with only an old node: %d %s", w.Code, w.Body)
	}
}

// A create that mounts volumes goes to the node keeping them, however
// much more room another has; volumes of two nodes, or unknown ones, are
// refused without asking any node.
func TestCreateWithVolumesPlacedOnTheirNode(t *testing.T) {
	answered := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"sandboxID":"sb"}`))
	}
	roomy, keeper := newFakeNode(t, "roomy", answered), newFakeNode(t, "keeper", answered)
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(roomy, 100, 0, false), nodeRecord(keeper, 10, 5, false)}
	db.templates = []*store.Template{
		{ID: "tpl-r", Name: "base", NodeID: "roomy", Upload: store.UploadUploaded},
		{ID: "tpl-k", Name: "base", NodeID: "keeper", Upload: store.UploadUploaded},
	}
	db.volumes = map[string]*store.Volume{
		"vol-k":     {ID: "vol-k", Name: "data", TeamID: auth.DefaultTeam, Token: "t1", NodeID: "keeper"},
		"vol-r":     {ID: "vol-r", Name: "other", TeamID: auth.DefaultTeam, Token: "t2", NodeID: "roomy"},
		"vol-their": {ID: "vol-their", Name: "theirs", TeamID: "another-team", Token: "t3", NodeID: "keeper"},
	}
	g := newTestGateway(t, db)
	create := func(names ...string) *httptest.ResponseRecorder {
		var mounts []map[string]string
		for i, n := range names {
			mounts = append(mounts, map[string]string{"name": n, "path": fmt.Sprintf("/mnt/%d", i)})
		}
		raw, _ := json.Marshal(map[string]any{"templateID": "base", "volumeMounts": mounts})
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", bytes.NewReader(raw))
		r.Header.Set("X-API-Key", otherKey) // the default team's, not an admin
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		return w
	}
	if w := create("data"); w.Code != 201 || keeper.count("POST /sandboxes") != 1 || roomy.count("POST /sandboxes") != 0 {
		t.Fatalf("create mounting data: %d %s; keeper asked %d times, roomy %d", w.Code, w.Body,
			keeper.count("POST /sandboxes"), roomy.count("POST /sandboxes"))
	}
	for _, tc := range []struct {
		names []string
		want  int
	}{
		{[]string{"data", "other"}, 409},
		{[]string{"nope"}, 404},
		{[]string{"vol-their"}, 404},
	} {
		if w := create(tc.names...); w.Code != tc.want {
			t.Errorf("create mounting %v: %d %s, want %d", tc.names, w.Code, w.Body, tc.want)
		}
	}
	if n := keeper.count("POST /sandboxes") + roomy.count("POST /sandboxes"); n != 1 {
		t.Errorf("refused creates reached the nodes: %d creates in all, want 1", n)
	}
}

// With MoveVolumes, a create whose volumes' node cannot take it moves the
// volumes nothing mounts to a node that can (the one keeping most of
// them, whatever the order of equally roomy nodes), and is placed there.
// A mounted volume stays: on a full node the create is refused (503)
// without reaching any node; among volumes of two nodes its node becomes
// the target. A move stuck on a node that sends nothing ends after the
// idle bound, the volume where it was; a node's refusal of an import is
// a 503 in plain words; a create the node would refuse moves nothing.
func TestCreateMovesVolumes(t *testing.T) {
	db := newFakeStore()
	var (
		mu       sync.Mutex
		imported []string
		queries  []string // of the exports
	)
	node := func(name string) *fakeNode {
		return newFakeNode(t, name, func(w http.ResponseWriter, r *http.Request) {
			parts := strings.Split(r.URL.Path, "/") // "", "volumes", id, what
			switch {
			case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/export") && parts[2] == "vol-hang":
				w.Write([]byte("the first bytes"))
				http.NewResponseController(w).Flush()
				<-r.Context().Done()
			case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/export"):
				mu.Lock()
				queries = append(queries, r.URL.RawQuery)
				mu.Unlock()
				w.Write([]byte("files of " + parts[2]))
			case r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/files"):
				w.WriteHeader(http.StatusNoContent)
			case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/import") && parts[2] == "vol-toobig":
				io.Copy(io.Discard, r.Body)
				writeJSON(w, http.StatusBadRequest, map[string]any{"code": 400, "message": "64 GiB is more than this node's volume pool"})
			case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/import"):
				body, err := io.ReadAll(r.Body)
				if err != nil {
					return // cut: no commit
				}
				mu.Lock()
				imported = append(imported, parts[2]+" to "+name+": "+string(body))
				mu.Unlock()
				db.finishMove(parts[2], name)
				writeJSON(w, http.StatusOK, map[string]string{"volumeID": parts[2]})
			case r.Method == http.MethodPost && r.URL.Path == "/sandboxes":
				writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": "sb-on-" + name})
			default:
				w.WriteHeader(http.StatusTeapot)
			}
		})
	}
	full, roomy, roomy2 := node("full"), node("roomy"), node("roomy2")
	db.nodes = []postgres.Node{nodeRecord(full, 10, 10, false), nodeRecord(roomy, 100, 0, false), nodeRecord(roomy2, 100, 0, false)}
	db.templates = []*store.Template{
		{ID: "tpl-f", Name: "base", NodeID: "full", Upload: store.UploadUploaded},
		{ID: "tpl-r", Name: "base", NodeID: "roomy", Upload: store.UploadUploaded},
		{ID: "tpl-r2", Name: "base", NodeID: "roomy2", Upload: store.UploadUploaded},
		{ID: "tpl-theirs", Name: "theirs", TeamID: "another-team", NodeID: "roomy", Upload: store.UploadUploaded},
	}
	vol := func(id, node string) *store.Volume {
		return &store.Volume{ID: "vol-" + id, Name: id, TeamID: auth.DefaultTeam, NodeID: node}
	}
	db.volumes = map[string]*store.Volume{}
	for _, v := range []*store.Volume{vol("data", "full"), vol("other", "roomy"), vol("third", "roomy2"), vol("busy", "full"),
		vol("hang", "full"), vol("toobig", "full"), vol("busy2", "roomy2"), vol("free2", "roomy")} {
		db.volumes[v.ID] = v
	}
	db.volumes["vol-other"].SizeBytes = 64 << 20
	db.volumes["vol-third"].SizeBytes = 32 << 20
	db.holders = map[string][]store.Ref{
		"vol-busy":  {{HolderKind: store.RefSandbox, HolderID: "sb-busy"}},
		"vol-busy2": {{HolderKind: store.RefSandbox, HolderID: "sb-busy2"}},
	}
	g, err := New(t.Context(), Config{NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20, ClusterSecret: "secret",
		APIKey: testKey, MoveVolumes: true, MoveIdle: 200 * time.Millisecond}, db, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	createOf := func(template string, paths []string, names ...string) *httptest.ResponseRecorder {
		var mounts []map[string]string
		for i, n := range names {
			mounts = append(mounts, map[string]string{"name": n, "path": paths[i]})
		}
		return call(t, g, t.Context(), http.MethodPost, "/sandboxes", "", map[string]any{"templateID": template, "volumeMounts": mounts})
	}
	create := func(names ...string) *httptest.ResponseRecorder {
		paths := make([]string, len(names))
		for i := range names {
			paths[i] = fmt.Sprintf("/mnt/%d", i)
		}
		return createOf("base", paths, names...)
	}
	creates := func() int {
		return full.count("POST /sandboxes") + roomy.count("POST /sandboxes") + roomy2.count("POST /sandboxes")
	}

	// data (on the full node) and third (on roomy2) join other on roomy:
	// one volume each on the two roomy nodes, other's the more bytes;
	// whichever order place gives the two.
	for i := range 6 {
		db.mu.Lock()
		db.volumes["vol-data"].NodeID = "full"
		db.volumes["vol-third"].NodeID = "roomy2"
		db.mu.Unlock()
		if w := create("data", "other", "third"); w.Code != 201 || !strings.Contains(w.Body.String(), "sb-on-roomy\"") {
			t.Fatalf("create %d mounting data, other and third: %d %s", i, w.Code, w.Body)
		}
	}
	for _, id := range []string{"vol-data", "vol-third"} {
		if v := db.volumes[id]; v.NodeID != "roomy" || v.MovingTo != "" {
			t.Errorf("%s after the creates: on %q, moving to %q; want on roomy", id, v.NodeID, v.MovingTo)
		}
	}
	mu.Lock()
	got, asked := slices.Clone(imported), slices.Clone(queries)
	mu.Unlock()
	if len(got) != 12 || !slices.Contains(got, "vol-data to roomy: files of vol-data") || full.count("DELETE /volumes/vol-data/files") != 6 {
		t.Errorf("imported %q; old files dropped %d times", got, full.count("DELETE /volumes/vol-data/files"))
	}
	// The importers (this release's protocol) read hard links.
	if len(asked) == 0 || asked[0] != "links=1" {
		t.Errorf("exports asked with %q, want links=1", asked)
	}

	// A mounted volume stays: its node, roomy2, is the target.
	if w := create("busy2", "free2"); w.Code != 201 || !strings.Contains(w.Body.String(), "sb-on-roomy2") {
		t.Errorf("create mounting busy2 (mounted, on roomy2) and free2 (on roomy): %d %s", w.Code, w.Body)
	}
	if v := db.volumes["vol-free2"]; v.NodeID != "roomy2" {
		t.Errorf("free2 is on %s, want roomy2 beside the mounted busy2", v.NodeID)
	}
	before := creates()

	w := create("busy")
	if w.Code != 503 || !strings.Contains(errorMessage(w), "sb-busy") {
		t.Errorf("create mounting a volume mounted on a full node: %d %s, want 503 naming its sandbox", w.Code, w.Body)
	}
	if full.count("GET /volumes/vol-busy/export") != 0 {
		t.Error("a mounted volume was exported")
	}

	w = create("hang")
	if w.Code != 503 || !strings.Contains(errorMessage(w), "no progress") {
		t.Errorf("create mounting a volume whose export hangs: %d %s, want 503 saying why", w.Code, w.Body)
	}
	if v := db.volumes["vol-hang"]; v.NodeID != "full" || v.MovingTo != "" || !slices.Contains(db.aborted, "vol-hang") {
		t.Errorf("hang after the cut move: on %q moving to %q, aborted %v", v.NodeID, v.MovingTo, db.aborted)
	}

	w = create("toobig")
	if msg := errorMessage(w); w.Code != 503 || !strings.Contains(msg, "more than this node's volume pool") || strings.Contains(msg, `"code"`) {
		t.Errorf("create whose volume's import is refused: %d %s, want 503 with the node's words", w.Code, w.Body)
	}

	// Creates their node would refuse move nothing: a bad mount path,
	// another team's template.
	exports := full.count("GET /volumes/vol-data/export") + roomy.count("GET /volumes/vol-data/export")
	db.mu.Lock()
	db.volumes["vol-data"].NodeID = "full"
	db.mu.Unlock()
	if w := createOf("base", []string{"relative"}, "data"); w.Code != 400 {
		t.Errorf("create with a relative mount path: %d %s, want 400", w.Code, w.Body)
	}
	raw, _ := json.Marshal(map[string]any{"templateID": "theirs", "volumeMounts": []map[string]string{{"name": "data", "path": "/mnt/x"}}})
	req := httptest.NewRequest(http.MethodPost, "/sandboxes", bytes.NewReader(raw))
	req.Header.Set("X-API-Key", otherKey) // the default team's, not an admin
	theirs := httptest.NewRecorder()
	g.ServeHTTP(theirs, req)
	if theirs.Code == 201 {
		t.Errorf("create of another team's template: %d %s", theirs.Code, theirs.Body)
	}
	if n := full.count("GET /volumes/vol-data/export") + roomy.count("GET /volumes/vol-data/export"); n != exports {
		t.Errorf("refused creates exported data %d times", n-exports)
	}
	if n := creates(); n != before {
		t.Errorf("%d refused creates reached the nodes", n-before)
	}
}

// stalledMove is a gateway over nodes "from" and "to", and volume "big"
// on from, whose export sends some bytes and then nothing: exporting is
// closed when the export has begun, exportEnded when its request ended.
func stalledMove(t *testing.T) (g *Gateway, db *fakeStore, exporting, exportEnded chan struct{}) {
	db = newFakeStore()
	exporting, exportEnded = make(chan struct{}), make(chan struct{})
	from := newFakeNode(t, "from", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/volumes/vol-big/export" {
			w.Write([]byte("the first bytes"))
			http.NewResponseController(w).Flush()
			close(exporting)
			<-r.Context().Done()
			close(exportEnded)
			return
		}
		w.WriteHeader(http.StatusTeapot)
	})
	to := newFakeNode(t, "to", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusBadGateway)
	})
	db.nodes = []postgres.Node{nodeRecord(from, 10, 0, false), nodeRecord(to, 10, 0, false)}
	db.volumes = map[string]*store.Volume{"vol-big": {ID: "vol-big", Name: "big", TeamID: auth.DefaultTeam, NodeID: "from"}}
	g, err := New(t.Context(), Config{NodeTimeout: time.Minute, MaxJSONBytes: 1 << 20, ClusterSecret: "secret",
		APIKey: testKey, MoveIdle: time.Hour}, db, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return g, db, exporting, exportEnded
}

// checkAborted checks that db's move of volume big was aborted, the
// volume left on from.
func checkAborted(t *testing.T, db *fakeStore) {
	t.Helper()
	db.mu.Lock()
	defer db.mu.Unlock()
	if v := db.volumes["vol-big"]; v.NodeID != "from" || v.MovingTo != "" || !slices.Contains(db.aborted, "vol-big") {
		t.Errorf("after the gateway closed: on %q moving to %q, aborted %v; want aborted, on from", v.NodeID, v.MovingTo, db.aborted)
	}
}

// A move asked not to wait answers 202 once begun (movingTo says where),
// goes on after its answer, and is aborted when the gateway closes.
func TestBackgroundMoveAbortedAtClose(t *testing.T) {
	g, db, exporting, _ := stalledMove(t)
	w := call(t, g, t.Context(), http.MethodPost, "/volumes/big/move", "", map[string]any{"nodeID": "to", "wait": false})
	var begun struct{ NodeID, MovingTo string }
	if err := json.Unmarshal(w.Body.Bytes(), &begun); w.Code != 202 || err != nil || begun.NodeID != "from" || begun.MovingTo != "to" {
		t.Fatalf("a move not waited for: %d %s", w.Code, w.Body)
	}
	select {
	case <-exporting:
	case <-time.After(time.Minute):
		t.Fatal("the move did not go on after its answer")
	}
	g.Close()
	checkAborted(t, db)
	// A move asked of a closed gateway is refused.
	if w := call(t, g, t.Context(), http.MethodPost, "/volumes/big/move", "", map[string]any{"nodeID": "to", "wait": false}); w.Code != 503 {
		t.Errorf("a move asked after Close: %d %s, want 503", w.Code, w.Body)
	}
}

// A move waited for goes on when its client leaves (a proxy's timeout
// must not cut it), and ends (aborted) when the gateway closes.
func TestMoveOutlivesItsClient(t *testing.T) {
	g, db, exporting, exportEnded := stalledMove(t)
	ctx, leave := context.WithCancel(t.Context())
	answered := make(chan int, 1)
	go func() {
		answered <- call(t, g, ctx, http.MethodPost, "/volumes/big/move", "", map[string]any{"nodeID": "to"}).Code
	}()
	select {
	case <-exporting:
	case <-time.After(time.Minute):
		t.Fatal("the move did not begin")
	}
	leave()
	select {
	case <-exportEnded:
		t.Fatal("the move ended with its client")
	case <-time.After(300 * time.Millisecond):
	}
	g.Close()
	<-exportEnded
	if code := <-answered; code != 503 {
		t.Errorf("the move cut by the gateway's close answered %d, want 503", code)
	}
	checkAborted(t, db)
}
