package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
)

// teamSnapshot is a snapshot record of team named name.
func teamSnapshot(id, name, team string, at int64, upload store.UploadState) *store.Template {
	return &store.Template{ID: id, Name: name, TeamID: team, Kind: store.KindSnapshot, ImageDir: "/images/" + id,
		RootfsPath: "/rootfs/r1", RootfsID: "r1", Upload: upload, CreatedAt: time.Unix(at, 0)}
}

// A team's template names are one namespace across the nodes, as on a
// single server; public names are each node's.
func TestTeamTemplateNames(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b := openNode(t, dsn, "a"), openNode(t, dsn, "b")

	for _, s := range []*Store{a, b} {
		if err := s.PutTemplate(ctx, &store.Template{ID: "base-" + s.node, Name: "base", RootfsPath: "/rootfs/base",
			CreatedAt: time.Unix(1, 0)}); err != nil {
			t.Fatalf("node %s's own base: %v", s.node, err)
		}
	}
	if got, err := b.TemplateNamed(ctx, "base"); err != nil || got.ID != "base-b" {
		t.Errorf("node b's base: %+v %v", got, err)
	}

	if err := a.PutTemplate(ctx, teamSnapshot("a1", "app", "t1", 10, store.UploadPending)); err != nil {
		t.Fatal(err)
	}
	for _, team := range []string{"t1", "t2"} {
		if err := b.PutTemplate(ctx, teamSnapshot("b-"+team, "app", team, 11, store.UploadNone)); !errors.Is(err, store.ErrConflict) {
			t.Errorf("team %s's app on node b beside node a's: %v, want ErrConflict", team, err)
		}
	}
	if got, err := b.TemplateNamed(ctx, "app"); err != nil || got.ID != "a1" || got.NodeID != "a" {
		t.Errorf("node b's view of the name app: %+v %v", got, err)
	}
	if _, err := b.TemplateNamed(ctx, "free"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a free name: %v", err)
	}

	// Another node's record is replaced only once uploaded: its files are
	// on that node alone before.
	if _, err := b.ReplaceTemplate(ctx, teamSnapshot("b2", "app", "t1", 12, store.UploadNone)); !errors.Is(err, store.ErrConflict) {
		t.Errorf("replace of node a's app before its upload: %v, want ErrConflict", err)
	}
	if err := a.SetTemplateUpload(ctx, "a1", store.UploadUploaded, "", store.UploadDigests{Rootfs: "sha256:1"}); err != nil {
		t.Fatal(err)
	}
	old, err := b.ReplaceTemplate(ctx, teamSnapshot("b2", "app", "t1", 12, store.UploadNone))
	if err != nil || old == nil || old.ID != "a1" || old.NodeID != "a" {
		t.Fatalf("replace of node a's uploaded app: old %+v, %v", old, err)
	}
	// Another team's record is never replaced, on any node: the name was
	// the caller's when it looked, perhaps, but not now.
	for _, s := range []*Store{a, b} {
		if _, err := s.ReplaceTemplate(ctx, teamSnapshot("other-"+s.node, "app", "t2", 13, store.UploadNone)); !errors.Is(err, store.ErrConflict) {
			t.Errorf("team t2's replace of team t1's app on node %s: %v, want ErrConflict", s.node, err)
		}
	}
	if _, err := a.GetTemplate(ctx, "a1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the replaced record is still node a's: %v", err)
	}
	if got, err := a.TemplateNamed(ctx, "app"); err != nil || got.ID != "b2" {
		t.Errorf("node a's view of app after the replace: %+v %v", got, err)
	}
	refs, err := open(t, dsn).ListRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r.HolderID == "a1" {
			t.Errorf("the replaced record's reference stayed: %+v", r)
		}
	}
}

// Records of one team name made at once on two nodes: exactly one is
// kept, by put or by replace.
func TestTeamTemplateNamesRace(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	nodes := []*Store{openNode(t, dsn, "a"), openNode(t, dsn, "b")}
	for _, replace := range []bool{false, true} {
		name := fmt.Sprintf("race-%t", replace)
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := nodes[i%2]
				// Uploaded, so that a replace may take over another
				// node's.
				tpl := teamSnapshot(fmt.Sprintf("%s-%d", name, i), name, fmt.Sprintf("t%d", i%3), int64(i),
					store.UploadUploaded)
				if replace {
					_, errs[i] = s.ReplaceTemplate(ctx, tpl)
				} else {
					errs[i] = s.PutTemplate(ctx, tpl)
				}
			}()
		}
		wg.Wait()
		made := 0
		for i, err := range errs {
			switch {
			case err == nil:
				made++
			case !errors.Is(err, store.ErrConflict):
				t.Errorf("%s: record %d: %v, want ErrConflict or none", name, i, err)
			}
		}
		if !replace && made != 1 {
			t.Errorf("%s: %d puts made a record, want exactly 1", name, made)
		}
		all, err := open(t, dsn).ListTemplates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kept := 0
		for _, tpl := range all {
			if tpl.Name == name {
				kept++
			}
		}
		if kept != 1 {
			t.Errorf("%s: %d records keep the name, want 1", name, kept)
		}
		// Of the replaces, only the first team's pass: each replaces its
		// own team's record, never another's.
		for i, err := range errs {
			if replace && err == nil && i%3 != firstTeam(errs) {
				t.Errorf("%s: record %d of team t%d replaced team t%d's", name, i, i%3, firstTeam(errs))
			}
		}
	}
}

// The migration that made team names the cluster's settles the names
// already taken on several nodes: the team of the oldest record keeps the
// name on its newest record; the others are renamed to their IDs and
// listed for the operator.
func TestTeamTemplateNamesMigration(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	a, b, c := openNode(t, dsn, "a"), openNode(t, dsn, "b"), openNode(t, dsn, "c")
	// Back to the schema before the migration.
	if _, err := a.pool.Exec(ctx, `DROP INDEX templates_team_name; DROP TABLE template_renames;
		DELETE FROM schema_migrations WHERE name LIKE '0029_%'`); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		s   *Store
		tpl *store.Template
	}{
		{a, teamSnapshot("oldest", "app", "t1", 10, store.UploadNone)},
		{c, teamSnapshot("other-team", "app", "t2", 20, store.UploadNone)},
		{b, teamSnapshot("newest", "app", "t1", 30, store.UploadUploaded)},
		{b, teamSnapshot("solo", "solo", "t2", 40, store.UploadNone)},
		// A build's cached step made on two nodes: one is kept, the other
		// deleted (renamed, no build would find or prune it).
		{a, teamSnapshot("step-a", "app.step-0123456789abcdef0123", "t1", 5, store.UploadNone)},
		{b, teamSnapshot("step-b", "app.step-0123456789abcdef0123", "t1", 6, store.UploadNone)},
		// An unnamed snapshot whose ID another team took as a name: the
		// ID stays its own.
		{a, teamSnapshot("x1", "x1", "t1", 60, store.UploadNone)},
		{b, teamSnapshot("y1", "x1", "t2", 50, store.UploadNone)},
		// A record to be renamed to its ID, which another record is
		// named already.
		{a, teamSnapshot("z1", "dup", "t1", 70, store.UploadNone)},
		{c, teamSnapshot("z2", "dup", "t1", 80, store.UploadNone)},
		{c, teamSnapshot("z3", "z1", "t2", 90, store.UploadNone)},
		{b, &store.Template{ID: "base-b", Name: "base", RootfsPath: "/rootfs/base", CreatedAt: time.Unix(1, 0)}},
		{c, &store.Template{ID: "base-c", Name: "base", RootfsPath: "/rootfs/base", CreatedAt: time.Unix(2, 0)}},
	} {
		if err := r.s.PutTemplate(ctx, r.tpl); err != nil {
			t.Fatal(err)
		}
	}
	migrated := open(t, dsn)
	want := map[string]string{"oldest": "oldest", "other-team": "other-team", "newest": "app", "solo": "solo",
		"base-b": "base", "base-c": "base", "step-b": "app.step-0123456789abcdef0123", "x1": "x1", "y1": "y1",
		"z1": "renamed-z1", "z2": "dup", "z3": "z1"}
	for id, name := range want {
		got, err := migrated.GetTemplate(ctx, id)
		if err != nil || got.Name != name {
			t.Errorf("after the migration, %s: %+v %v, want named %q", id, got, err, name)
		}
	}
	if _, err := migrated.GetTemplate(ctx, "step-a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the duplicate cached step was kept: %v", err)
	}
	refs, err := migrated.ListRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r.HolderID == "step-a" {
			t.Errorf("the deleted step's reference stayed: %+v", r)
		}
	}
	rows, err := migrated.pool.Query(ctx, `SELECT template_id || ' ' || old_name || '>' || new_name || ' ' || team_id
		|| ' ' || node_id || ' ' || deleted::text FROM template_renames ORDER BY template_id`)
	if err != nil {
		t.Fatal(err)
	}
	var renames []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			t.Fatal(err)
		}
		renames = append(renames, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(renames) != "[oldest app>oldest t1 a false other-team app>other-team t2 c false "+
		"step-a app.step-0123456789abcdef0123> t1 a true y1 x1>y1 t2 b false z1 dup>renamed-z1 t1 a false]" {
		t.Errorf("renames listed: %q", renames)
	}
	if err := c.PutTemplate(ctx, teamSnapshot("late", "app", "t2", 50, store.UploadNone)); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a new record of a settled name: %v, want ErrConflict", err)
	}
}

// firstTeam is the team (index mod 3) of the lowest record made, which
// every record made must share when replaces keep to their team.
func firstTeam(errs []error) int {
	for i, err := range errs {
		if err == nil {
			return i % 3
		}
	}
	return -1
}
