package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
