package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// A team's template names are one namespace across a cluster, as on a
// single server: a name taken on one node is refused on every other, to
// every team, before any checkpoint; a create by the name goes to its one
// record; and a template rebuilt on another node (its first node drained)
// takes the name over from the first node's uploaded record, leaving one.
func TestTeamNamesThroughGateways(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	c := newCluster(t)
	a, b := c.sharedNode("node-a", srv), c.sharedNode("node-b", srv)
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	e, onA, onB := newEndpoint(t, g.url), newEndpoint(t, a.url), newEndpoint(t, b.url)
	keyA, _ := e.makeTeam("team-a")
	keyB, _ := e.makeTeam("team-b")
	var sbA, sbA2, sbB struct {
		SandboxID string `json:"sandboxID"`
	}
	// Straight to a node, a key acts for a team as the operator's with the
	// team's header (what a gateway sends).
	asA, asB := []string{api.HeaderTeam, "team-a"}, []string{api.HeaderTeam, "team-b"}
	onA.want(201, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base"}, asA...).json(t, &sbA)
	onB.want(201, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base"}, asA...).json(t, &sbA2)
	onB.want(201, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base"}, asB...).json(t, &sbB)

	onA.want(201, apiKey, "POST", "/sandboxes/"+sbA.SandboxID+"/snapshots", map[string]any{"name": "app"}, asA...)
	// Refused on the other node whatever the upload's state, to the
	// other team and to the same.
	onB.want(409, apiKey, "POST", "/sandboxes/"+sbB.SandboxID+"/snapshots", map[string]any{"name": "app"}, asB...)
	onB.want(409, apiKey, "POST", "/templates", map[string]any{"sandboxID": sbB.SandboxID, "name": "app"}, asB...)
	onB.want(409, apiKey, "POST", "/sandboxes/"+sbA2.SandboxID+"/snapshots", map[string]any{"name": "app"}, asA...)
	e.want(409, keyB, "POST", "/sandboxes/"+sbB.SandboxID+"/snapshots", map[string]any{"name": "app"})
	// Through the gateway the name is A's alone: B is answered 404 by
	// the gateway itself, before its limits are looked at (at its limit,
	// a 429 would tell B that the name is a template).
	e.want(200, apiKey, "PATCH", "/teams/team-b", map[string]any{"maxSandboxes": 1})
	e.want(429, keyB, "POST", "/sandboxes", map[string]any{"templateID": "base"})
	e.want(404, keyB, "POST", "/sandboxes", map[string]any{"templateID": "app"})
	e.want(200, apiKey, "PATCH", "/teams/team-b", map[string]any{"maxSandboxes": 0})
	var fromApp struct {
		SandboxID string `json:"sandboxID"`
	}
	e.want(201, keyA, "POST", "/sandboxes", map[string]any{"templateID": "app"}).json(t, &fromApp)
	e.want(204, keyA, "DELETE", "/sandboxes/"+fromApp.SandboxID, nil)

	// An E2B template built on node-a (builds gather on the first ready
	// node), uploaded, then rebuilt while node-a is drained: the rebuild
	// runs on node-b and replaces node-a's record.
	build := func(step string) {
		t.Helper()
		var bl struct {
			BuildID string `json:"buildID"`
		}
		e.want(202, keyA, "POST", "/v3/templates", map[string]any{"name": "built"}).json(t, &bl)
		e.want(202, keyA, "POST", "/v2/templates/built/builds/"+bl.BuildID, map[string]any{
			"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{step}}}})
		var st struct {
			Status string `json:"status"`
			Reason *struct {
				Message string `json:"message"`
			} `json:"reason"`
		}
		waitFor(t, 3*time.Minute, "the build of built to end", func() bool {
			e.want(200, keyA, "GET", "/templates/built/builds/"+bl.BuildID+"/status", nil).json(t, &st)
			return st.Status == "error" || st.Status == "ready"
		})
		if st.Status != "ready" {
			t.Fatalf("build of built (%s): status %s, reason %+v", step, st.Status, st.Reason)
		}
	}
	var firstID string
	records := func() (out []string) {
		t.Helper()
		db, err := postgres.OpenWith(context.Background(), c.dsn, "", postgres.Options{SecretsKey: c.key})
		if err != nil {
			t.Fatalf("open the cluster database: %v", err)
		}
		defer db.Close()
		all, err := db.ListTemplates(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, tpl := range all {
			if tpl.Name == "built" {
				out = append(out, tpl.NodeID+":"+string(tpl.Upload))
				if tpl.NodeID == "node-a" {
					firstID = tpl.ID
				}
			}
		}
		return out
	}
	build("echo one > /home/user/built")
	waitFor(t, 3*time.Minute, "the first build uploaded", func() bool {
		got := records()
		return len(got) == 1 && got[0] == "node-a:uploaded"
	})
	firstImage := filepath.Join(a.dataDir, "images", firstID)
	if _, err := os.Stat(firstImage); err != nil {
		t.Fatalf("the first build's image on node-a: %v", err)
	}
	if err := g.api.DrainNode(context.Background(), "node-a", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-a drained", func() bool { return g.nodeStates(t)["node-a"].State == "draining" })
	build("echo two > /home/user/built")
	if got := records(); len(got) != 1 || !strings.HasPrefix(got[0], "node-b:") {
		t.Fatalf("records named built after the rebuild on node-b: %v, want node-b's alone", got)
	}
	// node-a makes sandboxes of it once it is in the object store.
	waitFor(t, 3*time.Minute, "the rebuild uploaded", func() bool {
		got := records()
		return len(got) == 1 && got[0] == "node-b:uploaded"
	})
	if err := g.api.DrainNode(context.Background(), "node-a", false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-a undrained", func() bool { return g.nodeStates(t)["node-a"].State == "ready" })
	// Created by the name on either node, the sandbox runs the rebuild.
	for _, on := range []endpoint{onA, onB, e} {
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		var r response
		// node-a learns of its undrain with its next heartbeat.
		waitFor(t, 30*time.Second, "a create of built through "+on.url, func() bool {
			r = on.call(apiKey, "POST", "/sandboxes", map[string]any{"templateID": "built"}, asA...)
			return r.status != 503
		})
		if r.status != 201 {
			t.Fatalf("create of built through %s: status %d; body %s", on.url, r.status, truncate(r.body))
		}
		r.json(t, &sb)
		var res struct {
			Stdout string `json:"stdout"`
		}
		e.want(200, keyA, "POST", "/sandboxes/"+sb.SandboxID+"/execute", map[string]any{"command": "cat /home/user/built"}).json(t, &res)
		if res.Stdout != "two\n" {
			t.Errorf("a sandbox of built through %s reads %q, want the rebuild's \"two\\n\"", on.url, res.Stdout)
		}
		e.want(204, keyA, "DELETE", "/sandboxes/"+sb.SandboxID, nil)
	}
	// node-a's copy of the replaced record's image goes with its next
	// sweep (a minute apart).
	waitFor(t, 3*time.Minute, "node-a to remove the replaced record's image", func() bool {
		_, err := os.Stat(firstImage)
		return errors.Is(err, os.ErrNotExist)
	})
}
