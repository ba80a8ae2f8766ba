package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// TestClusterVolumeMove: through a gateway, a volume nothing mounts moves
// to another node (its files, size and token with it; its old files
// removed), and its sandboxes then go there; a mounted one does not move.
// A create moves the volumes it names to one node, and away from a
// drained one.
// The nodes keep their volumes in pools.
func TestClusterVolumeMove(t *testing.T) {
	t.Parallel()
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

	ctx := t.Context()
	// Volumes of two nodes: one moves to the other's.
	var cache volumeInfo
	gw.expect(gw.do("POST", "/volumes", map[string]any{"name": "cache"}), 201, "create cache").json(t, &cache)
	if cache.NodeID != from {
		gw.expect(gw.do("POST", "/volumes/cache/move", map[string]any{"nodeID": from}), 200, "move cache").json(t, &cache)
	}
	gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base", "volumeMounts": []map[string]any{
		{"name": "repo", "path": "/repo"}, {"name": "cache", "path": "/cache"}}}), 201, "create mounting volumes of two nodes").json(t, &mounted)
	node, _ := g.sandboxNode(t, mounted.SandboxID)
	for _, name := range []string{"repo", "cache"} {
		var got volumeInfo
		if gw.expect(gw.do("GET", "/volumes/"+name, nil), 200, "get").json(t, &got); got.NodeID != node {
			t.Errorf("volume %s is on %s, its sandbox on %s", name, got.NodeID, node)
		}
	}
	res, err = g.api.Execute(ctx, mounted.SandboxID, client.ExecuteRequest{Command: "cat /repo/src/main.txt && touch /cache/x"})
	if err != nil || res.Stdout != "moved with it\nmore\n" {
		t.Errorf("inside a sandbox mounting volumes brought together: %+v %v", res, err)
	}
	gw.expect(gw.do("DELETE", "/sandboxes/"+mounted.SandboxID, nil), 204, "kill")

	// Their node drained: a create that mounts them moves them to a node
	// that can take the sandbox (the gateway's --move-volumes, on by
	// default).
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}[node]
	if err := g.api.DrainNode(ctx, node, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, node+" drained", func() bool { return g.nodeStates(t)[node].State == "draining" })
	gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "repo", "path": "/repo"}, {"name": "cache", "path": "/cache"}}}), 201, "create on a drained volumes' node").json(t, &mounted)
	if got, _ := g.sandboxNode(t, mounted.SandboxID); got != other {
		t.Fatalf("with its volume's node drained a sandbox was placed on %s, want %s", got, other)
	}
	gw.expect(gw.do("GET", "/volumes/repo", nil), 200, "get").json(t, &moved)
	if moved.NodeID != other {
		t.Errorf("the volume after the create: on %s, want %s", moved.NodeID, other)
	}
	res, err = g.api.Execute(ctx, mounted.SandboxID, client.ExecuteRequest{Command: "cat /repo/src/main.txt && ls /cache"})
	if err != nil || res.Stdout != "moved with it\nmore\nx\n" {
		t.Errorf("inside a sandbox after the move on create: %+v %v", res, err)
	}
	gw.expect(gw.do("DELETE", "/sandboxes/"+mounted.SandboxID, nil), 204, "kill")

	// A move that answers once begun (wait: false) goes on after its
	// answer; the volume shows where it goes until it is there.
	if err := g.api.DrainNode(ctx, node, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, node+" ready", func() bool { return g.nodeStates(t)[node].State == "ready" })
	var begun struct {
		NodeID, MovingTo string
	}
	gw.expect(gw.do("POST", "/volumes/repo/move", map[string]any{"wait": false}), 202, "move in the background").json(t, &begun)
	if begun.NodeID != other || begun.MovingTo != node {
		t.Fatalf("a move begun: %+v, want on %s moving to %s", begun, other, node)
	}
	waitFor(t, time.Minute, "the background move to end", func() bool {
		var now struct{ NodeID, MovingTo string }
		gw.expect(gw.do("GET", "/volumes/repo", nil), 200, "get").json(t, &now)
		return now.NodeID == node && now.MovingTo == ""
	})
	gw.expect(gw.do("GET", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", nil, bearer...), 200, "read after the background move")

	gw.expect(gw.do("DELETE", "/volumes/cache", nil), 204, "delete cache")
	gw.expect(gw.do("DELETE", "/volumes/repo", nil), 204, "delete")
}
