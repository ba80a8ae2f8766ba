package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
	"github.com/aenv-dev/aenv/internal/wire"
)

// During a rolling upgrade a node speaking a cluster protocol this
// gateway cannot work with takes no new sandboxes from it, and the
// gateway says why, naming both releases.
func TestIncompatibleNodeNotUsed(t *testing.T) {
	newer, same := newFakeNode(t, "newer", answer(201, "sb-newer")), newFakeNode(t, "same", answer(201, "sb-same"))
	db := newFakeStore()
	future := nodeRecord(newer, 10, 0, false) // the roomier: it would be offered the create first
	future.Protocol, future.Version = cluster.Protocol+1, "v9.9.9"
	current := nodeRecord(same, 10, 5, false)
	current.Protocol = cluster.Protocol
	db.nodes = []postgres.Node{future, current}
	db.templates = []*store.Template{{ID: "tpl", Name: "base", NodeID: "newer", Upload: store.UploadUploaded}}
	g := newTestGateway(t, db)
	ctx := context.Background()

	for range 3 {
		w := call(t, g, ctx, http.MethodPost, "/sandboxes", "", map[string]string{"templateID": "base"})
		if w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), "sb-same") {
			t.Fatalf("create: %d %s, want 201 on the compatible node", w.Code, w.Body)
		}
	}
	if n := newer.count("POST /sandboxes"); n != 0 {
		t.Fatalf("the incompatible node was asked %d times", n)
	}

	w := call(t, g, ctx, http.MethodGet, "/cluster/nodes", "", nil)
	var nodes []wire.ClusterNode
	if err := json.Unmarshal(w.Body.Bytes(), &nodes); err != nil || len(nodes) != 2 {
		t.Fatalf("nodes: %d %s (%v)", w.Code, w.Body, err)
	}
	for _, n := range nodes {
		switch n.ID {
		case "newer":
			if n.State != wire.ClusterNodeStateIncompatible || n.Protocol != cluster.Protocol+1 ||
				!strings.Contains(n.StateReason, "v9.9.9") {
				t.Errorf("incompatible node shown as %+v", n)
			}
		case "same":
			if n.State != wire.ClusterNodeStateReady || n.StateReason != "" {
				t.Errorf("compatible node shown as %+v", n)
			}
		}
	}

	// Held only by the incompatible node (not in the object store): the
	// refusal says which node and why.
	db.templates = []*store.Template{{ID: "tpl2", Name: "only-newer", NodeID: "newer"}}
	w = call(t, g, ctx, http.MethodPost, "/sandboxes", "", map[string]string{"templateID": "only-newer"})
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(errorMessage(w), "incompatible: newer") {
		t.Fatalf("create held by the incompatible node only: %d %q", w.Code, errorMessage(w))
	}
}
