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
