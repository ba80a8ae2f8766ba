package build

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A build whose marker a stopped server left behind is reported failed by
// the next one, and the marker goes.
func TestInterruptedBuildReportedFailed(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.MkdirAll(state, 0o700)
	os.WriteFile(filepath.Join(state, "b1.building"), []byte("my-app"), 0o600)
	os.WriteFile(filepath.Join(state, "b2.building"), []byte("../bad"), 0o600)
	uploads, err := NewUploads(filepath.Join(dir, "files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, nil, uploads, state, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, err := s.Status("my-app", "b1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != StatusError || info.Reason == nil || len(info.Logs) != 1 {
		t.Fatalf("interrupted build: %+v", info)
	}
	if _, err := s.Status("../bad", "b2", 0, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("marker with a bad name: %v", err)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Fatalf("markers left: %v", entries)
	}
}

func TestRequestAndStatus(t *testing.T) {
	uploads, _ := NewUploads(t.TempDir(), 1<<20)
	s, err := New(Config{}, nil, uploads, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id, err := s.Request("my-app", "", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.get("my-app", id)
	for i := 0; i < 5; i++ {
		b.log("info", "1", "line")
	}
	for _, tc := range []struct{ offset, limit, want int }{
		{0, 0, 5}, {3, 0, 2}, {5, 0, 0}, {9, 0, 0}, {1, 2, 2},
	} {
		info, err := s.Status("my-app", id, tc.offset, tc.limit)
		if err != nil || len(info.Logs) != tc.want {
			t.Errorf("offset %d limit %d: %d entries (%v), want %d", tc.offset, tc.limit, len(info.Logs), err, tc.want)
		}
	}
	if _, err := s.Request("base", "", false, 0, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("rebuilding base: %v", err)
	}
	// A name one team builds is not another's to build over.
	if _, err := s.Request("team-app", "lab-a", false, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Request("team-app", "lab-b", false, 0, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("another team's build of the name: %v, want ErrConflict", err)
	}
	if team, ok := s.TeamOf("team-app"); !ok || team != "lab-a" {
		t.Fatalf("team of the build: %q %v", team, ok)
	}
	if _, err := s.Request("team-app", "lab-a", false, 0, 0); err != nil {
		t.Fatalf("the same team builds again: %v", err)
	}
	// Old requests are forgotten beyond the bound.
	for i := 0; i < maxBuilds+10; i++ {
		if _, err := s.Request("other", "", false, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.builds) > maxBuilds {
		t.Fatalf("%d builds remembered", len(s.builds))
	}
}

// BuildStatus reports the newest build of a name, whatever its state.
func TestBuildStatus(t *testing.T) {
	uploads, _ := NewUploads(t.TempDir(), 1<<20)
	s, err := New(Config{}, nil, uploads, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.BuildStatuses()["app"]; got != "" {
		t.Fatalf("no build yet: %q", got)
	}
	first, _ := s.Request("app", "", false, 0, 0)
	b, _ := s.get("app", first)
	b.setStatus(StatusError, &Reason{Message: "failed"})
	if got := s.BuildStatuses()["app"]; got != StatusError {
		t.Errorf("after a failed build: %q", got)
	}
	second, _ := s.Request("app", "", false, 0, 0)
	if got := s.BuildStatuses()["app"]; got != StatusWaiting {
		t.Errorf("a new build requested: %q, want waiting", got)
	}
	b, _ = s.get("app", second)
	b.setStatus(StatusBuilding, nil)
	if got := s.BuildStatuses()["app"]; got != StatusBuilding {
		t.Errorf("building: %q", got)
	}
	if got := s.BuildStatuses()["other"]; got != "" {
		t.Errorf("another template: %q", got)
	}
}

// InProgress reports the newest build of each template while it waits or
// builds, with who asked and its shape; ended builds are not reported.
func TestInProgress(t *testing.T) {
	uploads, _ := NewUploads(t.TempDir(), 1<<20)
	s, err := New(Config{}, nil, uploads, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.InProgress(); len(got) != 0 {
		t.Fatalf("no build yet: %+v", got)
	}
	app, _ := s.Request("app", "lab", false, 2, 512)
	failed, _ := s.Request("failed", "lab", false, 0, 0)
	b, _ := s.get("failed", failed)
	b.setStatus(StatusError, &Reason{Message: "failed"})
	got := s.InProgress()
	if len(got) != 1 || got[0].Template != "app" || got[0].BuildID != app || got[0].Status != StatusWaiting ||
		got[0].TeamID != "lab" || got[0].VCPU != 2 || got[0].MemoryMB != 512 || got[0].Created.IsZero() {
		t.Fatalf("one waiting build: %+v", got)
	}
	b, _ = s.get("app", app)
	b.setStatus(StatusBuilding, nil)
	if got := s.InProgress(); len(got) != 1 || got[0].Status != StatusBuilding {
		t.Fatalf("building: %+v", got)
	}
	b.setStatus(StatusReady, nil)
	if got := s.InProgress(); len(got) != 0 {
		t.Fatalf("after the build ended: %+v", got)
	}
	// A request never started is reported for a while, not for ever.
	old, _ := s.Request("abandoned", "lab", false, 0, 0)
	b, _ = s.get("abandoned", old)
	b.mu.Lock()
	b.created = time.Now().Add(-unstartedFor - time.Minute)
	b.mu.Unlock()
	if got := s.InProgress(); len(got) != 0 {
		t.Fatalf("a request never started, long ago: %+v", got)
	}
	// One team's requests do not crowd out another's.
	for i := range maxInProgressPerTeam + 5 {
		if _, err := s.Request(fmt.Sprintf("flood-%d", i), "noisy", false, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Request("quiet", "calm", false, 0, 0); err != nil {
		t.Fatal(err)
	}
	teams := map[string]int{}
	for _, p := range s.InProgress() {
		teams[p.TeamID]++
	}
	if teams["noisy"] != maxInProgressPerTeam || teams["calm"] != 1 {
		t.Fatalf("builds reported by team: %v", teams)
	}
}

func TestBuildsOfATemplate(t *testing.T) {
	uploads, _ := NewUploads(t.TempDir(), 1<<20)
	s, err := New(Config{}, nil, uploads, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all := func(string) bool { return true }
	if got := s.Builds("app", all); len(got) != 0 {
		t.Fatalf("no build yet: %+v", got)
	}
	first, _ := s.Request("app", "team-a", false, 2, 1024)
	b, _ := s.get("app", first)
	b.setStatus(StatusBuilding, nil)
	b.setStatus(StatusReady, nil)
	second, _ := s.Request("app", "team-a", false, 1, 512)
	if _, err := s.Request("other", "team-b", false, 1, 512); err != nil {
		t.Fatal(err)
	}
	got := s.Builds("app", all)
	if len(got) != 2 || got[0].BuildID != second || got[1].BuildID != first {
		t.Fatalf("builds of app: %+v, want %s then %s", got, second, first)
	}
	if got[0].Status != StatusWaiting || !got[0].Finished.IsZero() || got[0].VCPU != 1 || got[0].MemoryMB != 512 {
		t.Errorf("the waiting build: %+v", got[0])
	}
	if f := got[1]; f.Status != StatusReady || f.Finished.IsZero() || f.Finished.Before(f.Created) || f.Updated != f.Finished {
		t.Errorf("the finished build: %+v", f)
	}
	if got := s.Builds("app", func(team string) bool { return team == "team-b" }); len(got) != 0 {
		t.Errorf("another team sees app's builds: %+v", got)
	}
}
