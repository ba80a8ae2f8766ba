package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// TeamStore keeps sandboxes, and teams with their keys and limits.
type TeamStore interface {
	store.Store
	auth.Store
}

// RunTeams runs the shared suite of teams, API keys and limits; newStore
// returns a fresh store.
func RunTeams(t *testing.T, newStore func(t *testing.T) TeamStore) {
	t.Run("Teams", func(t *testing.T) { testTeams(t, newStore(t)) })
	t.Run("Keys", func(t *testing.T) { testKeys(t, newStore(t)) })
	t.Run("Limit", func(t *testing.T) { testTeamLimit(t, newStore(t)) })
	t.Run("LimitRace", func(t *testing.T) { testTeamLimitRace(t, newStore(t)) })
	t.Run("ResourceLimits", func(t *testing.T) { testTeamResourceLimits(t, newStore(t)) })
	t.Run("SnapshotLimit", func(t *testing.T) { testTeamSnapshotLimit(t, newStore(t)) })
	t.Run("SnapshotBytes", func(t *testing.T) { testTeamSnapshotBytes(t, newStore(t)) })
	t.Run("VolumeLimits", func(t *testing.T) { testTeamVolumeLimits(t, newStore(t)) })
	t.Run("DeleteInUse", func(t *testing.T) { testTeamDeleteInUse(t, newStore(t)) })
	t.Run("DeleteRace", func(t *testing.T) { testTeamDeleteRace(t, newStore(t)) })
}

// volumesOf is the store's volumes, which every store here keeps.
func volumesOf(t *testing.T, s TeamStore) store.VolumeStore {
	t.Helper()
	v, ok := s.(store.VolumeStore)
	if !ok {
		t.Fatalf("store %T keeps no volumes", s)
	}
	return v
}

// A team with a volume or a live sandbox is not deleted (ErrConflict);
// once they are gone it is, and then no sandbox or volume is recorded
// for it (ErrNotFound): a create that was on its way when the team went.
func testTeamDeleteInUse(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sb := sandbox("sb1", store.StatePaused, now, nil)
	sb.TeamID = "lab"
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	vols := volumesOf(t, s)
	if err := vols.CreateVolume(ctx, &store.Volume{ID: "vol-1", Name: "data", TeamID: "lab", Token: "t", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "lab"); !errors.Is(err, store.ErrTeamInUse) {
		t.Fatalf("delete with a paused sandbox and a volume: %v, want ErrTeamInUse", err)
	}
	sb.State = store.StateDead
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "lab"); !errors.Is(err, store.ErrTeamInUse) {
		t.Fatalf("delete with a volume: %v, want ErrTeamInUse", err)
	}
	if _, err := vols.DeleteVolume(ctx, "vol-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "lab"); err != nil {
		t.Fatalf("delete with a dead sandbox only: %v", err)
	}
	if _, err := s.GetTeam(ctx, "lab"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	late := sandbox("sb2", store.StateStarting, now, nil)
	late.TeamID = "lab"
	if err := s.CreateSandbox(ctx, late); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a sandbox of the deleted team: %v, want ErrNotFound", err)
	}
	if err := vols.CreateVolume(ctx, &store.Volume{ID: "vol-2", Name: "data", TeamID: "lab", Token: "t", CreatedAt: now}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a volume of the deleted team: %v, want ErrNotFound", err)
	}
}

// A team's delete and its creates, at once, never both succeed: either
// the delete counts a create and is refused, or the create finds the team
// gone. A secret does not keep its team; the delete takes it along, and
// none made meanwhile outlives the team. On PostgreSQL the creates of a
// team without limits take no lock on each other; they share the team's
// advisory lock, which the delete takes exclusively.
func testTeamDeleteRace(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	vols := volumesOf(t, s)
	secrets, ok := s.(store.SecretStore)
	if !ok {
		t.Fatalf("store %T keeps no secrets", s)
	}
	for round := range 20 {
		team := fmt.Sprintf("race-%d", round)
		if err := s.CreateTeam(ctx, &auth.Team{ID: team, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var created []string
		var deleted bool
		for i := range 9 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s-%d", team, i)
				var err error
				switch i % 3 {
				case 0:
					sb := sandbox(id, store.StateStarting, now, nil)
					sb.TeamID = team
					err = s.CreateSandbox(ctx, sb)
				case 1:
					err = vols.CreateVolume(ctx, &store.Volume{ID: id, Name: id, TeamID: team, Token: "t", CreatedAt: now})
				default:
					sec := &store.Secret{ID: id, TeamID: team, Name: id, Version: 1, CreatedAt: now, UpdatedAt: now}
					if err = secrets.CreateSecret(ctx, sec, []byte("sealed")); err == nil {
						return
					}
				}
				switch {
				case err == nil:
					mu.Lock()
					created = append(created, id)
					mu.Unlock()
				case !errors.Is(err, store.ErrNotFound):
					t.Errorf("create %s: %v", id, err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.DeleteTeam(ctx, team)
			switch {
			case err == nil:
				mu.Lock()
				deleted = true
				mu.Unlock()
			case !errors.Is(err, store.ErrTeamInUse):
				t.Errorf("delete %s: %v", team, err)
			}
		}()
		wg.Wait()
		if deleted && len(created) > 0 {
			t.Fatalf("round %d: team %s was deleted and yet %v were recorded for it", round, team, created)
		}
		if left, err := secrets.ListSecrets(ctx, team); err != nil || (deleted && len(left) > 0) {
			t.Fatalf("round %d: secrets of team %s after its delete: %d, %v", round, team, len(left), err)
		}
	}
}

// A team's limit counts its sandboxes that are not dead; another team's,
// and sandboxes of no team, are not counted against it.
func testTeamLimit(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	for _, id := range []string{"lim", "free"} {
		if err := s.CreateTeam(ctx, &auth.Team{ID: id, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSandboxes: ptr(2)}); err != nil {
		t.Fatal(err)
	}
	create := func(id, team string, holding bool) error {
		sb := sandbox(id, store.StateRunning, now, nil)
		sb.TeamID = team
		if holding {
			return s.CreateSandboxHolding(ctx, sb, "/r")
		}
		return s.CreateSandbox(ctx, sb)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "t1", Name: "t1", RootfsPath: "/r", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := create("l1", "lim", false); err != nil {
		t.Fatal(err)
	}
	if err := create("l2", "lim", true); err != nil {
		t.Fatal(err)
	}
	for _, holding := range []bool{false, true} {
		if err := create("l3", "lim", holding); !errors.Is(err, store.ErrLimit) {
			t.Fatalf("a third sandbox over a limit of 2 (holding %v): %v, want ErrLimit", holding, err)
		}
	}
	for i, team := range []string{"free", "free", "free", ""} {
		if err := create("o"+string(rune('a'+i)), team, false); err != nil {
			t.Fatalf("a sandbox of team %q: %v", team, err)
		}
	}
	// A team with no record is one deleted while the create was on its
	// way: its sandbox is refused, not left to a team that is gone.
	for _, holding := range []bool{false, true} {
		if err := create("gone", "no-such-team", holding); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a sandbox of a team with no record (holding %v): %v, want ErrNotFound", holding, err)
		}
	}
	// A dead sandbox makes room.
	l1, err := s.GetSandbox(ctx, "l1")
	if err != nil {
		t.Fatal(err)
	}
	l1.State = store.StateDead
	if err := s.UpdateSandbox(ctx, l1); err != nil {
		t.Fatal(err)
	}
	if err := create("l3", "lim", true); err != nil {
		t.Fatalf("after one died: %v", err)
	}
	// 0 lifts the limit.
	if err := s.SetTeamLimits(ctx, "lim", auth.AllLimits(&auth.Team{})); err != nil {
		t.Fatal(err)
	}
	if err := create("l4", "lim", false); err != nil {
		t.Fatalf("without a limit: %v", err)
	}
}

// A team's memory and vCPU limits sum what its sandboxes that are not
// dead were given; one sandbox asking more than is left is refused even
// when the count would allow it.
func testTeamResourceLimits(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "res", CreatedAt: now, MaxMemoryMB: 1024, MaxVCPUs: 3}); err != nil {
		t.Fatal(err)
	}
	create := func(id string, memoryMB, vcpu int) error {
		sb := sandbox(id, store.StatePaused, now, nil)
		sb.TeamID, sb.MemoryMB, sb.VCPU = "res", memoryMB, vcpu
		return s.CreateSandbox(ctx, sb)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "tr", Name: "tr", RootfsPath: "/r", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := create("r1", 512, 1); err != nil {
		t.Fatal(err)
	}
	if err := create("r2", 768, 1); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("512+768 MiB against 1024: %v, want ErrLimit", err)
	}
	if err := create("r2", 512, 3); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("1+3 vCPUs against 3: %v, want ErrLimit", err)
	}
	if err := create("r2", 512, 2); err != nil {
		t.Fatalf("exactly at both limits: %v", err)
	}
	// A dead one gives back what it held.
	r1, err := s.GetSandbox(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	r1.State = store.StateDead
	if err := s.UpdateSandbox(ctx, r1); err != nil {
		t.Fatal(err)
	}
	if err := create("r3", 512, 1); err != nil {
		t.Fatalf("after one died: %v", err)
	}
	// TeamUse counts as the limits do, and CheckTeamRoom judges by it
	// without taking anything.
	if used, err := s.TeamUse(ctx, "res"); err != nil || used != (auth.Usage{Sandboxes: 2, MemoryMB: 1024, VCPUs: 3}) {
		t.Fatalf("use of team res: %+v, %v", used, err)
	}
	res, err := store.LimitedTeam(ctx, s, "res")
	if err != nil || res == nil || res.MaxMemoryMB != 1024 {
		t.Fatalf("limited team res: %+v %v", res, err)
	}
	if err := store.CheckTeamRoom(ctx, s, res, 0, 0); err != nil {
		t.Fatalf("room for a sandbox of no size yet at both limits: %v", err)
	}
	if err := store.CheckTeamRoom(ctx, s, res, 1, 0); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("room for 1 MiB more at the memory limit: %v, want ErrLimit", err)
	}
	if nobody, err := store.LimitedTeam(ctx, s, "nobody"); nobody != nil || err != nil {
		t.Fatalf("a team that does not exist: %+v %v, want none (no limits)", nobody, err)
	}

	// Sandboxes starting count against maxStarting; running ones do not.
	if err := s.CreateTeam(ctx, &auth.Team{ID: "slow", CreatedAt: now, MaxStarting: 1}); err != nil {
		t.Fatal(err)
	}
	starting := func(id string, state store.SandboxState) error {
		sb := sandbox(id, state, now, nil)
		sb.TeamID = "slow"
		return s.CreateSandbox(ctx, sb)
	}
	if err := starting("s1", store.StateRunning); err != nil {
		t.Fatal(err)
	}
	if err := starting("s2", store.StateStarting); err != nil {
		t.Fatalf("the first starting: %v", err)
	}
	if err := starting("s3", store.StateStarting); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a second starting against maxStarting 1: %v, want ErrLimit", err)
	}

	// The create rate's bucket is kept in the store, for both ways of
	// creating: at 1 per second, a create within a second of the first
	// is refused.
	if err := s.CreateTeam(ctx, &auth.Team{ID: "rate", CreatedAt: now, CreatesPerSecond: 1}); err != nil {
		t.Fatal(err)
	}
	rated := func(id string) *store.Sandbox {
		sb := sandbox(id, store.StateRunning, now, nil)
		sb.TeamID = "rate"
		return sb
	}
	first := time.Now()
	if err := s.CreateSandbox(ctx, rated("q1")); err != nil {
		t.Fatalf("the first create at 1 per second: %v", err)
	}
	err = s.CreateSandboxHolding(ctx, rated("q2"), "/r")
	if took := time.Since(first); took < time.Second && !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a second create %s after the first, at 1 per second: %v, want ErrLimit", took, err)
	}
	got, err := s.GetTeam(ctx, "rate")
	if err != nil || got.Bucket.At.Before(first) || got.Bucket.Tokens >= 1 {
		t.Fatalf("the bucket after a burst: %+v %v", got, err)
	}
	// SetTeamLimits leaves the bucket alone.
	if err := s.SetTeamLimits(ctx, "rate", auth.LimitsPatch{CreatesPerSecond: ptr(3), MaxStarting: ptr(9)}); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.GetTeam(ctx, "rate"); !again.Bucket.At.Equal(got.Bucket.At) || again.MaxStarting != 9 {
		t.Fatalf("after SetTeamLimits: %+v, bucket was %+v", again, got.Bucket)
	}
}

// Concurrent creates of one team never pass its limit together.
func testTeamLimitRace(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	const limit, tries = 5, 24
	if err := s.CreateTeam(ctx, &auth.Team{ID: "burst", CreatedAt: now, MaxSandboxes: limit}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTeamLimits(ctx, "burst", auth.LimitsPatch{MaxSandboxes: ptr(limit)}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, tries)
	for i := range tries {
		go func() {
			sb := sandbox(fmt.Sprintf("b%02d", i), store.StateStarting, now, nil)
			sb.TeamID = "burst"
			errs <- s.CreateSandbox(ctx, sb)
		}()
	}
	created := 0
	for range tries {
		switch err := <-errs; {
		case err == nil:
			created++
		case !errors.Is(err, store.ErrLimit):
			t.Errorf("create: %v, want nil or ErrLimit", err)
		}
	}
	if created != limit {
		t.Fatalf("%d of %d concurrent creates passed a limit of %d", created, tries, limit)
	}
}

func testTeams(t *testing.T, s auth.Store) {
	ctx := context.Background()
	// The default team exists from the start: the operator's key and
	// everything made before teams belong to it.
	if _, err := s.GetTeam(ctx, auth.DefaultTeam); err != nil {
		t.Fatalf("default team: %v", err)
	}
	now := time.Unix(1700000000, 5).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-a", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-a", CreatedAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("duplicate team: %v, want ErrConflict", err)
	}
	got, err := s.GetTeam(ctx, "lab-a")
	if err != nil || got.ID != "lab-a" || !got.CreatedAt.Equal(now) || got.MaxSandboxes != 0 {
		t.Fatalf("get team: %+v %v", got, err)
	}
	limits := auth.Team{MaxSandboxes: 7, MaxMemoryMB: 8192, MaxVCPUs: 16}
	if err := s.SetTeamLimits(ctx, "lab-a", auth.AllLimits(&limits)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetTeam(ctx, "lab-a"); got.MaxSandboxes != 7 || got.MaxMemoryMB != 8192 || got.MaxVCPUs != 16 {
		t.Fatalf("limits: %+v", got)
	}
	// Two changes of different limits, each naming only its own, both
	// hold: neither writes back the other's old value.
	if err := s.SetTeamLimits(ctx, "lab-a", auth.LimitsPatch{MaxVCPUs: ptr(4)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTeamLimits(ctx, "lab-a", auth.LimitsPatch{MaxStarting: ptr(2), MaxSandboxes: ptr(0)}); err != nil {
		t.Fatal(err)
	}
	want := auth.Team{MaxSandboxes: 0, MaxMemoryMB: 8192, MaxVCPUs: 4, MaxStarting: 2}
	if got, _ := s.GetTeam(ctx, "lab-a"); got.MaxSandboxes != want.MaxSandboxes || got.MaxMemoryMB != want.MaxMemoryMB ||
		got.MaxVCPUs != want.MaxVCPUs || got.MaxStarting != want.MaxStarting || got.CreatesPerSecond != 0 {
		t.Fatalf("limits after two partial changes: %+v, want %+v", got, want)
	}
	if err := s.SetTeamLimits(ctx, "nope", auth.LimitsPatch{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("limits of a missing team: %v", err)
	}
	teams, err := s.ListTeams(ctx)
	if err != nil || len(teams) != 2 || teams[0].ID != auth.DefaultTeam || teams[1].ID != "lab-a" {
		t.Fatalf("list teams: %v %v", teams, err)
	}
	// Deleting a team deletes its keys.
	_, k, err := auth.NewKey("lab-a", "k", false, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTeam(ctx, "lab-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTeam(ctx, "lab-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := s.KeyByDigest(ctx, k.Digest); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the deleted team's key: %v, want ErrNotFound", err)
	}
	if err := s.DeleteTeam(ctx, "lab-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func testKeys(t *testing.T, s auth.Store) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lab-b", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	secret, k, err := auth.NewKey("lab-b", "trainer", false, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	_, admin, _ := auth.NewKey(auth.DefaultTeam, "ops", true, now.Add(time.Second), 0)
	if err := s.CreateKey(ctx, admin); err != nil {
		t.Fatal(err)
	}
	_, orphan, _ := auth.NewKey("no-such-team", "x", false, now, 0)
	if err := s.CreateKey(ctx, orphan); err == nil {
		t.Fatal("a key of a team that does not exist was stored")
	}

	got, err := s.KeyByDigest(ctx, auth.Digest(secret))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.TeamID != "lab-b" || got.Name != "trainer" || got.Prefix != secret[:len(got.Prefix)] ||
		got.Admin || !got.CreatedAt.Equal(now) || !got.ExpiresAt.Equal(now.Add(time.Hour)) ||
		!got.LastUsedAt.IsZero() || !got.RevokedAt.IsZero() {
		t.Fatalf("key round trip: %+v, want %+v", got, k)
	}
	if _, err := s.KeyByDigest(ctx, auth.Digest(secret+"x")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
	if byID, err := s.GetKey(ctx, k.ID); err != nil || byID.Digest != k.Digest || byID.TeamID != "lab-b" {
		t.Fatalf("key by ID: %+v %v", byID, err)
	}
	if _, err := s.GetKey(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key ID: %v", err)
	}

	if err := s.TouchKey(ctx, k.ID, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.KeyByDigest(ctx, k.Digest); !got.LastUsedAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("last used: %v", got.LastUsedAt)
	}

	if keys, err := s.ListKeys(ctx, "lab-b"); err != nil || len(keys) != 1 || keys[0].ID != k.ID {
		t.Fatalf("keys of lab-b: %v %v", keys, err)
	}
	if keys, err := s.ListKeys(ctx, ""); err != nil || len(keys) != 2 || keys[0].ID != k.ID || keys[1].ID != admin.ID ||
		!keys[1].Admin {
		t.Fatalf("every key, oldest first: %v %v", keys, err)
	}

	revoked := now.Add(2 * time.Minute)
	if err := s.RevokeKey(ctx, k.ID, revoked); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, k.ID, revoked.Add(time.Hour)); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	got, err = s.KeyByDigest(ctx, k.Digest)
	if err != nil || !got.RevokedAt.Equal(revoked) || got.Usable(now) {
		t.Fatalf("revoked key: %+v %v (the first revocation's time stays)", got, err)
	}
	if err := s.RevokeKey(ctx, "nope", now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke a missing key: %v", err)
	}

	// Purged: keys revoked, or expired, before the time given; usable
	// ones and keys that never expire stay, whatever their age.
	_, expired, _ := auth.NewKey("lab-b", "old", false, now.Add(-2*time.Hour), time.Hour) // expired at now-1h
	_, lasting, _ := auth.NewKey("lab-b", "ci", false, now.Add(-48*time.Hour), 0)
	for _, key := range []*auth.Key{expired, lasting} {
		if err := s.CreateKey(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.PurgeKeys(ctx, now.Add(-90*time.Minute)); err != nil || n != 0 {
		t.Fatalf("purge before any revocation or expiry: %d, %v; want none", n, err)
	}
	if n, err := s.PurgeKeys(ctx, now); err != nil || n != 1 {
		t.Fatalf("purge at now: %d, %v; want the expired key", n, err)
	}
	if n, err := s.PurgeKeys(ctx, revoked.Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("purge after the revocation: %d, %v; want the revoked key", n, err)
	}
	keys, err := s.ListKeys(ctx, "")
	if err != nil || len(keys) != 2 || keys[0].ID != lasting.ID || keys[1].ID != admin.ID {
		t.Fatalf("keys left after the purges: %v %v; want the lasting and the admin key", keys, err)
	}
}

// A team's MaxSnapshots counts its snapshots and templates of sandboxes:
// not templates built from images, not another team's, not an update of a
// record it keeps, and a replacement takes the place of what it replaces.
func testTeamSnapshotLimit(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	for _, id := range []string{"lim", "free"} {
		if err := s.CreateTeam(ctx, &auth.Team{ID: id, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSnapshots: ptr(2)}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTeam(ctx, "lim"); err != nil || got.MaxSnapshots != 2 {
		t.Fatalf("team after the patch: %+v %v", got, err)
	}
	image := func(id, team string, kind store.TemplateKind) *store.Template {
		return &store.Template{ID: id, Name: id, RootfsPath: "/r/base", Kind: kind, TeamID: team, CreatedAt: now,
			ImageDir: "/img/" + id}
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "base", Name: "base", RootfsPath: "/r/base", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, tpl := range []*store.Template{
		image("s1", "lim", store.KindSnapshot),
		image("s2", "lim", store.KindSandboxTemplate),
		image("built", "lim", ""),                  // a template of an image: not counted
		image("other", "free", store.KindSnapshot), // another team's
	} {
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatalf("%s: %v", tpl.ID, err)
		}
	}
	err := s.PutTemplate(ctx, image("s3", "lim", store.KindSnapshot))
	if !errors.Is(err, store.ErrLimit) || !strings.Contains(err.Error(), "limit of 2 snapshots") {
		t.Fatalf("a third snapshot over a limit of 2: %v, want ErrLimit naming the limit", err)
	}
	if _, err := s.GetTemplate(ctx, "s3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused snapshot was recorded: %v", err)
	}
	// The early check judges the same way, and takes nothing.
	if err := s.SnapshotRoom(ctx, "lim"); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("early check at the limit: %v, want ErrLimit", err)
	}
	for _, team := range []string{"free", "", "nobody"} {
		if err := s.SnapshotRoom(ctx, team); err != nil {
			t.Fatalf("early check of team %q: %v", team, err)
		}
	}
	// An update of a record kept (its upload's state, say) passes.
	s1 := image("s1", "lim", store.KindSnapshot)
	s1.Upload = store.UploadUploaded
	if err := s.PutTemplate(ctx, s1); err != nil {
		t.Fatalf("update of a kept snapshot: %v", err)
	}
	// A replacement under s2's name takes its place.
	s4 := image("s4", "lim", store.KindSandboxTemplate)
	s4.Name = "s2"
	if _, err := s.ReplaceTemplate(ctx, s4); err != nil {
		t.Fatalf("replacement at the limit: %v", err)
	}
	// Deleting one makes room.
	if err := s.DeleteTemplate(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, image("s5", "lim", store.KindSnapshot)); err != nil {
		t.Fatalf("a snapshot after a delete made room: %v", err)
	}
	// A limit lowered below what the team keeps refuses new ones, but
	// not a replacement, which keeps the count.
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSnapshots: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	s7 := image("s7", "lim", store.KindSnapshot)
	s7.Name = "s5"
	if _, err := s.ReplaceTemplate(ctx, s7); err != nil {
		t.Fatalf("replacement over a lowered limit: %v", err)
	}
	if err := s.PutTemplate(ctx, image("s8", "lim", store.KindSnapshot)); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a new snapshot over a lowered limit: %v, want ErrLimit", err)
	}
	// Replacing under a name the team does not hold is a new one.
	s9 := image("s9", "lim", store.KindSnapshot)
	s9.Name = "fresh"
	if _, err := s.ReplaceTemplate(ctx, s9); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a replacement of nothing over the limit: %v, want ErrLimit", err)
	}
	// No limit: none counted.
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSnapshots: ptr(0)}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, image("s6", "lim", store.KindSnapshot)); err != nil {
		t.Fatalf("a snapshot once the limit is lifted: %v", err)
	}
}

// A team's MaxSnapshotMB sums its snapshots' image bytes: a record past it
// is refused, the early check refuses once nothing is left, a replacement
// no larger than what it replaces passes even over a lowered limit, and a
// larger one counts only its growth.
func testTeamSnapshotBytes(t *testing.T, s TeamStore) {
	ctx := context.Background()
	now := time.Unix(1700000000, 0).UTC()
	if err := s.CreateTeam(ctx, &auth.Team{ID: "lim", CreatedAt: now, MaxSnapshotMB: 100}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTeam(ctx, "lim"); err != nil || got.MaxSnapshotMB != 100 {
		t.Fatalf("team as created: %+v %v", got, err)
	}
	if err := s.PutTemplate(ctx, &store.Template{ID: "base", Name: "base", RootfsPath: "/r/base", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	image := func(id string, mb int64) *store.Template {
		return &store.Template{ID: id, Name: id, RootfsPath: "/r/base", Kind: store.KindSnapshot, TeamID: "lim",
			CreatedAt: now, ImageDir: "/img/" + id, ImageStats: store.ImageStats{Bytes: mb << 20}}
	}
	for _, tpl := range []*store.Template{image("s1", 40), image("s2", 50)} {
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatalf("%s: %v", tpl.ID, err)
		}
	}
	err := s.PutTemplate(ctx, image("s3", 11))
	if !errors.Is(err, store.ErrLimit) || !strings.Contains(err.Error(), "limit of 100 MiB") {
		t.Fatalf("11 MiB more over 90 of 100: %v, want ErrLimit naming the limit", err)
	}
	if err := s.SnapshotRoom(ctx, "lim"); err != nil {
		t.Fatalf("early check with 10 MiB left: %v", err)
	}
	if err := s.PutTemplate(ctx, image("s3", 10)); err != nil {
		t.Fatalf("10 MiB more over 90 of 100: %v", err)
	}
	if err := s.SnapshotRoom(ctx, "lim"); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("early check with nothing left: %v, want ErrLimit", err)
	}
	// A replacement no larger passes at the limit; a larger one would
	// pass it.
	bigger := image("s4", 41)
	bigger.Name = "s1"
	if _, err := s.ReplaceTemplate(ctx, bigger); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a replacement 1 MiB larger at the limit: %v, want ErrLimit", err)
	}
	same := image("s5", 40)
	same.Name = "s1"
	if _, err := s.ReplaceTemplate(ctx, same); err != nil {
		t.Fatalf("a replacement as large at the limit: %v", err)
	}
	// The upload's update of a kept record's size is not refused.
	same.ImageStats.Bytes = 45 << 20
	if err := s.PutTemplate(ctx, same); err != nil {
		t.Fatalf("update of a kept snapshot's size: %v", err)
	}
	// Lowered: nothing new; a smaller replacement still passes.
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSnapshotMB: ptr(50)}); err != nil {
		t.Fatal(err)
	}
	smaller := image("s6", 30)
	smaller.Name = "s2"
	if _, err := s.ReplaceTemplate(ctx, smaller); err != nil {
		t.Fatalf("a smaller replacement over a lowered limit: %v", err)
	}
	if err := s.PutTemplate(ctx, image("s7", 1)); !errors.Is(err, store.ErrLimit) {
		t.Fatalf("a new snapshot over a lowered limit: %v, want ErrLimit", err)
	}
	// Deletes make room: 30 + 10 of 50 held once s5 goes.
	if err := s.DeleteTemplate(ctx, "s5"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplate(ctx, image("s8", 10)); err != nil {
		t.Fatalf("a snapshot after a delete made room: %v", err)
	}
	// What the team's storage use counts: s6, s3 and s8 (the base
	// template, of no team and no image, adds nothing). An upload's
	// pending state, which knows no size, keeps the one recorded.
	if err := s.SetTemplateUpload(ctx, "s8", store.UploadPending, "", store.UploadDigests{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.TeamImageBytes(ctx)
	if err != nil || len(got) != 1 || got["lim"] != 50<<20 {
		t.Fatalf("image bytes by team: %v %v, want lim: 50 MiB", got, err)
	}
	// A count limit lowered below what the team keeps refuses no
	// replacement, even a larger one within the bytes.
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxSnapshots: ptr(1), MaxSnapshotMB: ptr(100)}); err != nil {
		t.Fatal(err)
	}
	larger := image("s9", 20)
	larger.Name = "s8"
	if _, err := s.ReplaceTemplate(ctx, larger); err != nil {
		t.Fatalf("a larger replacement over a lowered count limit: %v", err)
	}
}

// A team's MaxVolumes counts its volumes, and MaxVolumeMB their sizes:
// not another team's; a volume without a size is refused under a size
// limit; a delete makes room; concurrent creates never pass the count.
func testTeamVolumeLimits(t *testing.T, s TeamStore) {
	ctx := context.Background()
	vols := volumesOf(t, s)
	now := time.Unix(1700000000, 0).UTC()
	for _, id := range []string{"lim", "free"} {
		if err := s.CreateTeam(ctx, &auth.Team{ID: id, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxVolumes: ptr(4)}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTeam(ctx, "lim"); err != nil || got.MaxVolumes != 4 || got.MaxVolumeMB != 0 {
		t.Fatalf("team after the patch: %+v %v", got, err)
	}
	volume := func(id, team string, mb int64) *store.Volume {
		return &store.Volume{ID: id, Name: id, TeamID: team, Token: "t", CreatedAt: now, SizeBytes: mb << 20}
	}
	if err := vols.CreateVolume(ctx, volume("other", "free", 0)); err != nil {
		t.Fatal(err)
	}
	// A burst of 24 against a limit of 4: exactly 4.
	var wg sync.WaitGroup
	errs := make([]error, 24)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = vols.CreateVolume(ctx, volume(fmt.Sprintf("v%d", i), "lim", 0))
		}()
	}
	wg.Wait()
	made := 0
	for _, err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, store.ErrLimit) || !strings.Contains(err.Error(), "limit of 4 volumes"):
			t.Fatalf("a create past the limit: %v, want ErrLimit naming it", err)
		}
	}
	if n, err := vols.CountVolumes(ctx, "lim"); made != 4 || err != nil || n != 4 {
		t.Fatalf("a burst of 24 against a limit of 4 made %d (%d counted, %v)", made, n, err)
	}
	// Sizes: 4 unsized volumes held, room for 100 MiB more with 5 allowed.
	if err := s.SetTeamLimits(ctx, "lim", auth.LimitsPatch{MaxVolumes: ptr(0), MaxVolumeMB: ptr(100)}); err != nil {
		t.Fatal(err)
	}
	if err := vols.CreateVolume(ctx, volume("unsized", "lim", 0)); !errors.Is(err, errdefs.ErrConflict) || errors.Is(err, store.ErrLimit) ||
		!strings.Contains(err.Error(), "no size") {
		t.Fatalf("an unsized volume under a size limit: %v, want a conflict (not a limit) saying why", err)
	}
	if err := vols.CreateVolume(ctx, volume("big", "lim", 64)); err != nil {
		t.Fatalf("64 of 100 MiB: %v", err)
	}
	err := vols.CreateVolume(ctx, volume("bigger", "lim", 64))
	if !errors.Is(err, store.ErrLimit) || !strings.Contains(err.Error(), "limit of 100 MiB of volumes (64 held, 64 asked)") {
		t.Fatalf("64 more MiB over a limit of 100: %v, want ErrLimit naming it", err)
	}
	if err := vols.CreateVolume(ctx, volume("fits", "lim", 36)); err != nil {
		t.Fatalf("36 MiB more, to the limit: %v", err)
	}
	if err := vols.CreateVolume(ctx, volume("big-free", "free", 1<<20)); err != nil {
		t.Fatalf("another team's volume: %v", err)
	}
	// A delete makes room.
	if _, err := vols.DeleteVolume(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if err := vols.CreateVolume(ctx, volume("bigger", "lim", 64)); err != nil {
		t.Fatalf("after a delete made room: %v", err)
	}
}

func ptr(v int) *int { return &v }
