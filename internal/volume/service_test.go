package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newTestService(t *testing.T) (*Service, *sqlite.Store, string) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// The teams the tests' volumes belong to: a volume of a team with no
	// record is refused.
	for _, team := range []string{"lab", "other"} {
		if err := db.CreateTeam(ctx, &auth.Team{ID: team, CreatedAt: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "volumes")
	s, err := NewService(ctx, db, dir, "", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, db, dir
}

func TestServiceCreateNames(t *testing.T) {
	s, _, _ := newTestService(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		want error // nil: made
	}{
		{"data", nil},
		{"model-cache_v1.2", nil},
		{"data", errdefs.ErrConflict}, // taken in the team
		{"", errdefs.ErrInvalidArgument},
		{"-leading-dash", errdefs.ErrInvalidArgument},
		{"has space", errdefs.ErrInvalidArgument},
		{"a/b", errdefs.ErrInvalidArgument},
		{"..", errdefs.ErrInvalidArgument},
		{"vol-looks-like-an-id", errdefs.ErrInvalidArgument},
		{string(make([]byte, 64)), errdefs.ErrInvalidArgument},
	} {
		_, err := s.Create(ctx, "lab", tc.name, 0)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("create %q: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Another team may use a name this one has.
	if _, err := s.Create(ctx, "other", "data", 0); err != nil {
		t.Errorf("the same name in another team: %v", err)
	}
}

func TestServiceScopingAndTokens(t *testing.T) {
	s, _, dir := newTestService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, v.ID, "data")); err != nil || !st.IsDir() {
		t.Fatalf("the volume's directory: %v", err)
	}
	for _, tc := range []struct {
		team     string
		admin    bool
		idOrName string
		found    bool
	}{
		{"lab", false, v.ID, true},
		{"lab", false, "data", true},
		{"other", false, v.ID, false},
		{"other", false, "data", false},
		{"other", true, v.ID, true}, // an admin sees every team's by ID
	} {
		got, err := s.Get(ctx, tc.team, tc.admin, tc.idOrName)
		if tc.found != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrNotFound)) || (err == nil && got.ID != v.ID) {
			t.Errorf("get %q as %s (admin %v): %v, want found %v", tc.idOrName, tc.team, tc.admin, err, tc.found)
		}
	}
	for _, tc := range []struct {
		id, token string
		ok        bool
	}{
		{v.ID, v.Token, true},
		{v.ID, v.Token + "x", false},
		{v.ID, "", false},
		{"data", v.Token, false}, // the content API takes IDs, not names
		{"vol-nope", v.Token, false},
	} {
		_, err := s.Authorize(ctx, tc.id, tc.token)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrUnauthenticated)) {
			t.Errorf("authorize %q with token %.10q…: %v, want ok %v", tc.id, tc.token, err, tc.ok)
		}
	}

	if err := s.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted volume's files: %v", err)
	}
	if err := s.Delete(ctx, v); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
	if _, err := s.Authorize(ctx, v.ID, v.Token); err == nil {
		t.Error("a deleted volume's token still opens it")
	}
}

// A restart removes the files of a create or delete cut short (marked
// pending, no record), keeps files it cannot tell are nobody's (another
// node's or database's), gives a record whose files are gone an empty
// directory, and sweeps uploads a previous process left.
func TestServiceReconcile(t *testing.T) {
	s, db, dir := newTestService(t)
	ctx := context.Background()
	kept, err := s.Create(ctx, "lab", "kept", 0)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := s.Create(ctx, "lab", "lost", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, kept.ID, pendingMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a volume made whole keeps its pending mark: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, kept.ID, "data", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An upload a killed process left, and one that is not old.
	stale := filepath.Join(dir, kept.ID, "data", tempPrefix+"old")
	if err := os.WriteFile(stale, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, past, past); err != nil {
		t.Fatal(err)
	}
	cutShort := filepath.Join(dir, "vol-aaaaaaaaaaaaaaaaaaaa")
	unknown := filepath.Join(dir, "vol-bbbbbbbbbbbbbbbbbbbb")
	other := filepath.Join(dir, "lost+found")
	for _, d := range []string{cutShort, unknown, other} {
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cutShort, pendingMarker), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, lost.ID)); err != nil {
		t.Fatal(err)
	}
	again, err := NewService(ctx, db, dir, "", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(again.Close)
	// The sweep runs in the background.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(stale); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an upload left by a killed process was not swept in 10 s")
		}
	}
	if _, err := os.Stat(cutShort); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pending files without a record: %v, want removed", err)
	}
	for _, d := range []string{unknown, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("files without a record or a pending mark (%s): %v, want kept", filepath.Base(d), err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, kept.ID, "data", "f")); err != nil || string(b) != "x" {
		t.Errorf("a kept volume's file: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dir, lost.ID, "data")); err != nil || !st.IsDir() {
		t.Errorf("a record whose files were lost: %v, want an empty directory", err)
	}
}

// A node deletes only its own volumes: another's files are not here.
func TestServiceDeleteElsewhere(t *testing.T) {
	s, _, _ := newTestService(t)
	v, err := s.Create(context.Background(), "lab", "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	v.NodeID = "another-node"
	if err := s.Delete(context.Background(), v); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("delete another node's volume: %v, want unavailable", err)
	}
}

// A team's volumes are bounded; another team is not held by it.
func TestServiceTeamVolumeBound(t *testing.T) {
	s, _, _ := newTestService(t)
	s.maxPerTeam = 3 // MaxTeamVolumes, made small
	ctx := context.Background()
	for i := range s.maxPerTeam {
		if _, err := s.Create(ctx, "lab", fmt.Sprintf("v%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "lab", "one-more", 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a volume past the team's bound: %v, want resource exhausted", err)
	}
	if _, err := s.Create(ctx, "other", "first", 0); err != nil {
		t.Fatalf("another team's first volume: %v", err)
	}
}

// Each volume's usage is measured in the background and reported to
// GET /volumes/{id} and Prometheus.
func TestServiceUsage(t *testing.T) {
	s, _, dir := newTestService(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "lab", "sized", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, v.ID, "data", "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	s.measureAll(ctx)
	u, ok := s.UsageOf(v.ID)
	if !ok || u.Files != 1 || u.Bytes < 1<<20 {
		t.Fatalf("usage %+v %v, want one file of at least 1 MiB", u, ok)
	}
	got, err := testutil.GatherAndCount(collectorRegistry(t, s), "aenv_volume_used_bytes", "aenv_volumes")
	if err != nil || got != 2 {
		t.Fatalf("metrics: %d series, %v; want a volume count and one volume's bytes", got, err)
	}
	if err := s.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	s.measureAll(ctx)
	if _, ok := s.UsageOf(v.ID); ok {
		t.Error("a deleted volume still has a usage")
	}
}

func collectorRegistry(t *testing.T, s *Service) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	return reg
}

// No volume is made on a nearly full disk: 507, and nothing left.
func TestServiceRefusesOnAFullDisk(t *testing.T) {
	s, db, _ := newTestService(t)
	ctx := context.Background()
	s.minFreeFraction = 1.01 // more than the whole disk: always "full"
	_, err := s.Create(ctx, "lab", "big", 0)
	if !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("create on a full disk: %v, want insufficient storage", err)
	}
	if vs, _ := db.ListVolumes(ctx, ""); len(vs) != 0 {
		t.Errorf("a refused create left records: %v", vs)
	}
	s.minFreeFraction = 0
	s.minFreeBytes = 0
	if _, err := s.Create(ctx, "lab", "big", 0); err != nil {
		t.Fatalf("create with the floor off: %v", err)
	}
}
