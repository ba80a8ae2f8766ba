package cli

import (
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/wire"
)

func TestLogCursorFresh(t *testing.T) {
	at := func(ms, ns int) time.Time { return time.UnixMilli(int64(ms)).Add(time.Duration(ns)) }
	entry := func(ms, ns int, msg string) wire.SandboxLogEntry {
		return wire.SandboxLogEntry{Timestamp: at(ms, ns), Message: msg}
	}
	messages := func(es []wire.SandboxLogEntry) []string {
		out := []string{}
		for _, e := range es {
			out = append(out, e.Message)
		}
		return out
	}
	var c logCursor
	// First answer: two entries in one nanosecond, one later in the same ms.
	first := []wire.SandboxLogEntry{entry(10, 5, "a"), entry(10, 5, "b"), entry(10, 7, "c")}
	if got := messages(c.fresh(first)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("first: %q", got)
	}
	// The next poll starts at the cursor's millisecond: it repeats a, b
	// and c, and brings a new entry at c's very time and one after.
	second := append(first, entry(10, 7, "d"), entry(11, 0, "e"))
	if got := messages(c.fresh(second)); !slices.Equal(got, []string{"d", "e"}) {
		t.Fatalf("second: %q", got)
	}
	if got := messages(c.fresh([]wire.SandboxLogEntry{entry(11, 0, "e")})); len(got) != 0 {
		t.Fatalf("a repeat alone: %q", got)
	}
}

func TestFormatLogEntry(t *testing.T) {
	e := wire.SandboxLogEntry{Timestamp: time.Date(2026, 12, 4, 8, 0, 0, 0, time.Local), Level: "warn",
		Message: "file read cut short", Fields: map[string]string{"path": "/a b", "err": "eof", "n": ""}}
	want := `2026-12-04 08:00:00.000 WARN  file read cut short err=eof n="" path="/a b"`
	if got := formatLogEntry(e); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
