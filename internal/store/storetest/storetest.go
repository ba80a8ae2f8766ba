// Package storetest is the behaviour every store.Store must show, run by
// each implementation's tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

// Run runs the shared suite; newStore returns a fresh, empty store.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	newStore = withTeams(newStore)
	t.Run("SandboxRoundTrip", func(t *testing.T) { testSandboxRoundTrip(t, newStore(t)) })
	t.Run("SandboxFilters", func(t *testing.T) { testSandboxFilters(t, newStore(t)) })
	t.Run("SandboxPages", func(t *testing.T) { testSandboxPages(t, newStore(t)) })
	t.Run("SnapshotPages", func(t *testing.T) { testSnapshotPages(t, newStore(t)) })
	t.Run("SandboxNotFound", func(t *testing.T) { testSandboxNotFound(t, newStore(t)) })
	t.Run("Templates", func(t *testing.T) { testTemplates(t, newStore(t)) })
	t.Run("Unresponsive", func(t *testing.T) { testUnresponsive(t, newStore(t)) })
	t.Run("Refs", func(t *testing.T) { testRefs(t, newStore(t)) })
	t.Run("RefsRace", func(t *testing.T) { testRefsRace(t, newStore(t)) })
}

func sandbox(id string, state store.SandboxState, started time.Time, md map[string]string) *store.Sandbox {
	return &store.Sandbox{
		ID: id, TemplateID: "tpl1", Alias: "base", State: state, VCPU: 2, MemoryMB: 512,
		Metadata: md, EnvVars: map[string]string{"A": "1"}, AccessToken: "tok-" + id, SlotIndex: 3,
		AutoPause: true, StartedAt: started, EndAt: started.Add(time.Minute), UpdatedAt: started,
		ImageDir: "/images/" + id, TimeoutSecs: 60, TrafficToken: "traffic-" + id, RebootOnResume: true,
		AutoPauseDropMemory: true, AutoResume: true, TeamID: "team-1",
		Network: &store.NetworkPolicy{AllowInternet: false, AllowOut: []string{"1.1.1.1/32"}, DenyOut: []string{"0.0.0.0/0"}},
	}
}

func testSandboxRoundTrip(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Unix(1700000000, 123456789).UTC()
	want := sandbox("sb1", store.StateRunning, now, map[string]string{"k": "v"})
	if err := s.CreateSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, want); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate create: got %v, want ErrConflict", err)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != want.ID || got.State != want.State || got.AccessToken != want.AccessToken ||
		got.SlotIndex != 3 || !got.AutoPause || !got.StartedAt.Equal(now) || !got.EndAt.Equal(want.EndAt) ||
		got.Metadata["k"] != "v" || got.EnvVars["A"] != "1" || got.VCPU != 2 || got.MemoryMB != 512 ||
		got.ImageDir != "/images/sb1" || got.TimeoutSecs != 60 || got.TrafficToken != "traffic-sb1" || !got.RebootOnResume ||
		!got.AutoPauseDropMemory || !got.AutoResume || got.TeamID != "team-1" ||
		got.Network == nil || got.Network.AllowInternet || len(got.Network.AllowOut) != 1 || got.Network.DenyOut[0] != "0.0.0.0/0" {
		t.Fatalf("round trip: got %+v, want %+v", got, want)
	}
	got.State = store.StateDead
	got.Network = nil
	got.EndedReason = "oom"
	got.SlotIndex = -1
	got.TeamID = "team-2" // an update never moves a sandbox to another team
	if err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	again, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if again.State != store.StateDead || again.EndedReason != "oom" || again.SlotIndex != -1 || again.Network != nil ||
		again.TeamID != "team-1" {
		t.Fatalf("after update: %+v", again)
	}
	// The upload state of a paused-to-disk image: only an image can be
	// uploaded; later updates keep the state while the image stays, and
	// clear it with the image.
	again.ImageDir = ""
	if err := s.UpdateSandbox(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxUpload(ctx, "sb1", store.UploadPending, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("upload state without an image: %v", err)
	}
	again.State, again.ImageDir = store.StatePaused, "/img/pause-sb1"
	if err := s.UpdateSandbox(ctx, again); err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123"
	if err := s.SetSandboxUpload(ctx, "sb1", store.UploadUploaded, digest); err != nil {
		t.Fatal(err)
	}
	again.EndAt = again.EndAt.Add(time.Hour) // a stale copy, written again
	if err := s.UpdateSandbox(ctx, again); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "sb1"); err != nil || got.ImageUpload != store.UploadUploaded ||
		got.ImageDigest != digest {
		t.Fatalf("upload state after an update: %+v %v", got, err)
	}
	again.ImageDir = ""
	if err := s.UpdateSandbox(ctx, again); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "sb1"); err != nil || got.ImageUpload != store.UploadNone || got.ImageDigest != "" {
		t.Fatalf("upload state after the image went: %+v %v", got, err)
	}
	if err := s.SetSandboxUpload(ctx, "nope", store.UploadPending, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("upload state of a missing sandbox: %v", err)
	}
	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, "sb1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
}

func testSandboxFilters(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Unix(1700000000, 0).UTC()
	for i, sb := range []*store.Sandbox{
		sandbox("a", store.StateRunning, base, map[string]string{"team": "x"}),
		sandbox("b", store.StatePaused, base.Add(time.Second), map[string]string{"team": "y"}),
		sandbox("c", store.StateDead, base.Add(2*time.Second), map[string]string{"team": "x"}),
	} {
		if i == 2 {
			sb.TemplateID, sb.Alias = "tpl2", "other"
		}
		if i == 1 {
			sb.TeamID = "team-2"
		}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		filter store.SandboxFilter
		want   []string
	}{
		{"all, newest first", store.SandboxFilter{}, []string{"c", "b", "a"}},
		{"states", store.SandboxFilter{States: []store.SandboxState{store.StateRunning, store.StatePaused}}, []string{"b", "a"}},
		{"metadata", store.SandboxFilter{Metadata: map[string]string{"team": "x"}}, []string{"c", "a"}},
		{"metadata miss", store.SandboxFilter{Metadata: map[string]string{"team": "z"}}, nil},
		{"template alias", store.SandboxFilter{Template: "other"}, []string{"c"}},
		{"template id", store.SandboxFilter{Template: "tpl1"}, []string{"b", "a"}},
		{"team", store.SandboxFilter{TeamID: "team-1"}, []string{"c", "a"}},
		{"team and state", store.SandboxFilter{TeamID: "team-2", States: []store.SandboxState{store.StatePaused}}, []string{"b"}},
		{"team miss", store.SandboxFilter{TeamID: "team-3"}, nil},
		{"ids", store.SandboxFilter{IDs: []string{"a", "c", "nope"}}, []string{"c", "a"}},
		{"ids and team", store.SandboxFilter{IDs: []string{"a", "b"}, TeamID: "team-1"}, []string{"a"}},
		{"no ids", store.SandboxFilter{IDs: []string{}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListSandboxes(ctx, tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sb := range got {
				ids = append(ids, sb.ID)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("got %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", ids, tc.want)
				}
			}
		})
	}
}

// testSandboxPages walks lists page by page in both orders, with times
// shared by several sandboxes (the cursor's ID breaks the tie), and checks
// the bounds and metadata keys a JSON path would trip on.
func testSandboxPages(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Unix(1700000000, 0).UTC()
	// Started: e, d at base+2s; c at base+1s; b, a, f at base (f another team's).
	started := map[string]time.Duration{"a": 0, "b": 0, "c": time.Second, "d": 2 * time.Second,
		"e": 2 * time.Second, "f": 0}
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		md := map[string]string{"n": id}
		if id == "b" || id == "d" {
			md[`odd "key".$[0]`] = "v'1"
		}
		sb := sandbox(id, store.StateRunning, base.Add(started[id]), md)
		if id == "f" {
			sb.TeamID = "team-2"
		}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(sbs []*store.Sandbox) []string {
		var out []string
		for _, sb := range sbs {
			out = append(out, sb.ID)
		}
		return out
	}
	// walk pages through f with pages of n, as the API does.
	walk := func(f store.SandboxFilter, n int) []string {
		return walkPages(t, n, func(limit int, after *store.ListCursor) ([]*store.Sandbox, error) {
			f.Limit, f.After = limit, after
			return s.ListSandboxes(ctx, f)
		}, func(sb *store.Sandbox) store.ListCursor { return store.ListCursor{At: sb.StartedAt, ID: sb.ID} })
	}
	newest := []string{"d", "e", "c", "a", "b", "f"}
	oldest := []string{"f", "b", "a", "c", "e", "d"}
	for _, tc := range []struct {
		name   string
		filter store.SandboxFilter
		want   []string
	}{
		{"newest first", store.SandboxFilter{}, newest},
		{"oldest first", store.SandboxFilter{Oldest: true}, oldest},
		{"team", store.SandboxFilter{TeamID: "team-1"}, []string{"d", "e", "c", "a", "b"}},
		{"team, oldest first", store.SandboxFilter{TeamID: "team-1", Oldest: true}, []string{"b", "a", "c", "e", "d"}},
		{"started from", store.SandboxFilter{StartedFrom: base.Add(time.Second)}, []string{"d", "e", "c"}},
		{"started from, oldest first", store.SandboxFilter{StartedFrom: base.Add(time.Second), Oldest: true},
			[]string{"c", "e", "d"}},
		{"metadata key with quotes", store.SandboxFilter{Metadata: map[string]string{`odd "key".$[0]`: "v'1"}},
			[]string{"d", "b"}},
		{"metadata, two pairs", store.SandboxFilter{Metadata: map[string]string{`odd "key".$[0]`: "v'1", "n": "b"}},
			[]string{"b"}},
		{"metadata value differs", store.SandboxFilter{Metadata: map[string]string{"n": "B"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{1, 2, 5, 100} {
				if got := walk(tc.filter, n); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("pages of %d: %v, want %v", n, got, tc.want)
				}
			}
		})
	}
	// A cursor on a record since deleted still places the next page.
	got, err := s.ListSandboxes(ctx, store.SandboxFilter{After: &store.ListCursor{At: base.Add(time.Second), ID: "zz"}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(got)) != fmt.Sprint([]string{"a", "b", "f"}) {
		t.Fatalf("after a gone record: %v", ids(got))
	}
}

// testSnapshotPages walks the snapshot list page by page: newest first,
// IDs descending at equal times, a team's own and public ones only.
func testSnapshotPages(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := time.Unix(1700000000, 0).UTC()
	for _, tc := range []struct {
		id, team, source string
		at               time.Duration
		kind             store.TemplateKind
	}{
		{"s1", "team-1", "sb1", 0, store.KindSnapshot},
		{"s2", "team-1", "sb2", time.Second, store.KindSnapshot},
		{"s3", "team-1", "sb1", time.Second, store.KindSnapshot},
		{"s4", "team-2", "sb4", 2 * time.Second, store.KindSnapshot},
		{"s5", "", "sb5", 3 * time.Second, store.KindSnapshot},
		{"t1", "team-1", "", 4 * time.Second, ""}, // a template, never listed
	} {
		tpl := &store.Template{ID: tc.id, Name: tc.id, RootfsPath: "/r/base", Kind: tc.kind, TeamID: tc.team,
			SourceSandbox: tc.source, CreatedAt: base.Add(tc.at), ImageDir: "/img/" + tc.id}
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	walk := func(f store.SnapshotFilter, n int) []string {
		return walkPages(t, n, func(limit int, after *store.ListCursor) ([]*store.Template, error) {
			f.Limit, f.After = limit, after
			return s.ListSnapshots(ctx, f)
		}, func(t *store.Template) store.ListCursor { return store.ListCursor{At: t.CreatedAt, ID: t.ID} })
	}
	for _, tc := range []struct {
		name   string
		filter store.SnapshotFilter
		want   []string
	}{
		{"every team's", store.SnapshotFilter{}, []string{"s5", "s4", "s3", "s2", "s1"}},
		{"a team's and public", store.SnapshotFilter{TeamID: "team-1"}, []string{"s5", "s3", "s2", "s1"}},
		{"of a sandbox", store.SnapshotFilter{TeamID: "team-1", SourceSandbox: "sb1"}, []string{"s3", "s1"}},
		{"by name", store.SnapshotFilter{Name: "s2"}, []string{"s2"}},
		{"another team's by name", store.SnapshotFilter{TeamID: "team-2", Name: "s2"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{1, 2, 100} {
				if got := walk(tc.filter, n); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("pages of %d: %v, want %v", n, got, tc.want)
				}
			}
		})
	}
}

// walkPages lists everything through list in pages of n, as the API does
// (one more than the page says whether more follow, the last record's
// place is the next cursor), and returns the IDs in order.
func walkPages[T any](t *testing.T, n int, list func(limit int, after *store.ListCursor) ([]T, error),
	place func(T) store.ListCursor) []string {
	t.Helper()
	var all []string
	var after *store.ListCursor
	for range 20 {
		got, err := list(n+1, after)
		if err != nil {
			t.Fatal(err)
		}
		more := len(got) > n
		if more {
			got = got[:n]
		}
		for _, r := range got {
			all = append(all, place(r).ID)
		}
		if !more {
			return all
		}
		c := place(got[len(got)-1])
		after = &c
	}
	t.Fatalf("paging did not end: %v", all)
	return nil
}

func testSandboxNotFound(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetSandbox(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get: %v", err)
	}
	if err := s.UpdateSandbox(ctx, sandbox("nope", store.StateRunning, time.Now(), nil)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update: %v", err)
	}
	if err := s.DeleteSandbox(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete: %v", err)
	}
}

func testTemplates(t *testing.T, s store.Store) {
	ctx := context.Background()
	tpl := &store.Template{ID: "t1", Name: "base", RootfsPath: "/r", DefaultUser: "user", DefaultWorkdir: "/home/user",
		Env: map[string]string{"LANG": "C.UTF-8"}, VCPU: 2, MemoryMB: 1024, CreatedAt: time.Unix(1, 0).UTC()}
	if err := s.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"t1", "base"} {
		got, err := s.GetTemplate(ctx, key)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if got.ID != "t1" || got.DefaultUser != "user" || got.Env["LANG"] != "C.UTF-8" || got.MemoryMB != 1024 {
			t.Fatalf("get %s: %+v", key, got)
		}
	}
	snap := &store.Template{ID: "s1", Name: "s1", Kind: store.KindSnapshot, ImageDir: "/img/s1",
		SourceSandbox: "sb1", EnvdToken: "tok", EnvVars: map[string]string{"X": "y"}, CreatedAt: time.Unix(2, 0).UTC(),
		TeamID: "team-1"}
	if err := s.PutTemplate(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTemplate(ctx, "base"); err != nil || got.TeamID != "" {
		t.Fatalf("a template of no team is public: %+v %v", got, err)
	}
	// A name's holder, found by its name only.
	if got, err := s.TemplateNamed(ctx, "base"); err != nil || got.ID != "t1" {
		t.Errorf("the template named base: %+v %v", got, err)
	}
	if got, err := s.TemplateNamed(ctx, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("TemplateNamed by an ID: %+v %v, want ErrNotFound", got, err)
	}
	gotSnap, err := s.GetTemplate(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if gotSnap.Kind != store.KindSnapshot || gotSnap.ImageDir != "/img/s1" || gotSnap.SourceSandbox != "sb1" ||
		gotSnap.EnvdToken != "tok" || gotSnap.EnvVars["X"] != "y" || gotSnap.Named() || gotSnap.TeamID != "team-1" {
		t.Fatalf("snapshot round trip: %+v", gotSnap)
	}
	if gotSnap.Upload != store.UploadNone || gotSnap.RootfsID != "" {
		t.Fatalf("a template is not shared unless asked: %+v", gotSnap)
	}
	// Sharing through an object store: the rootfs identity is written
	// with the record, the upload's state alone afterwards.
	snap.RootfsID, snap.Upload = "rootfs-1", store.UploadPending
	if err := s.PutTemplate(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTemplateUpload(ctx, "s1", store.UploadFailed, "store down", store.UploadDigests{}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTemplate(ctx, "s1"); err != nil || got.RootfsID != "rootfs-1" ||
		got.Upload != store.UploadFailed || got.UploadError != "store down" || got.ImageDir != "/img/s1" {
		t.Fatalf("upload state: %+v %v", got, err)
	}
	// The digests of what was uploaded are pinned with the state, and
	// kept through a read and write of the whole record.
	pins := store.UploadDigests{Image: "sha256:1111", Rootfs: "sha256:2222",
		Stats: store.ImageStats{Bytes: 1 << 30, NewBytes: 12 << 20, Parent: "s0"}}
	if err := s.SetTemplateUpload(ctx, "s1", store.UploadUploaded, "", pins); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTemplate(ctx, "s1")
	if err != nil || got.Upload != store.UploadUploaded || got.UploadError != "" ||
		got.ImageDigest != pins.Image || got.RootfsDigest != pins.Rootfs || got.ImageStats != pins.Stats {
		t.Fatalf("uploaded: %+v %v", got, err)
	}
	if err := s.PutTemplate(ctx, got); err != nil {
		t.Fatal(err)
	}
	if again, err := s.GetTemplate(ctx, "s1"); err != nil || again.ImageDigest != pins.Image || again.RootfsDigest != pins.Rootfs ||
		again.ImageStats != pins.Stats {
		t.Fatalf("digests after a put of the read record: %+v %v", again, err)
	}
	if err := s.SetTemplateUpload(ctx, "nope", store.UploadUploaded, "", pins); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("upload state of a missing template: %v", err)
	}
	if err := s.DeleteTemplate(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetTemplate(ctx, "base"); got.Kind != store.KindRootfs {
		t.Fatalf("default kind: %q", got.Kind)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "t2", Name: "base", Env: nil}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := s.GetTemplate(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if err := s.DeleteTemplate(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func ref(hk store.RefKind, hid, rootfs string) store.Ref {
	return store.Ref{HolderKind: hk, HolderID: hid, TargetKind: store.RefRootfs, TargetID: rootfs}
}

func wantRefs(t *testing.T, s store.Store, want ...store.Ref) {
	t.Helper()
	got, err := s.ListRefs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("refs\n got %v\nwant %v", got, want)
	}
}

// References are taken and dropped with the records that hold them, and a
// template that owns its root filesystem is deleted only when nothing else
// refers to that.
func testRefs(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	tpl := &store.Template{ID: "t1", Name: "app", RootfsPath: "/r/t1/rootfs", CreatedAt: now}
	snap := &store.Template{ID: "s1", Name: "s1", RootfsPath: tpl.RootfsPath, CreatedAt: now,
		Kind: store.KindSnapshot, ImageDir: "/img/s1"}
	for _, x := range []*store.Template{tpl, snap} {
		if err := s.PutTemplate(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	// A put again replaces the template's reference, not adds one.
	if err := s.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	wantRefs(t, s, ref(store.RefTemplate, "s1", tpl.RootfsPath), ref(store.RefTemplate, "t1", tpl.RootfsPath))

	sb1 := sandbox("sb1", store.StateRunning, now, nil)
	if err := s.CreateSandboxHolding(ctx, sb1, tpl.RootfsPath); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandboxHolding(ctx, sb1, tpl.RootfsPath); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate create: %v", err)
	}
	if err := s.CreateSandboxHolding(ctx, sandbox("sb2", store.StateRunning, now, nil), "/r/gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("create holding a root filesystem no template holds: %v", err)
	}
	if _, err := s.GetSandbox(ctx, "sb2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a create that could not take its reference left a record: %v", err)
	}
	if err := s.HoldRootfs(ctx, store.RefPrepared, "p1", tpl.RootfsPath); err != nil {
		t.Fatal(err)
	}
	if err := s.HoldRootfs(ctx, store.RefPrepared, "p2", "/r/gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("hold of a root filesystem no template holds: %v", err)
	}

	users, err := s.DeleteTemplateUnreferenced(ctx, "t1")
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete of a template in use: %v", err)
	}
	if want := []store.Ref{ref(store.RefPrepared, "p1", tpl.RootfsPath), ref(store.RefSandbox, "sb1", tpl.RootfsPath),
		ref(store.RefTemplate, "s1", tpl.RootfsPath)}; !slices.Equal(users, want) {
		t.Fatalf("users %v, want %v", users, want)
	}
	if _, err := s.GetTemplate(ctx, "t1"); err != nil {
		t.Fatalf("a refused delete removed the template: %v", err)
	}
	// A snapshot owns no root filesystem: it goes whoever uses it.
	if _, err := s.DeleteTemplateUnreferenced(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseRefs(ctx, store.RefPrepared, ""); err != nil {
		t.Fatal(err)
	}
	// A sandbox paused keeps its reference; a dead one drops it.
	sb1.State = store.StatePaused
	if err := s.UpdateSandbox(ctx, sb1); err != nil {
		t.Fatal(err)
	}
	wantRefs(t, s, ref(store.RefSandbox, "sb1", tpl.RootfsPath), ref(store.RefTemplate, "t1", tpl.RootfsPath))
	sb1.State = store.StateDead
	if err := s.UpdateSandbox(ctx, sb1); err != nil {
		t.Fatal(err)
	}
	wantRefs(t, s, ref(store.RefTemplate, "t1", tpl.RootfsPath))
	sb3 := sandbox("sb3", store.StateRunning, now, nil)
	if err := s.CreateSandboxHolding(ctx, sb3, tpl.RootfsPath); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb3"); err != nil {
		t.Fatal(err)
	}
	if users, err := s.DeleteTemplateUnreferenced(ctx, "t1"); err != nil || len(users) != 0 {
		t.Fatalf("delete of an unused template: %v %v", users, err)
	}
	wantRefs(t, s)
	if _, err := s.GetTemplate(ctx, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted template: %v", err)
	}
	if _, err := s.DeleteTemplateUnreferenced(ctx, "t1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := s.HoldRootfs(ctx, store.RefPrepared, "p3", tpl.RootfsPath); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("hold of a deleted template's root filesystem: %v", err)
	}
	// DeleteTemplate drops the template's reference too.
	if err := s.PutTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	wantRefs(t, s)
}

// A create holding a template's root filesystem and the template's delete,
// run at once, never both succeed: the delete either sees the sandbox or
// the create fails.
func testRefsRace(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	for i := range 20 {
		id := fmt.Sprintf("t%d", i)
		tpl := &store.Template{ID: id, Name: id, RootfsPath: "/r/" + id, CreatedAt: now}
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var createErr, deleteErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			createErr = s.CreateSandboxHolding(ctx, sandbox("sb-"+id, store.StateRunning, now, nil), tpl.RootfsPath)
		}()
		go func() {
			defer wg.Done()
			_, deleteErr = s.DeleteTemplateUnreferenced(ctx, id)
		}()
		wg.Wait()
		switch {
		case createErr == nil && deleteErr == nil:
			t.Fatalf("round %d: both the create and the delete succeeded", i)
		case createErr == nil && !errors.Is(deleteErr, store.ErrConflict):
			t.Fatalf("round %d: delete: %v", i, deleteErr)
		case deleteErr == nil && !errors.Is(createErr, store.ErrNotFound):
			t.Fatalf("round %d: create: %v", i, createErr)
		case createErr != nil && deleteErr != nil:
			t.Fatalf("round %d: neither succeeded: %v; %v", i, createErr, deleteErr)
		}
	}
}

// Backfill checks the upgrade of a database made before references: s gets
// records, downgrade takes it back to before the references' migration
// (dropping them), and reopen opens it again, migrating. The references
// must then protect what the scan of records protected: every template's
// root filesystem, and that of the template of every sandbox not dead.
func Backfill(t *testing.T, s store.Store, downgrade func(), reopen func() store.Store) {
	makeTeams(t, s)
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	for _, tpl := range []*store.Template{
		{ID: "t1", Name: "app", RootfsPath: "/r/t1", CreatedAt: now},
		{ID: "s1", Name: "s1", RootfsPath: "/r/t1", CreatedAt: now, Kind: store.KindSnapshot, ImageDir: "/img/s1"},
		{ID: "t2", Name: "other", RootfsPath: "/r/t2", CreatedAt: now},
	} {
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	for _, sb := range []struct {
		id, tpl string
		state   store.SandboxState
	}{
		{"sb-run", "s1", store.StateRunning},
		{"sb-paused", "t1", store.StatePaused},
		{"sb-dead", "t1", store.StateDead},
		{"sb-orphan", "gone", store.StateRunning},
	} {
		rec := sandbox(sb.id, sb.state, now, nil)
		rec.TemplateID = sb.tpl
		if err := s.CreateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	downgrade()
	s = reopen()
	wantRefs(t, s, ref(store.RefSandbox, "sb-paused", "/r/t1"), ref(store.RefSandbox, "sb-run", "/r/t1"),
		ref(store.RefTemplate, "s1", "/r/t1"), ref(store.RefTemplate, "t1", "/r/t1"),
		ref(store.RefTemplate, "t2", "/r/t2"))
	if users, err := s.DeleteTemplateUnreferenced(ctx, "t1"); !errors.Is(err, store.ErrConflict) || len(users) != 3 {
		t.Fatalf("delete of an upgraded template in use: %v %v", users, err)
	}
	if _, err := s.DeleteTemplateUnreferenced(ctx, "t2"); err != nil {
		t.Fatalf("delete of an upgraded template nothing uses: %v", err)
	}
}

// A running sandbox's unresponsiveness is kept through other writes while
// it runs (a timeout change), cleared by SetSandboxUnresponsive(""), and by
// any write of another state (paused, dead): a resumed sandbox starts
// answering.
func testUnresponsive(t *testing.T, s store.Store) {
	ctx := context.Background()
	sb := sandbox("sb1", store.StateRunning, time.Unix(1700000000, 0).UTC(), nil)
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	get := func() *store.Sandbox {
		t.Helper()
		got, err := s.GetSandbox(ctx, "sb1")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	const why = "sandbox sb1 is not answering"
	if err := s.SetSandboxUnresponsive(ctx, "sb1", why); err != nil {
		t.Fatal(err)
	}
	sb.EndAt = sb.EndAt.Add(time.Minute) // a timeout change: still running
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got := get(); got.Unresponsive != why {
		t.Fatalf("after a running update: %q", got.Unresponsive)
	}
	if err := s.SetSandboxUnresponsive(ctx, "sb1", ""); err != nil {
		t.Fatal(err)
	}
	if got := get(); got.Unresponsive != "" {
		t.Fatalf("after it answers: %q", got.Unresponsive)
	}
	if err := s.SetSandboxUnresponsive(ctx, "sb1", why); err != nil {
		t.Fatal(err)
	}
	sb.State = store.StatePaused
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got := get(); got.Unresponsive != "" {
		t.Fatalf("after a pause: %q", got.Unresponsive)
	}
	if err := s.SetSandboxUnresponsive(ctx, "nope", why); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
}
