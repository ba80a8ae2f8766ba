package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// TestClusterVolumeMove: through a gateway, a volume nothing mounts moves
// to another node (its files, size and token with it; its old files
// removed), and its sandboxes then go there; a mounted one does not move.
// The nodes keep their volumes in pools.
func TestClusterVolumeMove(t *testing.T) {
	c := newCluster(t)
	nodes := map[string]*server{
		"node-a": c.addNode("node-a", "--volume-pool-gb", "1"),
		"node-b": c.addNode("node-b", "--volume-pool-gb", "1"),
	}
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	gw := &server{t: t, url: g.url, checked: &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}}

	type volumeInfo struct {
		VolumeID, Name, Token, NodeID string
		SizeMB                        int64
	}
	var v volumeInfo
	gw.expect(gw.do("POST", "/volumes", map[string]any{"name": "repo", "sizeMB": 64}), 201, "create").json(t, &v)
	from := v.NodeID
	to := map[string]string{"node-a": "node-b", "node-b": "node-a"}[from]
	if to == "" {
		t.Fatalf("the volume's node: %+v", v)
	}
	bearer := []string{"Authorization", "Bearer " + v.Token, "X-API-Key", ""}
	gw.expect(gw.do("PUT", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt&force=true&uid=1000&gid=1000", "moved with it\n", bearer...), 200, "write")

	// Mounted: not moved.
	mounting := gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "repo", "path": "/repo"}}}), 201, "create a sandbox mounting it")
	var mounted client.Sandbox
	mounting.json(t, &mounted)
	if node, _ := g.sandboxNode(t, mounted.SandboxID); node != from {
		t.Fatalf("a sandbox mounting a volume of %s was placed on %s", from, node)
	}
	r := gw.expect(gw.do("POST", "/volumes/repo/move", map[string]any{"nodeID": to}), 409, "move a mounted volume")
	if !strings.Contains(string(r.body), mounted.SandboxID) {
		t.Errorf("the refusal does not name the sandbox: %s", r.body)
	}
	gw.expect(gw.do("DELETE", "/sandboxes/"+mounted.SandboxID, nil), 204, "kill")

	// Bad targets.
	gw.expect(gw.do("POST", "/volumes/repo/move", map[string]any{"nodeID": from}), 400, "move to its own node")
	gw.expect(gw.do("POST", "/volumes/repo/move", map[string]any{"nodeID": "node-zz"}), 404, "move to no node")
	gw.expect(gw.do("POST", "/volumes/no-such/move", map[string]any{}), 404, "move of no volume")
	// A node's export and import are the gateways' only.
	nodes[from].expect(nodes[from].do("GET", "/volumes/"+v.VolumeID+"/export", nil, "X-API-Key", ""), 401, "export without a key")

	// Moved (to the readiest other node: the only one).
	var moved volumeInfo
	gw.expect(gw.do("POST", "/volumes/repo/move", nil), 200, "move").json(t, &moved)
	if moved.NodeID != to || moved.Token != v.Token || moved.SizeMB != 64 {
		t.Fatalf("moved: %+v, want on %s with its token and size", moved, to)
	}
	var listed []volumeInfo
	gw.expect(gw.do("GET", "/volumes", nil), 200, "list").json(t, &listed)
	if len(listed) != 1 || listed[0].NodeID != to {
		t.Errorf("listed: %+v", listed)
	}
	if got := gw.expect(gw.do("GET", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", nil, bearer...), 200, "read"); string(got.body) != "moved with it\n" {
		t.Errorf("read after the move: %q", got.body)
	}
	if _, err := os.Stat(filepath.Join(nodes[from].dataDir, "volumes", v.VolumeID)); !os.IsNotExist(err) {
		t.Errorf("the old node kept the volume's files: %v", err)
	}
	// Its sandboxes go to its new node, and see its files, owners kept.
	gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "repo", "path": "/repo"}}}), 201, "create after the move").json(t, &mounted)
	if node, _ := g.sandboxNode(t, mounted.SandboxID); node != to {
		t.Fatalf("after the move a sandbox mounting it was placed on %s, want %s", node, to)
	}
	res, err := g.api.Execute(t.Context(), mounted.SandboxID, client.ExecuteRequest{Command: "stat -c '%u %s' /repo/src/main.txt && echo more >> /repo/src/main.txt"})
	if err != nil || res.Stdout != "1000 14\n" {
		t.Errorf("inside a sandbox after the move: %+v %v", res, err)
	}
	gw.expect(gw.do("DELETE", "/sandboxes/"+mounted.SandboxID, nil), 204, "kill")
	gw.expect(gw.do("DELETE", "/volumes/repo", nil), 204, "delete")
}
