package auth

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

func TestNewKey(t *testing.T) {
	now := time.Unix(1700000000, 0)
	key, k, err := NewKey("lab-a", "trainer", false, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, KeyPrefix) || len(key) != len(KeyPrefix)+40 {
		t.Fatalf("key %q: want %s and 40 hex digits", key, KeyPrefix)
	}
	if k.Digest != Digest(key) || strings.Contains(k.Digest, key) || !strings.HasPrefix(key, k.Prefix) ||
		len(k.Prefix) >= len(key)/2 {
		t.Fatalf("record %+v keeps too much or too little of %q", k, key)
	}
	if k.TeamID != "lab-a" || k.Name != "trainer" || k.Admin || !k.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("record %+v", k)
	}
	again, k2, _ := NewKey("lab-a", "trainer", false, now, 0)
	if again == key || k2.ID == k.ID || !k2.ExpiresAt.IsZero() {
		t.Fatalf("two keys alike: %q %q, %s %s", key, again, k.ID, k2.ID)
	}
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{
		{strings.Repeat("n", MaxKeyName+1), 0},
		{"bell\a", 0},
		{"ok", -time.Second},
	} {
		if _, _, err := NewKey("lab-a", tc.name, false, now, tc.ttl); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("name %q, lifetime %s: %v, want invalid", tc.name, tc.ttl, err)
		}
	}
}

func TestKeyUsable(t *testing.T) {
	now := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name string
		key  Key
		want bool
	}{
		{"plain", Key{}, true},
		{"not yet expired", Key{ExpiresAt: now.Add(time.Second)}, true},
		{"expired", Key{ExpiresAt: now}, false},
		{"revoked", Key{RevokedAt: now.Add(-time.Hour)}, false},
	} {
		if got := tc.key.Usable(now); got != tc.want {
			t.Errorf("%s: usable %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestValidTeamID(t *testing.T) {
	for id, ok := range map[string]bool{
		"default": true, "lab-a": true, "a": true, "0team": true, strings.Repeat("a", 63): true,
		"": false, "-lab": false, "Lab": false, "lab_a": false, "lab a": false, "lab/a": false,
		strings.Repeat("a", 64): false, "lab\n": false,
	} {
		if err := ValidTeamID(id); (err == nil) != ok {
			t.Errorf("team ID %q: %v, want valid %v", id, err, ok)
		}
	}
}

func TestPrincipalSees(t *testing.T) {
	team := Principal{TeamID: "lab-a"}
	admin := Operator()
	for _, tc := range []struct {
		p          Principal
		team       string
		sees, uses bool
	}{
		{team, "lab-a", true, true},
		{team, "lab-b", false, false},
		{team, "", false, true}, // public: used, not owned
		{admin, "lab-b", true, true},
		{admin, "", true, true},
	} {
		if got := tc.p.Sees(tc.team); got != tc.sees {
			t.Errorf("%+v sees %q: %v, want %v", tc.p, tc.team, got, tc.sees)
		}
		if got := tc.p.Uses(tc.team); got != tc.uses {
			t.Errorf("%+v uses %q: %v, want %v", tc.p, tc.team, got, tc.uses)
		}
	}
}

func TestUseRecorder(t *testing.T) {
	u := NewUseRecorder(time.Minute, 2)
	now := time.Unix(1700000000, 0)
	if !u.Due("a", now) || u.Due("a", now.Add(59*time.Second)) || !u.Due("a", now.Add(time.Minute)) {
		t.Fatal("a key's use is written once a minute")
	}
	if !u.Due("b", now) {
		t.Fatal("another key's first use is written")
	}
}

func TestTeamAdmit(t *testing.T) {
	team := &Team{ID: "lab", MaxSandboxes: 3, MaxMemoryMB: 2048, MaxVCPUs: 4, MaxStarting: 2}
	for _, tc := range []struct {
		name         string
		used         Usage
		memory, vcpu int
		want         string // part of the refusal; "" admits
	}{
		{"empty", Usage{}, 512, 1, ""},
		{"exactly at every limit", Usage{2, 1536, 3, 1}, 512, 1, ""},
		{"one sandbox too many", Usage{3, 0, 0, 0}, 512, 1, "limit of 3 sandboxes"},
		{"memory past", Usage{1, 1600, 1, 0}, 512, 1, "2048 MiB of sandbox memory (1600 held, 512 asked)"},
		{"vcpus past", Usage{1, 512, 3, 0}, 512, 2, "limit of 4 vCPUs (3 held, 2 asked)"},
		{"two starting", Usage{2, 0, 0, 2}, 512, 1, "limit of 2 sandboxes starting at once"},
		{"one bigger than the whole limit", Usage{}, 4096, 1, "MiB of sandbox memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := team.Admit(tc.used, tc.memory, tc.vcpu, time.Now())
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal naming %q", err, tc.want)
			}
		})
	}
	if err := (&Team{ID: "free"}).Admit(Usage{1 << 20, 1 << 30, 1 << 20, 1 << 20}, 1<<20, 64, time.Now()); err != nil {
		t.Fatalf("a team without limits refused: %v", err)
	}
}

func TestValidLimits(t *testing.T) {
	for _, tc := range []struct {
		team Team
		ok   bool
	}{
		{Team{}, true},
		{Team{MaxSandboxes: MaxTeamSandboxes, MaxMemoryMB: MaxTeamMemoryMB, MaxVCPUs: MaxTeamVCPUs}, true},
		{Team{MaxSandboxes: -1}, false},
		{Team{MaxMemoryMB: -1}, false},
		{Team{MaxVCPUs: MaxTeamVCPUs + 1}, false},
		{Team{MaxMemoryMB: MaxTeamMemoryMB + 1}, false},
		{Team{MaxStarting: -1}, false},
		{Team{CreatesPerSecond: MaxTeamSandboxes + 1}, false},
		{Team{MaxVolumes: MaxTeamSandboxes, MaxVolumeMB: MaxTeamVolumeMB}, true},
		{Team{MaxVolumes: -1}, false},
		{Team{MaxVolumeMB: MaxTeamVolumeMB + 1}, false},
		{Team{MaxSnapshotMB: MaxTeamVolumeMB}, true},
		{Team{MaxSnapshotMB: -1}, false},
		{Team{MaxSnapshotMB: MaxTeamVolumeMB + 1}, false},
	} {
		if err := ValidLimits(&tc.team); (err == nil) != tc.ok {
			t.Errorf("ValidLimits(%+v) = %v, want ok %v", tc.team, err, tc.ok)
		}
	}
}

// The create rate is a bucket one second deep: a full one admits a burst
// of the rate, then one more per 1/rate seconds; a clock behind the last
// create's adds nothing; a refusal takes nothing.
func TestTeamCreateRate(t *testing.T) {
	team := &Team{ID: "lab", CreatesPerSecond: 4}
	t0 := time.Unix(1700000000, 0)
	admitted := func(at time.Time) bool { return team.Admit(Usage{}, 0, 0, at) == nil }
	for i := range 4 {
		if !admitted(t0) {
			t.Fatalf("create %d of a burst of 4 refused", i+1)
		}
	}
	if admitted(t0) {
		t.Fatal("a fifth create in the same instant admitted")
	}
	if admitted(t0.Add(200 * time.Millisecond)) {
		t.Fatal("admitted after 0.2 s, before a token (0.25 s) came back")
	}
	if !admitted(t0.Add(250 * time.Millisecond)) {
		t.Fatal("refused after 0.25 s, when one token came back")
	}
	if admitted(t0.Add(-time.Hour)) {
		t.Fatal("a clock an hour behind filled the bucket")
	}
	// Nor does a clock behind, once it admits, move the bucket back for
	// the next node: creates alternating between a node 10 s behind and
	// one on time stay at the rate (a burst of 5, then 5 a second).
	skew := &Team{ID: "skew", CreatesPerSecond: 5}
	made := 0
	for i := range 40 {
		now := t0.Add(time.Duration(i) * 50 * time.Millisecond) // 2 s in all
		if i%2 == 1 {
			now = now.Add(-10 * time.Second)
		}
		if skew.Admit(Usage{}, 0, 0, now) == nil {
			made++
		}
	}
	if made > 5+2*5+1 {
		t.Fatalf("40 creates over 2 s at 5 per second, half from a clock 10 s behind, made %d", made)
	}
	// An idle hour fills it to one second's worth, no more.
	later := t0.Add(time.Hour)
	n := 0
	for admitted(later) {
		n++
	}
	if n != 4 {
		t.Fatalf("after an idle hour a burst made %d, want 4", n)
	}
	err := team.Admit(Usage{}, 0, 0, later)
	if err == nil || !strings.Contains(err.Error(), "limit of 4 creates per second") {
		t.Fatalf("refusal: %v", err)
	}
}

func TestVolumeRoom(t *testing.T) {
	for _, tc := range []struct {
		team                 Team
		held                 int
		heldBytes, sizeBytes int64
		want                 string // in the refusal; "" for room
	}{
		{Team{ID: "lab"}, 1000, 1 << 40, 0, ""},
		{Team{ID: "lab", MaxVolumes: 2}, 1, 0, 0, ""},
		{Team{ID: "lab", MaxVolumes: 2}, 2, 0, 0, "limit of 2 volumes"},
		{Team{ID: "lab", MaxVolumeMB: 100}, 0, 0, 0, "no size"},
		{Team{ID: "lab", MaxVolumeMB: 100}, 1, 60 << 20, 40 << 20, ""},
		{Team{ID: "lab", MaxVolumeMB: 100}, 1, 60 << 20, 40<<20 + 1, "limit of 100 MiB of volumes (60 held, 41 asked)"},
	} {
		err := tc.team.VolumeRoom(tc.held, tc.heldBytes, tc.sizeBytes)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v.VolumeRoom(%d, %d, %d) = %v, want %q", tc.team, tc.held, tc.heldBytes, tc.sizeBytes, err, tc.want)
		}
	}
}

func TestSnapshotRoom(t *testing.T) {
	for _, tc := range []struct {
		team             Team
		held             int
		heldBytes, bytes int64
		want             string // in the refusal; "" for room
	}{
		{Team{ID: "lab"}, 1000, 1 << 40, 1 << 30, ""},
		{Team{ID: "lab", MaxSnapshots: 2}, 1, 0, 0, ""},
		{Team{ID: "lab", MaxSnapshots: 2}, 2, 0, 0, "limit of 2 snapshots"},
		// Before the checkpoint (size unknown): room while any is left.
		{Team{ID: "lab", MaxSnapshotMB: 100}, 3, 100<<20 - 1, 0, ""},
		{Team{ID: "lab", MaxSnapshotMB: 100}, 3, 100 << 20, 0, "at its limit of 100 MiB"},
		// Recording it, its size known.
		{Team{ID: "lab", MaxSnapshotMB: 100}, 1, 60 << 20, 40 << 20, ""},
		{Team{ID: "lab", MaxSnapshotMB: 100}, 1, 60 << 20, 40<<20 + 1, "limit of 100 MiB of snapshots and templates of sandboxes (60 held, 41 more)"},
		{Team{ID: "lab", MaxSnapshots: 5, MaxSnapshotMB: 100}, 5, 0, 1, "limit of 5 snapshots"},
	} {
		err := tc.team.SnapshotRoom(tc.held, tc.heldBytes, tc.bytes)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v.SnapshotRoom(%d, %d, %d) = %v, want %q", tc.team, tc.held, tc.heldBytes, tc.bytes, err, tc.want)
		}
	}
}

// A replacement is one for one in count: only the bytes it adds are
// judged, against the bytes limit alone.
func TestSnapshotReplacementRoom(t *testing.T) {
	for _, tc := range []struct {
		team                           Team
		heldBytes, replacedBytes, size int64
		want                           string
	}{
		{Team{ID: "lab", MaxSnapshots: 1}, 10 << 20, 1 << 20, 5 << 20, ""},
		{Team{ID: "lab", MaxSnapshotMB: 10}, 10 << 20, 4 << 20, 4 << 20, ""},
		{Team{ID: "lab", MaxSnapshotMB: 10}, 20 << 20, 4 << 20, 3 << 20, ""},
		{Team{ID: "lab", MaxSnapshotMB: 10}, 8 << 20, 4 << 20, 6 << 20, ""},
		{Team{ID: "lab", MaxSnapshotMB: 10}, 8 << 20, 4 << 20, 6<<20 + 1, "limit of 10 MiB"},
	} {
		err := tc.team.SnapshotReplacementRoom(tc.heldBytes, tc.replacedBytes, tc.size)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v.SnapshotReplacementRoom(%d, %d, %d) = %v, want %q", tc.team, tc.heldBytes, tc.replacedBytes, tc.size, err, tc.want)
		}
	}
}
