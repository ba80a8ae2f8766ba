package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
	"github.com/aenv-dev/aenv/internal/store/storetest"
	"github.com/aenv-dev/aenv/internal/usage"
)

func open(t testing.TB, connString string) *Store {
	t.Helper()
	s, err := Open(context.Background(), connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The shared suite, each case on a database of its own.
func TestStore(t *testing.T) {
	srv := pgtest.New(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv.NewDatabase(t)) })
}

func TestTeams(t *testing.T) {
	srv := pgtest.New(t)
	storetest.RunTeams(t, func(t *testing.T) storetest.TeamStore { return open(t, srv.NewDatabase(t)) })
}

func TestLedger(t *testing.T) {
	srv := pgtest.New(t)
	storetest.RunLedger(t, func(t *testing.T) usage.Ledger { return open(t, srv.NewDatabase(t)) })
}

func TestAudit(t *testing.T) {
	srv := pgtest.New(t)
	storetest.RunAudit(t, func(t *testing.T) audit.Store { return open(t, srv.NewDatabase(t)) })
}

func TestSecrets(t *testing.T) {
	srv := pgtest.New(t)
	storetest.RunSecrets(t, func(t *testing.T) store.SecretStore { return open(t, srv.NewDatabase(t)) })
}

func TestVolumes(t *testing.T) {
	srv := pgtest.New(t)
	storetest.RunVolumes(t, func(t *testing.T) store.VolumeStore { return open(t, srv.NewDatabase(t)) })
	t.Run("Layers", func(t *testing.T) {
		storetest.RunVolumeLayers(t, func(t *testing.T) storetest.VolumeAndSandboxStore {
			return open(t, srv.NewDatabase(t))
		})
	})
	t.Run("Mounts", func(t *testing.T) {
		storetest.RunVolumeMounts(t, func(t *testing.T) storetest.VolumeAndSandboxStore {
			return open(t, srv.NewDatabase(t))
		})
	})
	// Each node lists its own volumes only; counts are the team's over
	// every node.
	t.Run("ByNode", func(t *testing.T) {
		ctx := context.Background()
		dsn := srv.NewDatabase(t)
		nodes := map[string]*Store{}
		for i, id := range []string{"node-1", "node-2"} {
			s, err := OpenNode(ctx, dsn, id)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			nodes[id] = s
			if i == 0 {
				if err := s.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			for j := range 2 {
				v := &store.Volume{ID: fmt.Sprintf("vol-%d-%d", i, j), Name: fmt.Sprintf("v-%d-%d", i, j), TeamID: "lab",
					Token: "tok", CreatedAt: time.Now()}
				if err := s.CreateVolume(ctx, v); err != nil {
					t.Fatal(err)
				}
			}
		}
		for id, s := range nodes {
			vs, err := s.ListNodeVolumes(ctx, id)
			if err != nil || len(vs) != 2 {
				t.Fatalf("volumes of %s: %d %v, want 2", id, len(vs), err)
			}
			for _, v := range vs {
				if v.NodeID != id {
					t.Errorf("volumes of %s include %s of %s", id, v.ID, v.NodeID)
				}
			}
			if n, err := s.CountVolumes(ctx, "lab"); err != nil || n != 4 {
				t.Errorf("count through %s: %d %v, want 4", id, n, err)
			}
		}
	})
}

// A database made before references gets them from its records.
func TestRefsBackfill(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Backfill(t, s, func() {
		if _, err := s.pool.Exec(ctx, `DROP TABLE refs; DELETE FROM schema_migrations WHERE version = 7`); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}, func() store.Store { return open(t, dsn) })
}

// Reopening keeps what was committed and does not re-apply migrations.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t).NewDatabase(t)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "t1", Name: "base"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dsn)
	if _, err := s.GetTemplate(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	assertMigrations(t, dsn)
}

// Nodes of a cluster start together: opening one fresh database from many
// processes at once must migrate it exactly once and fail none of them.
func TestConcurrentOpen(t *testing.T) {
	dsn := pgtest.New(t).NewDatabase(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// A pool of its own each, as separate processes would have.
			s, err := Open(ctx, dsn)
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = s.CreateSandbox(ctx, &store.Sandbox{ID: fmt.Sprintf("sb%d", i), State: store.StateRunning})
			s.Close()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("opener %d: %v", i, err)
		}
	}
	assertMigrations(t, dsn)
	list, err := open(t, dsn).ListSandboxes(context.Background(), store.SandboxFilter{})
	if err != nil || len(list) != n {
		t.Fatalf("after concurrent opens: %d sandboxes, %v", len(list), err)
	}
}

// assertMigrations checks that each embedded migration is recorded once.
func assertMigrations(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT name FROM schema_migrations ORDER BY version`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("schema_migrations: %v, want %d migrations", got, len(want))
	}
	for i, m := range want {
		if got[i] != m.name {
			t.Fatalf("schema_migrations: %v, want %s at %d", got, m.name, i)
		}
	}
}

// Ordering is byte order whatever the database's collation, as in SQLite
// ("B" < "a" < "b"; a linguistic collation puts "a" first).
func TestByteOrder(t *testing.T) {
	srv := pgtest.New(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// A collation unlike byte order, where the machine has one (ICU is
	// part of Debian's build).
	if _, err := admin.Exec(ctx, `CREATE DATABASE icu TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'`); err != nil {
		t.Fatalf("create an ICU database: %v", err)
	}
	s := open(t, srv.ConnString("icu"))
	at := time.Unix(1700000000, 0).UTC()
	for _, id := range []string{"b", "a", "B"} {
		if err := s.CreateSandbox(ctx, &store.Sandbox{ID: id, StartedAt: at, State: store.StateRunning}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTemplate(ctx, &store.Template{ID: id, Name: id, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	sandboxes, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	templates, err := s.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sbIDs, tplIDs []string
	for _, sb := range sandboxes {
		sbIDs = append(sbIDs, sb.ID)
	}
	for _, tpl := range templates {
		tplIDs = append(tplIDs, tpl.ID)
	}
	for name, got := range map[string][]string{"sandboxes": sbIDs, "templates": tplIDs} {
		if strings.Join(got, ",") != "B,a,b" {
			t.Errorf("%s: %v, want [B a b]", name, got)
		}
	}
}

// A dropped connection is not fatal: operations caught by it fail with a
// wrapped error (never a panic, never ErrNotFound), and once the server is
// back the pool reconnects by itself.
func TestRecovers(t *testing.T) {
	cases := []struct {
		name string
		// drop breaks the store's connections; it returns once the server
		// accepts connections again.
		drop func(t *testing.T, srv *pgtest.Server, s *Store)
	}{
		{"server restart", func(t *testing.T, srv *pgtest.Server, s *Store) {
			srv.Stop(t)
			// While the server is down, operations fail quickly and say
			// what they were doing.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := s.GetSandbox(ctx, "sb1")
			if err == nil || errors.Is(err, store.ErrNotFound) || !strings.HasPrefix(err.Error(), "get sandbox sb1: ") {
				t.Errorf("get while the server is down: %v", err)
			}
			if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "sb2"}); err == nil ||
				!strings.HasPrefix(err.Error(), "create sandbox sb2: ") {
				t.Errorf("create while the server is down: %v", err)
			}
			// Every kind of call says the database is away (the API
			// answers 503), not that it failed.
			for what, err := range map[string]error{
				"get":    err,
				"create": s.CreateSandbox(ctx, &store.Sandbox{ID: "sb2"}),
				"update": s.UpdateSandbox(ctx, &store.Sandbox{ID: "sb1", State: store.StatePaused}),
				"list": func() error {
					_, err := s.ListSandboxes(ctx, store.SandboxFilter{})
					return err
				}(),
				"route": func() error {
					_, err := s.SandboxNode(ctx, "sb1")
					return err
				}(),
				"heartbeat": func() error {
					_, err := s.Heartbeat(ctx, "node-1", NodeUse{})
					return err
				}(),
			} {
				if !errors.Is(err, store.ErrUnavailable) {
					t.Errorf("%s while the server is down: %v, want store.ErrUnavailable", what, err)
				}
			}
			srv.Start(t)
		}},
		{"backend terminated", func(t *testing.T, srv *pgtest.Server, s *Store) {
			ctx := context.Background()
			admin, err := pgx.Connect(ctx, srv.ConnString("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatal("no connection of the store to terminate")
			}
		}},
	}
	srv := pgtest.New(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t, srv.NewDatabase(t))
			at := time.Unix(1700000000, 0).UTC()
			if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "sb1", State: store.StateRunning, StartedAt: at}); err != nil {
				t.Fatal(err)
			}
			tc.drop(t, srv, s)

			// The pool may hand out a connection it has not yet found
			// broken; that operation fails, the next gets a new one.
			const bound = 30 * time.Second
			start := time.Now()
			var failures []error
			for {
				opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := s.GetSandbox(opCtx, "sb1")
				cancel()
				if err == nil {
					break
				}
				if errors.Is(err, store.ErrNotFound) {
					t.Fatalf("get after the drop: %v", err)
				}
				if !errors.Is(err, store.ErrUnavailable) {
					t.Errorf("get after the drop: %v, want store.ErrUnavailable", err)
				}
				failures = append(failures, err)
				if time.Since(start) > bound {
					t.Fatalf("store did not recover within %v: %v", bound, failures)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("recovered in %v after %d failed operations %v", time.Since(start).Round(time.Millisecond),
				len(failures), failures)

			// Recovered means every operation works again, writes included.
			sb, err := s.GetSandbox(ctx, "sb1")
			if err != nil {
				t.Fatal(err)
			}
			sb.State = store.StatePaused
			if err := s.UpdateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if err := s.CreateSandbox(ctx, &store.Sandbox{ID: "sb3", State: store.StateRunning, StartedAt: at}); err != nil {
				t.Fatal(err)
			}
			list, err := s.ListSandboxes(ctx, store.SandboxFilter{States: []store.SandboxState{store.StatePaused}})
			if err != nil || len(list) != 1 || list[0].ID != "sb1" {
				t.Fatalf("list after recovery: %v %v", list, err)
			}
		})
	}
}
