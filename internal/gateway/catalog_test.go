package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// The snapshot list is paged in the database. Records the gateway leaves
// out (of a node no longer in the cluster, not in the object store) are
// read past, so a page is full whenever more snapshots follow, and the
// walk still ends.
func TestSnapshotListSkipsRemovedNodes(t *testing.T) {
	db := newFakeStore()
	db.nodes = []postgres.Node{{ID: "node-a", SharedImages: true}}
	base := time.Unix(1700000000, 0).UTC()
	snap := func(id, node string, at int, upload store.UploadState) *store.Template {
		return &store.Template{ID: id, Name: id, Kind: store.KindSnapshot, NodeID: node, Upload: upload,
			CreatedAt: base.Add(time.Duration(at) * time.Second)}
	}
	// Newest first: s7 (gone node, uploaded: listed), s6..s3 (gone node,
	// only there: left out), s2, s1.
	db.templates = []*store.Template{
		snap("s1", "node-a", 1, ""), snap("s2", "node-a", 2, ""),
		snap("s3", "node-x", 3, ""), snap("s4", "node-x", 4, ""), snap("s5", "node-x", 5, ""),
		snap("s6", "node-x", 6, ""), snap("s7", "node-x", 7, store.UploadUploaded),
		{ID: "t1", Name: "base", NodeID: "node-a", CreatedAt: base}, // a template: never listed
	}
	g := newTestGateway(t, db)
	var pages [][]string
	next := ""
	for range 10 {
		q := url.Values{"limit": {"2"}}
		if next != "" {
			q.Set("nextToken", next)
		}
		w := call(t, g, context.Background(), http.MethodGet, "/snapshots?"+q.Encode(), "", nil)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var page []struct {
			SnapshotID string `json:"snapshotID"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range page {
			ids = append(ids, s.SnapshotID)
		}
		pages = append(pages, ids)
		if next = w.Header().Get("X-Next-Token"); next == "" {
			break
		}
	}
	if got, want := fmt.Sprint(pages), "[[s7 s2] [s1]]"; got != want {
		t.Fatalf("pages %s, want %s", got, want)
	}
}
