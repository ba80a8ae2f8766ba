package sqlite

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"sort"
	"testing"

	"github.com/aenv-dev/aenv/internal/auth"
)

// A database from before teams: its sandboxes, templates and snapshots
// were the operator's and become the default team's; the built-in
// templates and the build service's pulls of images stay public.
func TestTeamsMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "aenv.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE schema_migrations (name TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	sort.Strings(names)
	for _, name := range names {
		if name >= "migrations/0009" {
			break
		}
		body, _ := migrations.ReadFile(name)
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := db.Exec(`INSERT INTO schema_migrations (name) VALUES (?)`, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"base", "code-interpreter-v1", "image.python:3.12", "my-app", "snap-1"} {
		if _, err := db.Exec(`INSERT INTO templates (id, name, rootfs_path, default_user, default_workdir, env_json,
			vcpu, memory_mb, created_at) VALUES (?, ?, '/r', 'user', '/home/user', '{}', 2, 512, 1)`, "id-"+name, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO sandboxes (id, template_id, alias, state, vcpu, memory_mb, metadata_json, env_json,
		access_token, slot_index, auto_pause, started_at, end_at, ended_reason, updated_at)
		VALUES ('sb1', 'id-base', 'base', 'running', 2, 512, '{}', '{}', 'tok', 0, 0, 1, 2, '', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := map[string]string{"base": "", "code-interpreter-v1": "", "image.python:3.12": "",
		"my-app": auth.DefaultTeam, "snap-1": auth.DefaultTeam}
	for name, team := range want {
		tpl, err := s.GetTemplate(ctx, name)
		if err != nil || tpl.TeamID != team {
			t.Errorf("template %s after the migration: team %q (%v), want %q", name, tpl.TeamID, err, team)
		}
	}
	if sb, err := s.GetSandbox(ctx, "sb1"); err != nil || sb.TeamID != auth.DefaultTeam {
		t.Errorf("sandbox after the migration: %+v %v, want the default team's", sb, err)
	}
	if _, err := s.GetTeam(ctx, auth.DefaultTeam); err != nil {
		t.Errorf("the default team: %v", err)
	}
}
