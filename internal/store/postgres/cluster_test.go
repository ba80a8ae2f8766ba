package postgres

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
	"github.com/aenv-dev/aenv/internal/store/storetest"
)

func openNode(t *testing.T, dsn, node string) *Store {
	t.Helper()
	s, err := OpenNode(context.Background(), dsn, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A store scoped to a node behaves as a store of its own (the shared
// suite), while others' records share its database.
func TestNodeStore(t *testing.T) {
	srv := pgtest.New(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		dsn := srv.NewDatabase(t)
		// Another node's records, with the same IDs and names, must not
		// show through.
		other := openNode(t, dsn, "node-other")
		if err := other.PutTemplate(context.Background(), &store.Template{ID: "other-base", Name: "base"}); err != nil {
			t.Fatal(err)
		}
		return openNode(t, dsn, "node-1")
	})
}

func TestNodeScoping(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b, all := openNode(t, dsn, "a"), openNode(t, dsn, "b"), open(t, dsn)
	now := time.Now()
	for _, s := range []*Store{a, b} {
		if err := s.PutTemplate(ctx, &store.Template{ID: "tpl-" + s.node, Name: "base", CreatedAt: now}); err != nil {
			t.Fatalf("node %s: base: %v", s.node, err)
		}
		if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "sb-" + s.node, State: store.StateRunning,
			AccessToken: "tok-" + s.node, StartedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	// A name is unique per node only.
	if err := a.PutTemplate(ctx, &store.Template{ID: "tpl-a2", Name: "base"}); !errors.Is(err, store.ErrConflict) {
		t.Errorf("second base on one node: %v, want ErrConflict", err)
	}
	if _, err := a.GetSandbox(ctx, "sb-b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node a read node b's sandbox: %v", err)
	}
	if err := a.DeleteSandbox(ctx, "sb-b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node a deleted node b's sandbox: %v", err)
	}
	if err := a.UpdateSandbox(ctx, &store.Sandbox{ID: "sb-b", State: store.StateDead}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node a updated node b's sandbox: %v", err)
	}
	if tpl, err := a.GetTemplate(ctx, "base"); err != nil || tpl.ID != "tpl-a" || tpl.NodeID != "a" {
		t.Errorf("node a's base: %+v %v", tpl, err)
	}
	if list, _ := b.ListSandboxes(ctx, store.SandboxFilter{}); len(list) != 1 || list[0].ID != "sb-b" {
		t.Errorf("node b lists %v", list)
	}
	// The cluster-wide view sees both, with their nodes.
	list, err := all.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("cluster list: %v %v", list, err)
	}
	for _, sb := range list {
		if sb.NodeID != sb.ID[len("sb-"):] {
			t.Errorf("%s on %q", sb.ID, sb.NodeID)
		}
	}
	if n, err := all.SandboxNode(ctx, "sb-b"); err != nil || n != "b" {
		t.Errorf("route of sb-b: %q %v", n, err)
	}
	if _, err := all.SandboxNode(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("route of an unknown sandbox: %v", err)
	}
	copies, err := all.TemplateCopies(ctx, "base")
	if err != nil || len(copies) != 2 {
		t.Errorf("copies of base: %v %v", copies, err)
	}
	tokens, err := all.RunningTokens(ctx)
	if err != nil || len(tokens) != 2 {
		t.Errorf("tokens: %v %v", tokens, err)
	}
	// A node leaving takes its records along, no one else's.
	if err := all.RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if list, _ := all.ListSandboxes(ctx, store.SandboxFilter{}); len(list) != 1 || list[0].ID != "sb-b" {
		t.Errorf("after node a left: %v", list)
	}
	if copies, _ := all.TemplateCopies(ctx, "base"); len(copies) != 1 || copies[0].NodeID != "b" {
		t.Errorf("copies after node a left: %v", copies)
	}
}

// A node finds another node's template only once it is uploaded, by ID or
// by name (the newest of a name), never one still uploading.
func TestSharedTemplate(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	old := &store.Template{ID: "snap-old", Name: "warm", Kind: store.KindSnapshot, ImageDir: "/a/old",
		RootfsID: "r1", Upload: store.UploadUploaded, CreatedAt: time.Unix(10, 0)}
	if err := b.PutTemplate(ctx, old); err != nil {
		t.Fatal(err)
	}
	snap := &store.Template{ID: "snap-1", Name: "warm", Kind: store.KindSnapshot, ImageDir: "/a/img",
		RootfsID: "r1", Upload: store.UploadUploading, CreatedAt: time.Unix(20, 0)}
	if err := a.PutTemplate(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SharedTemplate(ctx, "snap-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a template still uploading was shared: %v", err)
	}
	if got, err := b.SharedTemplate(ctx, "warm"); err != nil || got.ID != "snap-old" {
		t.Errorf("by name while the newer one uploads: %+v %v", got, err)
	}
	if err := a.SetTemplateUpload(ctx, "snap-1", store.UploadUploaded, "", store.UploadDigests{Rootfs: "sha256:2"}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetTemplateUpload(ctx, "snap-1", store.UploadFailed, "x", store.UploadDigests{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node b changed node a's template: %v", err)
	}
	for _, key := range []string{"snap-1", "warm"} {
		got, err := b.SharedTemplate(ctx, key)
		if err != nil || got.ID != "snap-1" || got.NodeID != "a" || got.ImageDir != "/a/img" || got.RootfsID != "r1" {
			t.Errorf("shared %s: %+v %v", key, got, err)
		}
	}
	if _, err := b.SharedTemplate(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	// Node a removed for good: its uploaded template stays usable, the
	// others go with it.
	if err := a.PutTemplate(ctx, &store.Template{ID: "local-only", Name: "mine", CreatedAt: time.Unix(30, 0)}); err != nil {
		t.Fatal(err)
	}
	// A copy-on-write volume of node a: its record stays (a gateway
	// deletes it), and with it its hold on its layer.
	if err := a.CreateTeam(ctx, &auth.Team{ID: "t", CreatedAt: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateVolume(ctx, &store.Volume{ID: "vol-copy", Name: "copy", TeamID: "t", Token: "x",
		CreatedAt: time.Unix(40, 0), Layers: []string{"layer-1"}}); err != nil {
		t.Fatal(err)
	}
	if err := open(t, dsn).RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if unheld, err := b.UnheldLayers(ctx, []string{"layer-1"}); err != nil || len(unheld) != 0 {
		t.Errorf("a removed node's volume lost its layer: unheld %v %v", unheld, err)
	}
	if got, err := b.SharedTemplate(ctx, "snap-1"); err != nil || got.NodeID != "a" {
		t.Errorf("uploaded template after its node was removed: %+v %v", got, err)
	}
	if copies, _ := open(t, dsn).TemplateCopies(ctx, "mine"); len(copies) != 0 {
		t.Errorf("a removed node's template not in the store was kept: %v", copies)
	}
}

func TestNodesAndHeartbeats(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	n := Node{ID: "n1", Address: "10.0.0.1:8000", Version: "v1", Protocol: 7, StartedAt: time.Now(),
		Capacity: NodeCapacity{MaxSandboxes: 10, MemoryMB: 4096, VCPUs: 2}, SharedImages: true}
	if err := s.RegisterNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heartbeat(ctx, "nope", NodeUse{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("heartbeat of an unknown node: %v", err)
	}
	building := store.BuildProgress{Template: "app", BuildID: "b1", Status: "building", TeamID: "lab", VCPU: 2,
		MemoryMB: 512, Created: time.Unix(1700000000, 0).UTC()}
	use := NodeUse{Sandboxes: 3, Starting: 1, MemoryUsedMB: 300, Builds: []store.BuildProgress{building}}
	if draining, err := s.Heartbeat(ctx, "n1", use); err != nil || draining {
		t.Fatalf("heartbeat: %v %v", draining, err)
	}
	nodes, err := s.ListNodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	got := nodes[0]
	if !reflect.DeepEqual(got.Use, use) {
		t.Errorf("use read back: %+v, want %+v", got.Use, use)
	}
	if got.Address != n.Address || got.Protocol != 7 || got.Capacity != n.Capacity || !got.SharedImages ||
		got.HeartbeatAge < 0 || got.HeartbeatAge > time.Minute {
		t.Errorf("node read back: %+v", got)
	}
	if err := s.SetDraining(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	if draining, _ := s.Heartbeat(ctx, "n1", NodeUse{}); !draining {
		t.Error("the heartbeat does not carry the drain")
	}
	if nodes, _ := s.ListNodes(ctx); len(nodes[0].Use.Builds) != 0 {
		t.Errorf("builds after a heartbeat of none: %+v", nodes[0].Use.Builds)
	}
	// Drained stays drained across a restart's registration.
	if err := s.RegisterNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	if nodes, _ := s.ListNodes(ctx); !nodes[0].Draining {
		t.Error("registering again undrained the node")
	}
	if err := s.SetDraining(ctx, "nope", true); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("drain of an unknown node: %v", err)
	}
	// A node from before protocols were recorded writes its row without
	// one: it reads as protocol 1.
	if _, err := s.pool.Exec(ctx, `INSERT INTO nodes (id, address, version, started_at, heartbeat_at,
		max_sandboxes, memory_mb, vcpus, sandboxes, starting, memory_used_mb, shared_images)
		VALUES ('old', 'h:1', 'v0', 0, 0, 0, 0, 0, 0, 0, 0, false)`); err != nil {
		t.Fatal(err)
	}
	nodes, err = s.ListNodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[1].ID != "old" || nodes[1].Protocol != 1 {
		t.Fatalf("a row written without a protocol: %+v %v", nodes, err)
	}
}

func TestAPIKeysAndSecret(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 0 {
		t.Fatalf("keys: %d %v", n, err)
	}
	if err := s.AddAPIKey(ctx, "e2b_abc"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAPIKey(ctx, "e2b_abc"); err != nil {
		t.Fatalf("adding a key twice: %v", err)
	}
	for key, want := range map[string]bool{"e2b_abc": true, "e2b_abd": false, "": false} {
		k, err := s.KeyByDigest(ctx, auth.Digest(key))
		if ok := err == nil; ok != want || (err != nil && !errors.Is(err, store.ErrNotFound)) {
			t.Errorf("key %q: %v, want found %v", key, err, want)
			continue
		}
		if want && (!k.Admin || k.TeamID != auth.DefaultTeam || !k.Usable(time.Now())) {
			t.Errorf("key %q: %+v, want a usable admin key of the default team", key, k)
		}
	}
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("keys after adding one twice: %d %v", n, err)
	}
	first, err := s.ClusterSecret(ctx, "")
	if err != nil || first == "" {
		t.Fatalf("secret: %q %v", first, err)
	}
	if again, _ := s.ClusterSecret(ctx, ""); again != first {
		t.Error("the cluster secret changed")
	}
	if same, err := s.ClusterSecret(ctx, first); err != nil || same != first {
		t.Errorf("asking for the same secret: %v", err)
	}
	if _, err := s.ClusterSecret(ctx, "another"); !errors.Is(err, ErrSecretMismatch) {
		t.Errorf("asking for another secret: %v, want ErrSecretMismatch", err)
	}
}

func TestBuildRoutes(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	if _, err := s.BuildNode(ctx, "tpl"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown build: %v", err)
	}
	if err := s.MoveBuildNode(ctx, "tpl", "a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.BuildNode(ctx, "tpl"); got != "a" {
		t.Errorf("build node %q, want a", got)
	}
	if err := s.MoveBuildNode(ctx, "tpl", "b"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.BuildNode(ctx, "tpl"); got != "b" {
		t.Errorf("after the move: %q", got)
	}
}

// A sandbox paused to disk, its image uploaded, is taken over by another
// node only once its own has been silent, and by one node only.
func TestTakeOverSandbox(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	all, a, b, c := open(t, dsn), openNode(t, dsn, "a"), openNode(t, dsn, "b"), openNode(t, dsn, "c")
	for _, id := range []string{"a", "b", "c"} {
		if err := all.RegisterNode(ctx, Node{ID: id, Address: id + ":1", StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	sb := &store.Sandbox{ID: "sb1", State: store.StatePaused, ImageDir: "/a/pause-sb1", SlotIndex: -1,
		AccessToken: "tok", StartedAt: time.Now()}
	if err := a.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := b.OrphanSandbox(ctx, "sb1", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an image not uploaded was offered: %v", err)
	}
	if err := a.SetSandboxUpload(ctx, "sb1", store.UploadUploaded, "sha256:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.OrphanSandbox(ctx, "sb1", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a sandbox of a node that just reported was offered: %v", err)
	}
	if _, err := a.OrphanSandbox(ctx, "sb1", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a node was offered its own sandbox: %v", err)
	}
	if _, err := b.ClaimSandbox(ctx, "sb1", "/b/pause-sb1", time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("claimed while its node reports: %v", err)
	}
	// Node a falls silent for an hour; the others keep reporting.
	if _, err := all.pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = heartbeat_at - 3600000000000 WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if got, err := b.OrphanSandbox(ctx, "sb1", time.Minute); err != nil || got.NodeID != "a" || got.AccessToken != "tok" {
		t.Fatalf("orphan: %+v %v", got, err)
	}
	got, err := b.ClaimSandbox(ctx, "sb1", "/b/pause-sb1", time.Minute)
	if err != nil || got.NodeID != "b" || got.ImageDir != "/b/pause-sb1" || got.ImageUpload != store.UploadUploaded ||
		got.ImageDigest != "sha256:1" {
		t.Fatalf("claim: %+v %v", got, err)
	}
	if _, err := c.ClaimSandbox(ctx, "sb1", "/c/pause-sb1", time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("claimed twice: %v", err)
	}
	if _, err := a.GetSandbox(ctx, "sb1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old node still has the record: %v", err)
	}
	if err := a.UpdateSandbox(ctx, sb); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old node could still write the record: %v", err)
	}
	if list, err := b.AllSandboxes(ctx); err != nil || len(list) != 1 {
		t.Errorf("all sandboxes: %v %v", list, err)
	}
}

// A layer is held by a reference or by a volume's record naming it (a
// record older than its references), on any node; both are index probes.
func TestUnheldLayers(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	if err := a.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	v := &store.Volume{ID: "copy", Name: "copy", TeamID: "lab", Token: "t", CreatedAt: time.Now(), Layers: []string{"l-ref", "l-named"}}
	if err := a.CreateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	if _, err := a.pool.Exec(ctx, `DELETE FROM refs WHERE target_kind = $1 AND target_id = $2`, string(store.RefLayer), "l-named"); err != nil {
		t.Fatal(err)
	}
	unheld, err := b.UnheldLayers(ctx, []string{"l-ref", "l-named", "l-free"})
	if err != nil || len(unheld) != 1 || unheld[0] != "l-free" {
		t.Fatalf("unheld %v, %v; want l-free only", unheld, err)
	}
}

// A volume moves between nodes only while nothing holds it; while it
// moves no sandbox mounts it, and a node mounts only the volumes it
// keeps. A move is named by its token; a stale one is taken over, or
// ended by a mount.
func TestVolumeMoves(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")
	if err := a.CreateTeam(ctx, &auth.Team{ID: "t", CreatedAt: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0).UTC()
	if err := a.CreateVolume(ctx, &store.Volume{ID: "vol-m", Name: "m", TeamID: "t", Token: "x", CreatedAt: now,
		Layers: []string{"layer-1"}}); err != nil {
		t.Fatal(err)
	}
	mounting := func(id string) *store.Sandbox {
		return &store.Sandbox{ID: id, TemplateID: "tpl", State: store.StateRunning, TeamID: "t", StartedAt: now,
			EndAt: now.Add(time.Hour), UpdatedAt: now, VolumeMounts: []store.VolumeMount{{VolumeID: "vol-m", Name: "m", Path: "/m"}}}
	}
	stale := func() {
		t.Helper()
		if _, err := a.pool.Exec(ctx, `UPDATE volumes SET moving_since = moving_since - $1 WHERE id = 'vol-m'`,
			2*store.StaleVolumeMove.Nanoseconds()); err != nil {
			t.Fatal(err)
		}
	}
	// Mounted: no move.
	if err := a.CreateSandbox(ctx, mounting("sb-a")); err != nil {
		t.Fatal(err)
	}
	if _, holders, err := a.BeginVolumeMove(ctx, "vol-m", "a", "b"); !errors.Is(err, store.ErrConflict) || len(holders) != 1 {
		t.Fatalf("move of a mounted volume: %v %v, want ErrConflict naming its sandbox", holders, err)
	}
	if err := a.DeleteSandbox(ctx, "sb-a"); err != nil {
		t.Fatal(err)
	}
	// Node b does not keep it: no sandbox of b's mounts it, b deletes it not.
	if err := b.CreateSandbox(ctx, mounting("sb-b")); !errors.Is(err, store.ErrVolumeElsewhere) {
		t.Fatalf("node b mounting node a's volume: %v, want ErrVolumeElsewhere", err)
	}
	if _, err := b.DeleteVolume(ctx, "vol-m"); err == nil {
		t.Fatal("node b deleted node a's volume")
	}
	if _, _, err := a.BeginVolumeMove(ctx, "vol-m", "b", "a"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a move from a node that does not keep it: %v", err)
	}
	if _, _, err := a.BeginVolumeMove(ctx, "vol-gone", "a", "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a move of no volume: %v", err)
	}
	first, _, err := a.BeginVolumeMove(ctx, "vol-m", "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := a.GetVolume(ctx, "", "vol-m"); err != nil || v.MovingTo != "b" || v.NodeID != "a" || v.MoveToken != first {
		t.Fatalf("moving: %+v %v", v, err)
	}
	// Moving: not even its own node mounts it or deletes it, and no
	// second move begins.
	if err := a.CreateSandbox(ctx, mounting("sb-a2")); !errors.Is(err, store.ErrVolumeMoving) {
		t.Fatalf("mounting a moving volume: %v, want ErrVolumeMoving", err)
	}
	if _, err := a.DeleteVolume(ctx, "vol-m"); !errors.Is(err, store.ErrVolumeMoving) {
		t.Fatalf("deleting a moving volume: %v", err)
	}
	if _, _, err := a.BeginVolumeMove(ctx, "vol-m", "a", "c"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second move: %v, want ErrConflict", err)
	}
	// Aborted by its token only.
	if err := a.AbortVolumeMove(ctx, "vol-m", first+1); err != nil {
		t.Fatal(err)
	}
	if v, _ := a.GetVolume(ctx, "", "vol-m"); v.MovingTo != "b" {
		t.Fatalf("an abort of another move ended this one: %+v", v)
	}
	if err := a.AbortVolumeMove(ctx, "vol-m", first); err != nil {
		t.Fatal(err)
	}
	if err := b.FinishVolumeMove(ctx, "vol-m", "a", "b", first, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("finishing an aborted move: %v, want ErrConflict", err)
	}
	// A stale move is taken over, and the one taken over cannot finish.
	old, _, err := a.BeginVolumeMove(ctx, "vol-m", "a", "c")
	if err != nil {
		t.Fatal(err)
	}
	stale()
	second, _, err := a.BeginVolumeMove(ctx, "vol-m", "a", "b")
	if err != nil {
		t.Fatalf("taking over a stale move: %v", err)
	}
	if err := b.FinishVolumeMove(ctx, "vol-m", "a", "c", old, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the move taken over finished: %v", err)
	}
	// A stale move is ended by a mount, and cannot finish after it.
	stale()
	if err := a.CreateSandbox(ctx, mounting("sb-a3")); err != nil {
		t.Fatalf("mounting a volume whose move went stale: %v", err)
	}
	if err := b.FinishVolumeMove(ctx, "vol-m", "a", "b", second, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a stale move finished over a mount: %v", err)
	}
	if err := a.DeleteSandbox(ctx, "sb-a3"); err != nil {
		t.Fatal(err)
	}
	third, _, err := a.BeginVolumeMove(ctx, "vol-m", "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FinishVolumeMove(ctx, "vol-m", "a", "b", third, 5<<20); err != nil {
		t.Fatal(err)
	}
	v, err := b.GetVolume(ctx, "", "vol-m")
	if err != nil || v.NodeID != "b" || v.MovingTo != "" || len(v.Layers) != 0 || v.SizeBytes != 5<<20 {
		t.Fatalf("moved: %+v %v", v, err)
	}
	// Its layers stayed behind, held no more.
	if unheld, err := a.UnheldLayers(ctx, []string{"layer-1"}); err != nil || len(unheld) != 1 {
		t.Fatalf("the moved volume's layer: unheld %v %v", unheld, err)
	}
	// Its new node mounts it; the old one does not.
	if err := b.CreateSandbox(ctx, mounting("sb-b2")); err != nil {
		t.Fatalf("node b mounting its volume: %v", err)
	}
	if err := a.CreateSandbox(ctx, mounting("sb-a4")); !errors.Is(err, store.ErrVolumeElsewhere) {
		t.Fatalf("node a mounting a volume moved away: %v, want ErrVolumeElsewhere", err)
	}
}
