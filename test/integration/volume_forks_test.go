package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// TestClusterSnapshotForkCopies: through a gateway, a fork of a snapshot
// whose every volume is copied is spread over the nodes: the children on
// the snapshot's node copy its volume there, the others copy a copy the
// gateway brought to their node (one per node), and every child has the
// snapshot's memory, the volume's files as they were at the fork, and
// writes of its own. The copies brought are gone afterwards. A fork that
// shares the volume, and a create, stay on the volume's node. The nodes
// keep volumes without a pool, so the copy moved is a layered one.
func TestClusterSnapshotForkCopies(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	c := newCluster(t)
	nodes := map[string]*server{"node-a": c.sharedNode("node-a", srv), "node-b": c.sharedNode("node-b", srv)}
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	gw := &server{t: t, url: g.url, checked: &http.Client{Transport: wiretest.Transport(t, client.NewHTTPClient(4).Transport)}}

	var v struct{ VolumeID, Name, Token, NodeID string }
	gw.expect(gw.do("POST", "/volumes", map[string]any{"name": "ws"}), 201, "create").json(t, &v)
	bearer := []string{"Authorization", "Bearer " + v.Token, "X-API-Key", ""}
	gw.expect(gw.do("PUT", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt&force=true&uid=1000&gid=1000", "base\n", bearer...), 200, "seed")

	var parent client.Sandbox
	gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "ws", "path": "/ws"}}}), 201, "create the parent").json(t, &parent)
	if res, err := g.api.Execute(t.Context(), parent.SandboxID, client.ExecuteRequest{Command: "echo prepared > /tmp/state"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("prepare the parent: %+v %v", res, err)
	}
	snap, err := g.api.CreateSnapshot(t.Context(), parent.SandboxID, "prep")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the snapshot with a volume uploaded", func() bool {
		state, _ := templateUpload(t, g, snap.SnapshotID)
		return state == "uploaded"
	})
	// Without a pool the volume is copied only once no sandbox mounts it.
	gw.expect(gw.do("DELETE", "/sandboxes/"+parent.SandboxID, nil), 204, "kill the parent")
	gw.expect(gw.do("PUT", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", "at the fork\n", bearer...), 200, "write after the snapshot")

	var items []client.ForkResult
	gw.expect(gw.do("POST", "/snapshots/prep/fork", map[string]any{"count": 4, "volumes": map[string]string{"/ws": "copy"}}),
		201, "fork with copies across nodes").json(t, &items)
	byNode := map[string][]string{}
	var kids []string
	copies := map[string]bool{}
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("fork child failed: %+v", it.Error)
		}
		id := it.Sandbox.SandboxID
		kids = append(kids, id)
		node, _ := g.sandboxNode(t, id)
		byNode[node] = append(byNode[node], id)
		var info client.Sandbox
		gw.expect(gw.do("GET", "/sandboxes/"+id, nil), 200, "get a child").json(t, &info)
		if len(info.VolumeMounts) != 1 || !strings.HasPrefix(info.VolumeMounts[0].Name, "ws-copy-") {
			t.Fatalf("child %s mounts %+v, want its own copy of ws", id, info.VolumeMounts)
		}
		copies[info.VolumeMounts[0].Name] = true
		res, err := g.api.Execute(t.Context(), id, client.ExecuteRequest{
			Command: "cat /tmp/state /ws/src/main.txt && stat -c %u /ws/src/main.txt && echo " + id + " > /ws/src/main.txt"})
		if err != nil || res.Stdout != "prepared\nat the fork\n1000\n" {
			t.Errorf("child %s on %s: %+v %v, want the snapshot's memory and the volume at the fork", id, node, res, err)
		}
	}
	if len(byNode) != 2 {
		t.Fatalf("children by node: %v, want children on both nodes", byNode)
	}
	for _, id := range kids {
		if res, err := g.api.Execute(t.Context(), id, client.ExecuteRequest{Command: "cat /ws/src/main.txt"}); err != nil || res.Stdout != id+"\n" {
			t.Errorf("child %s reads %+v %v, want its own write", id, res, err)
		}
	}
	if got := gw.expect(gw.do("GET", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", nil, bearer...), 200, "read ws"); string(got.body) != "at the fork\n" {
		t.Errorf("ws reads %q after the children wrote", got.body)
	}
	// The copies brought to the other node are gone: the team keeps ws and
	// its children's copies.
	var listed []struct{ Name, NodeID string }
	gw.expect(gw.do("GET", "/volumes", nil), 200, "list").json(t, &listed)
	for _, l := range listed {
		if l.Name != "ws" && !copies[l.Name] {
			t.Errorf("volume %s on %s is left over from the fork", l.Name, l.NodeID)
		}
	}
	if len(listed) != 1+len(kids) {
		t.Errorf("volumes after the fork: %+v, want ws and one copy per child", listed)
	}

	// Shared, or started: on the volume's node.
	items = nil
	gw.expect(gw.do("POST", "/snapshots/prep/fork", map[string]any{"count": 2}), 201, "fork sharing the volume").json(t, &items)
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("shared fork child failed: %+v", it.Error)
		}
		kids = append(kids, it.Sandbox.SandboxID)
		if node, _ := g.sandboxNode(t, it.Sandbox.SandboxID); node != v.NodeID {
			t.Errorf("a child sharing ws is on %s, ws on %s", node, v.NodeID)
		}
	}
	var started client.Sandbox
	gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "prep"}), 201, "start the snapshot").json(t, &started)
	kids = append(kids, started.SandboxID)
	if node, _ := g.sandboxNode(t, started.SandboxID); node != v.NodeID {
		t.Errorf("a sandbox of the snapshot is on %s, ws on %s", node, v.NodeID)
	}
	// The other node, asked directly, starts or forks it only with every
	// volume a copy brought there.
	other := nodes[map[string]string{"node-a": "node-b", "node-b": "node-a"}[v.NodeID]]
	for _, call := range []struct {
		path string
		body map[string]any
	}{
		{"/sandboxes", map[string]any{"templateID": snap.SnapshotID}},
		{"/snapshots/" + snap.SnapshotID + "/fork", map[string]any{"count": 1}},
		{"/snapshots/" + snap.SnapshotID + "/fork", map[string]any{"count": 1, "volumes": map[string]string{"/ws": "copy"}}},
	} {
		r := other.expect(other.do("POST", call.path, call.body), 503, "another node's snapshot with volumes, on its own")
		if !strings.Contains(string(r.body), "mounts volumes of node "+v.NodeID) {
			t.Errorf("POST %s on the other node: %s", call.path, r.body)
		}
	}
	// A gateway's own field is not the caller's, however spelt.
	for _, field := range []string{"copySources", "copysources", "CopySources"} {
		gw.expect(gw.do("POST", "/snapshots/prep/fork", map[string]any{"count": 2, "volumes": map[string]string{"/ws": "copy"},
			field: map[string]string{"/ws": v.VolumeID}}), 400, "a fork naming copy sources")
	}
	// Another team cannot fork it, and nothing of the team's is copied
	// for its try.
	gw.expect(gw.do("POST", "/teams", map[string]any{"teamID": "intruder"}), 201, "create a team")
	var k struct{ Key string }
	gw.expect(gw.do("POST", "/api-keys", map[string]any{"teamID": "intruder"}), 201, "a key of the team").json(t, &k)
	gw.expect(gw.do("POST", "/snapshots/"+snap.SnapshotID+"/fork", map[string]any{"count": 4, "volumes": map[string]string{"/ws": "copy"}},
		"X-API-Key", k.Key), 404, "another team's fork of the snapshot")
	var after []struct{ Name string }
	gw.expect(gw.do("GET", "/volumes", nil), 200, "list").json(t, &after)
	if len(after) != len(listed) {
		t.Errorf("volumes after another team's fork: %+v, want the %d before", after, len(listed))
	}

	for _, id := range kids {
		gw.expect(gw.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
	}
	for name := range copies {
		gw.expect(gw.do("DELETE", "/volumes/"+name, nil), 204, "delete a copy")
	}
	gw.expect(gw.do("DELETE", "/templates/prep", nil), 204, "delete the snapshot")
	gw.expect(gw.do("DELETE", "/volumes/ws", nil), 204, "delete ws")
}
