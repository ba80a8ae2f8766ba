package api

import (
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

func TestParseSandboxListQuery(t *testing.T) {
	at := time.Date(2026, 11, 30, 20, 41, 35, 123e6, time.UTC)
	for _, tc := range []struct {
		name   string
		query  string
		ok     bool
		states []store.SandboxState
		after  time.Time
		asc    bool
		limit  int
	}{
		{"defaults", "", true, []store.SandboxState{"running", "paused"}, time.Time{}, false, 100},
		{"comma-joined states (the SDK)", "state=paused%2Crunning", true, []store.SandboxState{"paused", "running"}, time.Time{}, false, 100},
		{"repeated states", "state=running&state=paused", true, []store.SandboxState{"running", "paused"}, time.Time{}, false, 100},
		{"unknown state", "state=sleeping", false, nil, time.Time{}, false, 0},
		{"startedAfter as toISOString", "startedAfter=2026-11-30T20%3A41%3A35.123Z", true, []store.SandboxState{"running", "paused"}, at, false, 100},
		{"startedAfter in Unix seconds", "startedAfter=1700000000", true, []store.SandboxState{"running", "paused"}, time.Unix(1700000000, 0), false, 100},
		{"bad startedAfter", "startedAfter=yesterday", false, nil, time.Time{}, false, 0},
		{"order and limit", "order=asc&limit=7", true, []store.SandboxState{"running", "paused"}, time.Time{}, true, 7},
		{"bad order", "order=random", false, nil, time.Time{}, false, 0},
		{"limit too big", "limit=101", false, nil, time.Time{}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			lq, err := parseSandboxListQuery(q)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			if !slices.Equal(lq.filter.States, tc.states) || !lq.startedAfter.Equal(tc.after) ||
				lq.ascending != tc.asc || lq.limit != tc.limit {
				t.Errorf("got %+v", lq)
			}
		})
	}
	q, _ := url.ParseQuery("metadata=a%252520b%3Dc&template=base&nextToken=tok")
	lq, err := parseSandboxListQuery(q)
	if err != nil || lq.filter.Metadata["a b"] != "c" || lq.filter.Template != "base" || lq.nextToken != "tok" {
		t.Errorf("metadata, template and nextToken: %+v, %v", lq, err)
	}
}

func TestMaskRequestHost(t *testing.T) {
	for _, tc := range []struct {
		mask string
		ok   bool
		want string // for port 3000
	}{
		{"localhost:${PORT}", true, "localhost:3000"},
		{"${PORT}-app.example.com", true, "3000-app.example.com"},
		{"example.com", true, "example.com"},
		{"example.com:8080", true, "example.com:8080"},
		{"[::1]:${PORT}", true, "[::1]:3000"},
		{"", false, ""},
		{"has space", false, ""},
		{"a/b", false, ""},
		{"user@host", false, ""},
		{"host:notaport", false, ""},
		{"host:70000", false, ""},
		{":80", false, ""},
		{"exämple.com", false, ""},
	} {
		err := checkMaskRequestHost(tc.mask)
		if (err == nil) != tc.ok {
			t.Errorf("checkMaskRequestHost(%q) = %v, want ok=%v", tc.mask, err, tc.ok)
		}
		if tc.ok {
			if got := expandMaskRequestHost(tc.mask, 3000); got != tc.want {
				t.Errorf("expand %q: got %q, want %q", tc.mask, got, tc.want)
			}
		}
	}
}

func TestNetworkPolicyKeepsMask(t *testing.T) {
	req := wire.NewSandbox{Network: &wire.NetworkConfig{MaskRequestHost: "localhost:${PORT}"}}
	got := policyOf(&req)
	if got == nil || !got.AllowInternet || got.MaskRequestHost != "localhost:${PORT}" {
		t.Fatalf("a mask alone must give a default egress policy carrying it: %+v", got)
	}
}

func TestCutTag(t *testing.T) {
	for _, tc := range []struct {
		alias, name string
		tagged      bool
	}{
		{"base", "base", false},
		{"my-env:v2", "my-env", true},
		{"a:b:c", "a:b", true},
		{":v1", ":v1", false},
		{"name:", "name:", false},
	} {
		name, _, tagged := cutTag(tc.alias)
		if name != tc.name || tagged != tc.tagged {
			t.Errorf("cutTag(%q) = %q %v, want %q %v", tc.alias, name, tagged, tc.name, tc.tagged)
		}
	}
}

func TestMetricsRange(t *testing.T) {
	for _, tc := range []struct {
		query      string
		ok         bool
		start, end time.Time
	}{
		{"", true, time.Time{}, time.Time{}},
		{"start=1700000000", true, time.Unix(1700000000, 0), time.Time{}},
		// end covers its whole second: the SDK rounds it.
		{"start=1700000000&end=1700000010", true, time.Unix(1700000000, 0), time.Unix(1700000010, 999999999)},
		{"start=1700000010&end=1700000010", true, time.Unix(1700000010, 0), time.Unix(1700000010, 999999999)},
		{"start=1700000010&end=1700000000", false, time.Time{}, time.Time{}},
		{"start=soon", false, time.Time{}, time.Time{}},
	} {
		q, _ := url.ParseQuery(tc.query)
		start, end, err := metricsRange(q)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok=%v", tc.query, err, tc.ok)
			continue
		}
		if tc.ok && (!start.Equal(tc.start) || !end.Equal(tc.end)) {
			t.Errorf("%q: got [%v, %v], want [%v, %v]", tc.query, start, end, tc.start, tc.end)
		}
	}
}
