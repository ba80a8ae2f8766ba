package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres/pgtest"
)

// A create that counts a team's sandboxes while another create of the
// team is between its count and its commit waits for it, and then counts
// its sandbox: the limit holds across nodes (each with its own
// connections), not only for creates that happen not to overlap.
func TestTeamLimitWaitsForConcurrentCreate(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "one", CreatedAt: now, MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	newSandbox := func(id string) *store.Sandbox {
		return &store.Sandbox{ID: id, TemplateID: "t", State: store.StateStarting, StartedAt: now, UpdatedAt: now,
			EndAt: now, SlotIndex: -1, TeamID: "one"}
	}

	// The first create, held open between its check and its commit.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	first := newSandbox("first")
	if err := checkTeamLimit(ctx, tx, first); err != nil {
		t.Fatal(err)
	}
	args, err := sandboxArgs(s.box, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sandboxInsert, append(args, s.node, "one", "")...); err != nil {
		t.Fatal(err)
	}

	second := make(chan error, 1)
	go func() { second <- s.CreateSandbox(ctx, newSandbox("second")) }()
	// The second either waits for the first's lock or (the defect) has
	// already passed its check.
	var done error
	finished := false
	deadline := time.Now().Add(30 * time.Second)
	for !finished {
		select {
		case done = <-second:
			finished = true
			continue
		default:
		}
		var waiting int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second create neither finished nor waited in 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if finished {
		t.Fatalf("the second create finished (%v) while the first was uncommitted: both passed the limit of 1", done)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; !errors.Is(err, store.ErrLimit) {
		t.Fatalf("the second create after the first committed: %v, want ErrLimit", err)
	}
}

// A gateway of the release before teams adds its operator's key the way
// it did (key_sha256 and created_at only) into a database migrated since:
// the key works, as an admin key of the default team.
func TestOldGatewayAddsOperatorKey(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	if _, err := s.pool.Exec(ctx, `INSERT INTO api_keys (key_sha256, created_at) VALUES ($1, $2)`,
		auth.Digest("old-operator-key"), time.Now().UnixNano()); err != nil {
		t.Fatalf("the previous release's insert: %v", err)
	}
	k, err := s.KeyByDigest(ctx, auth.Digest("old-operator-key"))
	if err != nil || !k.Admin || k.TeamID != auth.DefaultTeam || k.ID == "" || !k.Usable(time.Now()) {
		t.Fatalf("the old gateway's key: %+v %v, want a usable admin key of the default team", k, err)
	}
}

// BenchmarkLimitedTeamCreate is a create of a team with limits, whose
// check sums what the team's sandboxes hold under the team's lock, beside
// a create of a team without limits, as the team holds more sandboxes.
func BenchmarkLimitedTeamCreate(b *testing.B) {
	ctx := context.Background()
	s := open(b, pgtest.New(b).NewDatabase(b))
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "one", CreatedAt: now, MaxSandboxes: 1000000}); err != nil {
		b.Fatal(err)
	}
	if err := s.CreateTeam(ctx, &auth.Team{ID: "free", CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	i := 0
	mk := func(team string) {
		i++
		sb := &store.Sandbox{ID: fmt.Sprintf("sb%07d", i), TemplateID: "t", State: store.StateRunning, StartedAt: now, UpdatedAt: now,
			EndAt: now, SlotIndex: -1, TeamID: team, MemoryMB: 512, VCPU: 1}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range []int{0, 1000, 10000} {
		for i < n {
			mk("one")
		}
		b.Run(fmt.Sprintf("limited team holding %d", n), func(b *testing.B) {
			for b.Loop() {
				mk("one")
			}
		})
		b.Run(fmt.Sprintf("team without limits, beside %d", n), func(b *testing.B) {
			for b.Loop() {
				mk("free")
			}
		})
	}
}

// Creates and snapshots of a team with both kinds of limits, at once over
// the same root filesystem: each takes the team's row before the root
// filesystem's lock, so none deadlocks (PostgreSQL would abort one).
func TestCreatesAndSnapshotsOfALimitedTeam(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.New(t).NewDatabase(t))
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lim", CreatedAt: now, MaxSandboxes: 1000, MaxSnapshots: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "base", Name: "base", RootfsPath: "/r", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 80)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			sb := &store.Sandbox{ID: fmt.Sprintf("sb%d", i), TemplateID: "base", State: store.StateRunning,
				StartedAt: now, UpdatedAt: now, EndAt: now, SlotIndex: -1, TeamID: "lim"}
			if err := s.CreateSandboxHolding(ctx, sb, "/r"); err != nil {
				errs <- fmt.Errorf("create %s: %w", sb.ID, err)
			}
		}()
		go func() {
			defer wg.Done()
			snap := &store.Template{ID: fmt.Sprintf("snap%d", i), Name: fmt.Sprintf("snap%d", i), RootfsPath: "/r",
				Kind: store.KindSnapshot, TeamID: "lim", CreatedAt: now, ImageDir: "/img"}
			if err := s.PutTemplate(ctx, snap); err != nil {
				errs <- fmt.Errorf("snapshot %s: %w", snap.ID, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
