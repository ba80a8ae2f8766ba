package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/aenv-dev/aenv/internal/usage"
)

// RunLedger runs the shared suite of the teams' usage by day: adds of the
// same team and day sum (two nodes, two flushes), lists filter by team
// and days and come by day then team.
func RunLedger(t *testing.T, newStore func(t *testing.T) usage.Ledger) {
	ctx := context.Background()
	s := newStore(t)
	day := func(team, d string, secs float64) usage.TeamDay {
		return usage.TeamDay{TeamID: team, Day: d, SandboxSeconds: secs, MemoryMBSeconds: secs * 512,
			VCPUSeconds: secs * 2, CPUSeconds: secs / 2, StoredMBSeconds: secs * 1000}
	}
	if err := s.AddTeamUsage(ctx, []usage.TeamDay{
		day("lab-b", "2026-11-30", 10), day("lab-a", "2026-11-30", 5), day("lab-a", "2026-12-01", 7),
	}); err != nil {
		t.Fatal(err)
	}
	// A second node's flush of the same day adds to it.
	if err := s.AddTeamUsage(ctx, []usage.TeamDay{day("lab-a", "2026-12-01", 3)}); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListTeamUsage(ctx, usage.LedgerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []usage.TeamDay{day("lab-a", "2026-11-30", 5), day("lab-b", "2026-11-30", 10), day("lab-a", "2026-12-01", 10)}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Fatalf("all days:\n%v\nwant\n%v", all, want)
	}
	for _, tc := range []struct {
		f    usage.LedgerFilter
		want int
	}{
		{usage.LedgerFilter{TeamID: "lab-a"}, 2},
		{usage.LedgerFilter{From: "2026-12-01"}, 1},
		{usage.LedgerFilter{To: "2026-11-30"}, 2},
		{usage.LedgerFilter{TeamID: "lab-b", From: "2026-12-01"}, 0},
		{usage.LedgerFilter{Limit: 2}, 2},
	} {
		got, err := s.ListTeamUsage(ctx, tc.f)
		if err != nil || len(got) != tc.want {
			t.Errorf("%+v: %v %v, want %d days", tc.f, got, err, tc.want)
		}
	}
}
