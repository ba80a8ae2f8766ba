package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/storetest"
	"github.com/aenv-dev/aenv/internal/usage"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestTeams(t *testing.T) {
	storetest.RunTeams(t, func(t *testing.T) storetest.TeamStore {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestLedger(t *testing.T) {
	storetest.RunLedger(t, func(t *testing.T) usage.Ledger {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestAudit(t *testing.T) {
	storetest.RunAudit(t, func(t *testing.T) audit.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestSecrets(t *testing.T) {
	storetest.RunSecrets(t, func(t *testing.T) store.SecretStore {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestVolumes(t *testing.T) {
	storetest.RunVolumes(t, func(t *testing.T) store.VolumeStore {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// A database made before references gets them from its records.
func TestRefsBackfill(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "aenv.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Backfill(t, s, func() {
		if _, err := s.db.ExecContext(ctx, `DROP TABLE refs;
			DELETE FROM schema_migrations WHERE name = 'migrations/0007_refs.sql'`); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}, func() store.Store {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// Reopening the same file must keep what was committed and not re-apply
// migrations.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "aenv.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "t1", Name: "base"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
}

// The database holds API tokens and sandbox environments: it and its WAL
// files must be private to the server whatever the data dir's mode, and a
// file left readable by an older version is tightened on open.
func TestFilesArePrivate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing bool // the files exist before Open, readable by all
	}{
		{name: "new database"},
		{name: "existing world-readable database", existing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "aenv.db")
			if tc.existing {
				s, err := Open(ctx, path)
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				for _, p := range []string{path, path + "-wal", path + "-shm"} {
					if err := os.WriteFile(p, nil, 0o644); err != nil && !os.IsExist(err) {
						t.Fatal(err)
					}
					if err := os.Chmod(p, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			s, err := Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// A write makes SQLite create the -wal and -shm files.
			if err := s.PutTemplate(ctx, &store.Template{ID: "t1", Name: "base"}); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Errorf("%s: %v", filepath.Base(p), err)
					continue
				}
				if perm := fi.Mode().Perm(); perm&0o077 != 0 {
					t.Errorf("%s has mode %o, want no group or other access", filepath.Base(p), perm)
				}
			}
		})
	}
}

// A data dir whose name has URI characters ('#', '?', '%') keeps its
// database inside it (a t.Run name with a duplicate gets "#01").
func TestOpenPathWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a#b?c%20d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "aenv.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(context.Background(), &store.Template{ID: "t1", Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 1 {
		t.Errorf("files beside the data dir: %v", entries)
	}
	again, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := again.GetTemplate(context.Background(), "t1"); err != nil {
		t.Errorf("reopened: %v", err)
	}
}

func TestVolumeMounts(t *testing.T) {
	storetest.RunVolumeMounts(t, func(t *testing.T) storetest.VolumeAndSandboxStore {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestVolumeLayers(t *testing.T) {
	storetest.RunVolumeLayers(t, func(t *testing.T) storetest.VolumeAndSandboxStore {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// BenchmarkListSandboxesPage is one page of a team's list (101 records,
// as the API asks for a page of 100) among 10,000 sandboxes of 10 teams:
// a page must not cost more as the node holds more.
func BenchmarkListSandboxesPage(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "aenv.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	base := time.Unix(1700000000, 0).UTC()
	for i := range 10 {
		if err := s.CreateTeam(ctx, &auth.Team{ID: fmt.Sprintf("team-%d", i), CreatedAt: base}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 10000 {
		sb := &store.Sandbox{ID: fmt.Sprintf("sb%05d", i), TemplateID: "tpl", State: store.StateRunning,
			Metadata: map[string]string{"run": strconv.Itoa(i % 7)}, StartedAt: base.Add(time.Duration(i) * time.Second),
			TeamID: fmt.Sprintf("team-%d", i%10), Network: &store.NetworkPolicy{AllowInternet: true}}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name string
		f    store.SandboxFilter
	}{
		{"team", store.SandboxFilter{TeamID: "team-3", Limit: 101}},
		{"team, metadata", store.SandboxFilter{TeamID: "team-3", Metadata: map[string]string{"run": "2"}, Limit: 101}},
		{"any team, after a cursor", store.SandboxFilter{Limit: 101,
			After: &store.ListCursor{At: base.Add(5000 * time.Second), ID: "sb05000"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				got, err := s.ListSandboxes(ctx, bc.f)
				if err != nil || len(got) != 101 {
					b.Fatalf("%d records, %v", len(got), err)
				}
			}
		})
	}
}

// A page of a list reads an index in the list's order and stops at its
// limit: no plan may sort (a temporary B-tree reads every matching row).
func TestListPlans(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	live := []store.SandboxState{store.StateRunning, store.StatePaused}
	cursor := &store.ListCursor{At: time.Unix(1700000000, 0), ID: "sb1"}
	for _, tc := range []struct {
		name  string
		f     store.SandboxFilter
		index string
	}{
		{"every team's, live", store.SandboxFilter{States: live, Limit: 101}, "sandboxes_started"},
		{"every team's, after a cursor", store.SandboxFilter{States: live, After: cursor, Limit: 101}, "sandboxes_started"},
		{"oldest first", store.SandboxFilter{States: live, Oldest: true, Limit: 101}, "sandboxes_started"},
		{"a team's", store.SandboxFilter{TeamID: "t", States: live, Limit: 101}, "sandboxes_team_started"},
		{"a team's, after a cursor", store.SandboxFilter{TeamID: "t", After: cursor, Limit: 101}, "sandboxes_team_started"},
		{"one state", store.SandboxFilter{States: []store.SandboxState{store.StatePaused}, Limit: 101}, "sandboxes_state"},
		{"one state, after a cursor", store.SandboxFilter{States: []store.SandboxState{store.StatePaused}, After: cursor,
			Limit: 101}, "sandboxes_state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			query, args := sandboxListQuery(tc.f)
			whole := queryPlan(t, s, query, args...)
			if !strings.Contains(whole, "INDEX "+tc.index) || strings.Contains(whole, "TEMP B-TREE") {
				t.Errorf("plan %q, want %s and no sort", whole, tc.index)
			}
		})
	}
}

// A layer is held by a reference or by a volume's record naming it (a
// record older than its references); the second is read from the volumes
// with layers only.
func TestUnheldLayers(t *testing.T) {
	ctx := context.Background()
	s := storeWithVolumes(t, 50, func(int) []string { return nil })
	v := &store.Volume{ID: "copy", Name: "copy", TeamID: "lab", Token: "t", CreatedAt: time.Now(), Layers: []string{"l-ref", "l-named"}}
	if err := s.CreateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	// A record older than its references: it names l-named, no ref holds it.
	if _, err := s.db.Exec(`DELETE FROM refs WHERE target_kind = ? AND target_id = ?`, string(store.RefLayer), "l-named"); err != nil {
		t.Fatal(err)
	}
	unheld, err := s.UnheldLayers(ctx, []string{"l-ref", "l-named", "l-free"})
	if err != nil || strings.Join(unheld, ",") != "l-free" {
		t.Fatalf("unheld %v, %v; want l-free only", unheld, err)
	}
	if whole := queryPlan(t, s, layerHeldQuery, string(store.RefLayer), "l-free", "l-free"); !strings.Contains(whole, "volumes_layered") {
		t.Errorf("plan %q, want the volumes with layers read by volumes_layered", whole)
	}
}

// BenchmarkUnheldLayers times the check made when a copy-on-write volume's
// last holder of a layer is deleted, among 10,000 volumes of which 1,000
// have layers, beside the listing of every volume it replaces.
func BenchmarkUnheldLayers(b *testing.B) {
	ctx := context.Background()
	s := storeWithVolumes(b, 10000, func(i int) []string {
		if i%10 != 0 {
			return nil
		}
		return []string{fmt.Sprintf("layer-%05d", i), "layer-base"}
	})
	b.Run("list every volume (before)", func(b *testing.B) {
		for b.Loop() {
			if all, err := s.ListVolumes(ctx, ""); err != nil || len(all) != 10000 {
				b.Fatalf("%d volumes, %v", len(all), err)
			}
		}
	})
	b.Run("UnheldLayers", func(b *testing.B) {
		for b.Loop() {
			if unheld, err := s.UnheldLayers(ctx, []string{"layer-gone", "layer-00010"}); err != nil || len(unheld) != 1 {
				b.Fatalf("unheld %v, %v", unheld, err)
			}
		}
	})
}

// queryPlan is SQLite's plan of query, its steps joined by "; ".
func queryPlan(t *testing.T, s *Store, query string, args ...any) string {
	t.Helper()
	rows, err := s.db.Query("EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "; ")
}

// storeWithVolumes is a new store with n volumes of team "lab", vol-00000
// on, volume i with layers(i).
func storeWithVolumes(tb testing.TB, n int, layers func(i int) []string) *Store {
	tb.Helper()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(tb.TempDir(), "aenv.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: time.Unix(0, 0)}); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		v := &store.Volume{ID: fmt.Sprintf("vol-%05d", i), Name: fmt.Sprintf("v%05d", i), TeamID: "lab", Token: "t",
			CreatedAt: time.Now(), Layers: layers(i)}
		if err := s.CreateVolume(ctx, v); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}
