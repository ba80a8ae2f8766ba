package integration

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// Templates and snapshots shared through a real S3 server (weed): a
// snapshot taken on one node is uploaded in the background and then
// restored, memory and all, on the others; deleting it deletes its
// objects; an upload made while the store is down is retried and lands
// when it is back, while the snapshot serves on its own node meanwhile.

const sharedBucket = "aenv-it"

// memoryKeeper holds 32 MiB of random bytes in a process's memory and
// answers the SHA-256 of them (recomputed per request) on 127.0.0.1:7000;
// the digest at start is written to /tmp/want. A restored copy that
// answers the same digest has the same memory.
const memoryKeeper = `nohup python3 -c '
import hashlib, os, http.server
buf = os.urandom(32 << 20)
open("/tmp/want", "w").write(hashlib.sha256(buf).hexdigest())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = hashlib.sha256(buf).hexdigest().encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 7000), H).serve_forever()
' >/dev/null 2>&1 &`

// sharedNode adds a cluster node using the object store of srv.
func (c *cluster) sharedNode(id string, srv *s3test.Server, extra ...string) *server {
	c.t.Helper()
	s := newServer(c.t, append([]string{"--max-memory-percent", "1000",
		"--object-store", "s3://" + sharedBucket + "/cluster", "--object-store-endpoint", srv.Endpoint}, extra...)...)
	s.env = []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKeyID, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretAccessKey,
		"AENV_SECRETS_KEY_FILE=" + c.keyFile}
	s.cluster = &nodeOf{dsn: c.dsn, id: id, key: c.key}
	s.start()
	c.nodes = append(c.nodes, s)
	return s
}

// startMemoryKeeper starts the memory keeper in sandbox id on s and
// returns its digest once it answers.
func startMemoryKeeper(t testing.TB, s *server, id string) (want string) {
	t.Helper()
	s.exec(id, client.ExecuteRequest{Command: memoryKeeper})
	waitFor(t, time.Minute, "memory keeper answering", func() bool {
		res, err := s.api.Execute(context.Background(), id, client.ExecuteRequest{
			Command: "curl -s --max-time 5 http://127.0.0.1:7000/"})
		if err != nil || len(strings.TrimSpace(res.Stdout)) != 64 {
			return false
		}
		want = strings.TrimSpace(res.Stdout)
		return true
	})
	return want
}

// memoryDigest asks the memory keeper in sandbox id for its digest.
func memoryDigest(t testing.TB, api *client.Client, id string) (got, want string) {
	t.Helper()
	res, err := api.Execute(context.Background(), id, client.ExecuteRequest{
		Command: "curl -s --max-time 20 http://127.0.0.1:7000/; echo; cat /tmp/want"})
	if err != nil {
		t.Fatalf("memory keeper in %s: %v", id, err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("memory keeper in %s: %q %q", id, res.Stdout, res.Stderr)
	}
	return lines[0], lines[1]
}

// templateUpload reads a template's upload state through a gateway.
func templateUpload(t testing.TB, g *gateway, id string) (state, msg string) {
	t.Helper()
	list, err := g.api.ListTemplates(context.Background())
	if err != nil {
		t.Fatalf("list templates: %v", err)
	}
	for _, tpl := range list {
		if tpl.TemplateID == id {
			return tpl.Upload, tpl.UploadError
		}
	}
	return "", "missing"
}

// objectKeys lists the keys in the bucket under prefix.
func objectKeys(t testing.TB, srv *s3test.Server, prefix string) []string {
	keys, _ := objectSizes(t, srv, prefix)
	return keys
}

// imageKeys lists an image's objects under prefix, leaving out the
// released-packs objects a deleted chunked image leaves for the collector's
// grace (see docs/object-storage.md).
func imageKeys(t testing.TB, srv *s3test.Server, prefix string) []string {
	var keys []string
	for _, k := range objectKeys(t, srv, prefix) {
		if !strings.Contains(k, "/@released-") {
			keys = append(keys, k)
		}
	}
	return keys
}

// objectSizes lists the keys in the bucket under prefix and the bytes
// they hold together.
func objectSizes(t testing.TB, srv *s3test.Server, prefix string) ([]string, int64) {
	t.Helper()
	out, err := srv.Client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{
		Bucket: aws.String(sharedBucket), Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatalf("list %s: %v", prefix, err)
	}
	var keys []string
	var total int64
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
		total += aws.ToInt64(o.Size)
	}
	return keys, total
}

func TestClusterSharedSnapshot(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv)
	// node-b restores from images still arriving (--lazy-restore, the
	// default), node-c fetches them whole first: the memory digests below
	// hold for both.
	b := c.sharedNode("node-b", srv, "--lazy-restore")
	cn := c.sharedNode("node-c", srv, "--lazy-restore=false")
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b", "node-c")

	src := a.create(map[string]any{"templateID": "base"}).SandboxID
	want := startMemoryKeeper(t, a, src)

	snap, err := g.api.CreateSnapshot(context.Background(), src, "shared-snap")
	if err != nil {
		t.Fatalf("snapshot through the gateway: %v", err)
	}
	if snap.Upload != "pending" {
		t.Errorf("snapshot answered with upload %q, want pending (the upload runs after the answer)", snap.Upload)
	}
	taken := time.Now()
	waitFor(t, 3*time.Minute, "snapshot uploaded", func() bool {
		state, msg := templateUpload(t, g, snap.SnapshotID)
		if state == "failed" {
			t.Logf("upload attempt failed (retried): %s", msg)
		}
		return state == "uploaded"
	})
	t.Logf("snapshot uploaded %v after it was taken (its root filesystem too)", time.Since(taken).Round(time.Millisecond))
	keys, indexBytes := objectSizes(t, srv, "cluster/images/templates/"+snap.SnapshotID+"/")
	if len(keys) == 0 {
		t.Fatalf("no objects for the uploaded snapshot")
	}
	_, imageBytes := objectSizes(t, srv, "cluster/chunks/")
	imageBytes += indexBytes
	rootfsKeys, rootfsBytes := objectSizes(t, srv, "cluster/images/rootfs/")
	if len(rootfsKeys) == 0 {
		t.Fatalf("the snapshot's root filesystem was not uploaded")
	}
	t.Logf("stored: image %d MB, root filesystem %d MB (compressed)", imageBytes>>20, rootfsBytes>>20)

	// Created from it straight on the nodes that do not have it: the
	// first fetches the image (cold cache), the next reads the cache.
	for _, n := range []*server{b, cn} {
		for i, what := range []string{"cold", "warm"} {
			start := time.Now()
			id := n.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
			t.Logf("%s: create from the snapshot (%s cache) took %v", n.cluster.id, what, time.Since(start).Round(time.Millisecond))
			got, wantFile := memoryDigest(t, n.api, id)
			if got != want || wantFile != want {
				t.Errorf("%s create %d: memory digest %q, file %q, want %q", n.cluster.id, i, got, wantFile, want)
			}
		}
	}
	// By name through the gateway, with node-a drained: placed elsewhere.
	if err := g.api.DrainNode(context.Background(), "node-a", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "node-a draining", func() bool { return g.nodeStates(t)["node-a"].State == "draining" })
	for range 2 {
		sb, err := g.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "shared-snap"})
		if err != nil {
			t.Fatalf("create from the snapshot by name through the gateway: %v", err)
		}
		if node, _ := g.sandboxNode(t, sb.SandboxID); node == "node-a" {
			t.Errorf("create from the shared snapshot landed on the drained node")
		}
	}
	if err := g.api.DrainNode(context.Background(), "node-a", false); err != nil {
		t.Fatal(err)
	}
	// The node learns of the undrain at its next heartbeat.
	waitFor(t, time.Minute, "node-a taking sandboxes again", func() bool {
		_, err := a.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
		return err == nil
	})
	waitFor(t, time.Minute, "node-a ready", func() bool { return g.nodeStates(t)["node-a"].State == "ready" })

	// A fork of the snapshot is split over the three nodes; every child
	// has the parent's memory.
	start := time.Now()
	children, err := g.api.ForkSnapshot(context.Background(), snap.SnapshotID, 12)
	if err != nil {
		t.Fatalf("fork of 12 across the cluster: %v", err)
	}
	t.Logf("fork of 12 across three nodes took %v", time.Since(start).Round(time.Millisecond))
	perNode := map[string]int{}
	for i, ch := range children {
		if ch.Error != nil {
			t.Errorf("child %d: %d %s", i, ch.Error.Code, ch.Error.Message)
			continue
		}
		node, _ := g.sandboxNode(t, ch.Sandbox.SandboxID)
		perNode[node]++
		if got, wantFile := memoryDigest(t, g.api, ch.Sandbox.SandboxID); got != want || wantFile != want {
			t.Errorf("child %d on %s: memory digest %q, file %q, want %q", i, node, got, wantFile, want)
		}
	}
	if len(children) != 12 || len(perNode) != 3 {
		t.Errorf("fork of 12: %d answers over nodes %v, want 12 over all three", len(children), perNode)
	}
	t.Logf("children per node: %v", perNode)

	// A node cannot delete another's template; the gateway sends the
	// delete to its owner, which removes the objects.
	r := b.doNoFail("DELETE", "/templates/"+snap.SnapshotID, nil)
	if r.status != 409 {
		t.Errorf("delete of node-a's snapshot on node-b: %d %s, want 409", r.status, truncate(r.body))
	}
	if err := g.api.DeleteTemplate(context.Background(), snap.SnapshotID); err != nil {
		t.Fatalf("delete the snapshot: %v", err)
	}
	if keys := imageKeys(t, srv, "cluster/images/templates/"+snap.SnapshotID+"/"); len(keys) != 0 {
		t.Errorf("objects of the deleted snapshot left: %v", keys)
	}
	var apiErr *client.APIError
	if _, err := b.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: snap.SnapshotID}); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("create from the deleted snapshot on node-b: %v, want 404", err)
	}

	// Node a dies and is removed for good: a snapshot of its in the store
	// stays listed and usable, and deleting it removes the record.
	kept, err := g.api.CreateSnapshot(context.Background(), src, "kept-snap")
	if err != nil {
		t.Fatal(err)
	}
	waitUploaded(t, g, kept.SnapshotID)
	a.stop(syscall.SIGKILL)
	defer func() {
		if a.cmd == nil {
			a.start() // comes back with no records: it removes what it still runs
		}
	}()
	waitFor(t, 3*nodeTimeout+5*time.Second, "node-a unreachable", func() bool {
		return g.nodeStates(t)["node-a"].State == "unreachable"
	})
	if err := g.api.RemoveNode(context.Background(), "node-a"); err != nil {
		t.Fatalf("remove node-a: %v", err)
	}
	if state, _ := templateUpload(t, g, kept.SnapshotID); state != "uploaded" {
		t.Fatalf("a removed node's uploaded snapshot is not listed (upload %q)", state)
	}
	sb, err := g.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "kept-snap"})
	if err != nil {
		t.Fatalf("create from a removed node's snapshot: %v", err)
	}
	if got, _ := memoryDigest(t, g.api, sb.SandboxID); got != want {
		t.Errorf("memory of a sandbox from a removed node's snapshot: %q, want %q", got, want)
	}
	if err := g.api.DeleteTemplate(context.Background(), kept.SnapshotID); err != nil {
		t.Fatalf("delete a removed node's snapshot: %v", err)
	}
	if state, msg := templateUpload(t, g, kept.SnapshotID); msg != "missing" {
		t.Errorf("deleted snapshot still listed (upload %q)", state)
	}
	a.start()
	g.waitReady(t, "node-a")
	waitFor(t, time.Minute, "node-a's old sandboxes reclaimed", func() bool { return runscProcesses(src) == 0 })
}

// The store down during an upload: the snapshot serves on its own node
// at once, its record says the upload failed, and it is uploaded by itself
// once the store is back.
func TestClusterSharedUploadRetried(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv)
	b := c.sharedNode("node-b", srv)
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")

	src := a.create(map[string]any{"templateID": "base"}).SandboxID
	a.exec(src, client.ExecuteRequest{Command: "echo kept > /tmp/mark"})
	srv.Stop()
	snap, err := a.api.CreateSnapshot(context.Background(), src, "")
	if err != nil {
		t.Fatalf("snapshot with the store down: %v", err)
	}
	local := a.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
	if out := a.exec(local, client.ExecuteRequest{Command: "cat /tmp/mark"}).Stdout; strings.TrimSpace(out) != "kept" {
		t.Errorf("restored on its own node with the store down: %q", out)
	}
	waitFor(t, 2*time.Minute, "upload failure recorded", func() bool {
		state, msg := templateUpload(t, g, snap.SnapshotID)
		return state == "failed" && msg != ""
	})
	var apiErr *client.APIError
	if _, err := b.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: snap.SnapshotID}); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("create on node-b before the upload: %v, want 404", err)
	}
	srv.Start()
	back := time.Now()
	waitFor(t, 3*time.Minute, "upload retried", func() bool {
		state, _ := templateUpload(t, g, snap.SnapshotID)
		return state == "uploaded"
	})
	t.Logf("uploaded %v after the store came back", time.Since(back).Round(time.Millisecond))
	id := b.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
	if out := b.exec(id, client.ExecuteRequest{Command: "cat /tmp/mark"}).Stdout; strings.TrimSpace(out) != "kept" {
		t.Errorf("restored on node-b after the retried upload: %q", out)
	}
}

// A sandbox paused to disk outlives its node: its image is uploaded, and
// when the node is killed for good a resume through the gateway restores
// it on another node, memory intact; the record and the route move with
// it, and its stored image is removed once it runs again.
func TestClusterSharedResumeElsewhere(t *testing.T) {
	t.Parallel()
	resumeElsewhere(t, nil)
}

// The same over root images (--root-image): node-b makes the images again
// (their directory emptied after node-a's end) and restores over them,
// since the same files make the same image. (The suite's nodes share the
// template cache, so node-b reads the same rootfs directory; that a rootfs
// copied with its times makes the same image is TestRootImages'.)
func TestClusterRootImageResumeElsewhere(t *testing.T) {
	t.Parallel()
	images := t.TempDir()
	resumeElsewhere(t, []string{"--root-image", "--root-image-dir", images}, func() {
		entries, err := os.ReadDir(images)
		if err != nil || len(entries) == 0 {
			t.Fatalf("node-a made no root image: %v %v", entries, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(images, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// resumeElsewhere runs TestClusterSharedResumeElsewhere with nodes given
// extra flags; the afterKill functions run once node-a is killed.
func resumeElsewhere(t *testing.T, extra []string, afterKill ...func()) {
	srv := s3test.Start(t)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv, extra...)
	b := c.sharedNode("node-b", srv, extra...)
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")

	id := a.create(map[string]any{"templateID": "base", "timeout": 600}).SandboxID
	want := startMemoryKeeper(t, a, id)
	if err := g.api.Pause(context.Background(), id, client.PauseRequest{ToDisk: true}); err != nil {
		t.Fatalf("pause to disk: %v", err)
	}
	paused := time.Now()
	waitFor(t, 3*time.Minute, "image of the paused sandbox uploaded", func() bool {
		keys := objectKeys(t, srv, "cluster/images/sandboxes/"+id+"/")
		return len(keys) > 0 && len(objectKeys(t, srv, "cluster/images/rootfs/")) > 0 &&
			a.sandboxUpload(t, id) == "uploaded"
	})
	t.Logf("paused sandbox's image uploaded %v after the pause", time.Since(paused).Round(time.Millisecond))

	// Node a is gone for good: its process killed (its sandbox, paused
	// to disk, has no process of its own).
	a.stop(syscall.SIGKILL)
	for _, f := range afterKill {
		f()
	}
	waitFor(t, 3*nodeTimeout+5*time.Second, "node-a unreachable", func() bool {
		return g.nodeStates(t)["node-a"].State == "unreachable"
	})
	start := time.Now()
	waitFor(t, time.Minute, "resumed elsewhere", func() bool {
		r := g.doNoFail(http.MethodPost, "/sandboxes/"+id+"/resume", map[string]any{})
		if r.status == http.StatusServiceUnavailable {
			return false // not silent long enough yet by the database's clock
		}
		if r.status != http.StatusCreated && r.status != http.StatusOK {
			t.Fatalf("resume: %d %s", r.status, truncate(r.body))
		}
		return true
	})
	t.Logf("resumed on another node %v after node-a was reported unreachable", time.Since(start).Round(time.Millisecond))
	if node, state := g.sandboxNode(t, id); node != "node-b" || state != "running" {
		t.Fatalf("after the resume: %s on %s, want running on node-b", state, node)
	}
	if res := b.exec(id, client.ExecuteRequest{Command: "echo here"}); strings.TrimSpace(res.Stdout) != "here" {
		t.Errorf("straight to node-b: %q", res.Stdout)
	}
	got, wantFile := memoryDigest(t, g.api, id)
	if got != want || wantFile != want {
		t.Errorf("memory after the move: digest %q, file %q, want %q", got, wantFile, want)
	}
	waitFor(t, time.Minute, "stored image removed after the resume", func() bool {
		return len(imageKeys(t, srv, "cluster/images/sandboxes/"+id+"/")) == 0
	})
	// Node a comes back: the sandbox is not its any more, and it removes
	// the image it held.
	old := filepath.Join(a.dataDir, "images", "pause-"+id)
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("node-a's image of the paused sandbox: %v", err)
	}
	a.start()
	g.waitReady(t, "node-a")
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("node-a kept the image of the sandbox it no longer holds: %v", err)
	}
	if node, _ := g.sandboxNode(t, id); node != "node-b" {
		t.Errorf("after node-a came back the sandbox shows on %s", node)
	}
	if err := g.api.DeleteSandbox(context.Background(), id); err != nil {
		t.Fatalf("kill the moved sandbox: %v", err)
	}
}

// sandboxUpload reads the upload state of a sandbox's image from s's
// database view (GET /sandboxes/{id} does not carry it; the cluster store
// does).
func (s *server) sandboxUpload(t testing.TB, id string) string {
	t.Helper()
	db, err := postgres.OpenWith(context.Background(), s.cluster.dsn, "", postgres.Options{SecretsKey: s.cluster.key})
	if err != nil {
		t.Fatalf("open the cluster database: %v", err)
	}
	defer db.Close()
	sb, err := db.GetSandbox(context.Background(), id)
	if err != nil {
		return ""
	}
	return string(sb.ImageUpload)
}

// An image template pulled on one node boots on another, which fetches its
// root filesystem from the store: files, owners and setuid bits intact
// (sudo works as the image's unprivileged user).
func TestClusterSharedImageTemplate(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	srv := s3test.Start(t)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv)
	b := c.sharedNode("node-b", srv)
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")

	a.cliOK("pull", host+"/test/app:1", "--name", "imgapp", "-q")
	tpl, err := a.api.ListTemplates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for _, tp := range tpl {
		if tp.Name == "imgapp" {
			id = tp.TemplateID
		}
	}
	if id == "" {
		t.Fatalf("pulled template not listed: %+v", tpl)
	}
	waitUploaded(t, g, id)
	start := time.Now()
	sb := b.create(map[string]any{"templateID": "imgapp"})
	t.Logf("first create of the image template on node-b (root filesystem fetched): %v", time.Since(start).Round(time.Millisecond))
	res := b.exec(sb.SandboxID, client.ExecuteRequest{Command: "cat /srv/app/hello.txt; whoami; sudo -n id -u; echo $APP_MODE", User: "user"})
	if res.ExitCode != 0 || res.Stdout != "from the app layer\nuser\n0\ntest\n" {
		t.Fatalf("image sandbox on node-b: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	fetched, _ := filepath.Glob(filepath.Join(b.dataDir, "shared", "rootfs", "*", "rootfs"))
	if len(fetched) != 1 {
		t.Errorf("fetched root filesystems on node-b: %v, want one", fetched)
	}
}

// Snapshots of one sandbox are stored as the pages that changed: the second
// stores a fraction of the first and names it as its parent; deleting the
// first leaves the second whole, restored with its memory on a node that
// has none of its pages.
func TestClusterIncrementalSnapshots(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv)
	b := c.sharedNode("node-b", srv)
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")
	ctx := context.Background()

	src := a.create(map[string]any{"templateID": "base"}).SandboxID
	want := startMemoryKeeper(t, a, src)
	first, err := g.api.CreateSnapshot(ctx, src, "step-1")
	if err != nil {
		t.Fatal(err)
	}
	waitUploaded(t, g, first.SnapshotID)
	s1, err := g.api.GetSnapshot(ctx, "step-1")
	if err != nil {
		t.Fatal(err)
	}
	// A step of the trajectory: a few MiB of new memory.
	a.exec(src, client.ExecuteRequest{Command: `nohup python3 -c '
import os, time
b = os.urandom(4 << 20)
open("/tmp/step-2", "w").write("ok")
time.sleep(1e9)
' >/dev/null 2>&1 &`})
	waitFor(t, time.Minute, "4 MiB more in memory", func() bool {
		res, err := a.api.Execute(ctx, src, client.ExecuteRequest{Command: "cat /tmp/step-2"})
		return err == nil && res.Stdout == "ok"
	})
	second, err := g.api.CreateSnapshot(ctx, src, "step-2")
	if err != nil {
		t.Fatal(err)
	}
	waitUploaded(t, g, second.SnapshotID)
	s2, err := g.api.GetSnapshot(ctx, second.SnapshotID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first snapshot: %d MiB, %d MiB stored; second: %d MiB, %.1f MiB stored, shares with %q",
		s1.Bytes>>20, s1.StoredBytes>>20, s2.Bytes>>20, float64(s2.StoredBytes)/(1<<20), s2.ParentID)
	if s1.Bytes < 32<<20 || s1.StoredBytes < 32<<20 {
		t.Errorf("first snapshot: %d bytes, %d stored; it holds 32 MiB of random memory", s1.Bytes, s1.StoredBytes)
	}
	if s2.ParentID != first.SnapshotID || s2.StoredBytes > s1.StoredBytes/2 || s2.StoredBytes < 4<<20 {
		t.Errorf("second snapshot stored %d bytes (the first %d), parent %q; want a fraction, parent %s",
			s2.StoredBytes, s1.StoredBytes, s2.ParentID, first.SnapshotID)
		t.Errorf("(the 4 MiB of new memory must be among what it stored)")
	}
	var apiErr *client.APIError
	if _, err := g.api.GetSnapshot(ctx, "base"); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("GET /snapshots/base (a template): %v, want 404", err)
	}

	if err := g.api.DeleteTemplate(ctx, first.SnapshotID); err != nil {
		t.Fatal(err)
	}
	id := b.create(map[string]any{"templateID": "step-2"}).SandboxID
	if got, wantFile := memoryDigest(t, b.api, id); got != want || wantFile != want {
		t.Errorf("sandbox from the second snapshot on node-b: memory digest %q, file %q, want %q", got, wantFile, want)
	}
}
