package integration

import (
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// checkUsage runs a team's sandbox and reads its use back, through read:
// the team's day grows while it runs, weighed by what it was given; a
// team's key sees its own team only; a snapshot it keeps is counted as
// storage, by its size and the time kept; CSV for spreadsheets; bad days
// are refused.
func checkUsage(t *testing.T, by, read endpoint) {
	t.Helper()
	by.want(201, apiKey, "POST", "/teams", map[string]any{"teamID": "metered"})
	var k struct {
		Key string `json:"key"`
	}
	by.want(201, apiKey, "POST", "/api-keys", map[string]any{"teamID": "metered"}).json(t, &k)
	var sb client.Sandbox
	by.want(201, k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base"}).json(t, &sb)
	defer by.call(k.Key, "DELETE", "/sandboxes/"+sb.SandboxID, nil)

	today := time.Now().UTC().Format(time.DateOnly)
	var days []client.TeamUsage
	// Nodes sample every 5 s and write every 10 s; the rest is for a
	// loaded machine.
	waitFor(t, 60*time.Second, "the team's use of today", func() bool {
		read.want(200, apiKey, "GET", "/usage?team=metered&from="+today, nil).json(t, &days)
		return len(days) == 1 && days[0].SandboxSeconds > 0
	})
	d := days[0]
	if d.TeamID != "metered" || d.Day != today || d.MemoryMBSeconds < d.SandboxSeconds*float64(sb.MemoryMB)*0.99 ||
		d.VCPUSeconds < d.SandboxSeconds*float64(sb.CPUCount)*0.99 || d.CPUSeconds < 0 {
		t.Fatalf("the team's day %+v, for a sandbox of %d MiB and %d vCPUs", d, sb.MemoryMB, sb.CPUCount)
	}
	// A snapshot kept is storage: at least its size for the seconds
	// between the first account that saw it and the last read.
	var snap struct {
		SnapshotID string `json:"snapshotID"`
		Bytes      int64  `json:"bytes"`
	}
	by.want(201, k.Key, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{}).json(t, &snap)
	defer by.call(k.Key, "DELETE", "/templates/"+snap.SnapshotID, nil)
	if snap.Bytes <= 0 {
		t.Fatalf("snapshot %s answers %d bytes", snap.SnapshotID, snap.Bytes)
	}
	waitFor(t, 60*time.Second, "the team's stored snapshot counted", func() bool {
		read.want(200, apiKey, "GET", "/usage?team=metered&from="+today, nil).json(t, &days)
		return len(days) == 1 && days[0].StoredMBSeconds > 0
	})
	// One account counts at least one flush interval (10 s) of it; the
	// snapshot is the team's only stored thing.
	if got, least := days[0].StoredMBSeconds, float64(snap.Bytes)/(1<<20)*5; got < least {
		t.Errorf("stored MiB·s %.1f, want at least %.1f (%d bytes for 5 s)", got, least, snap.Bytes)
	}
	// The team's key sees its own team, whatever it asks.
	var own []client.TeamUsage
	read.want(200, k.Key, "GET", "/usage?team=default", nil).json(t, &own)
	for _, u := range own {
		if u.TeamID != "metered" {
			t.Fatalf("a team's key read another team's use: %+v", own)
		}
	}
	r := read.want(200, apiKey, "GET", "/usage?team=metered&format=csv", nil)
	rows, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil || len(rows) != 2 || rows[0][0] != "day" || rows[1][1] != "metered" || len(rows[0]) != 7 ||
		rows[0][6] != "stored_mb_seconds" ||
		!strings.HasPrefix(r.header.Get("Content-Type"), "text/csv") {
		t.Fatalf("CSV: %q (%v), content type %q", r.body, err, r.header.Get("Content-Type"))
	}
	for _, bad := range []string{"from=yesterday", "to=2026-13-01", "format=xml"} {
		read.want(400, apiKey, "GET", "/usage?"+bad, nil)
	}
}
