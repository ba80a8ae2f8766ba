package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/sandboxlog"
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

// A follow with a page of one entry (--tail 1) still sees what comes
// after it, steps past a millisecond holding more than a page, and ends
// when the sandbox dies.
func TestFollowLog(t *testing.T) {
	var mu sync.Mutex
	log := "time=2026-12-04T08:00:00Z level=INFO msg=first\n"
	state := "running"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/v2/sandboxes/sb1/logs":
			q := sandboxlog.Query{Limit: 1000}
			if c := r.URL.Query().Get("cursor"); c != "" {
				ms, _ := strconv.ParseInt(c, 10, 64)
				q.Cursor = time.UnixMilli(ms)
			}
			if l := r.URL.Query().Get("limit"); l != "" {
				q.Limit, _ = strconv.Atoi(l)
			}
			out := wire.SandboxLogsV2{Logs: []wire.SandboxLogEntry{}}
			for _, e := range sandboxlog.Read([]byte(log), false, time.Now(), q) {
				out.Logs = append(out.Logs, wire.SandboxLogEntry{Timestamp: e.Time, Level: wire.LogLevel(e.Level), Message: e.Message, Fields: e.Fields})
			}
			json.NewEncoder(w).Encode(out)
		case "/sandboxes/sb1":
			json.NewEncoder(w).Encode(map[string]any{"sandboxID": "sb1", "state": state})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := client.New(client.Config{URL: srv.URL, APIKey: "k"})
	var printed []string
	print := func(e wire.SandboxLogEntry) error {
		printed = append(printed, e.Message)
		switch len(printed) {
		case 1:
			// After the first: a second entry at the same time, then more
			// than a page in one millisecond, then a later one.
			mu.Lock()
			log += "time=2026-12-04T08:00:00Z level=INFO msg=second\n" +
				strings.Repeat("time=2026-12-04T08:00:01Z level=INFO msg=burst\n", 1001) +
				"time=2026-12-04T08:00:02Z level=INFO msg=last\n"
			mu.Unlock()
		}
		if e.Message == "last" {
			mu.Lock()
			state = "dead"
			mu.Unlock()
		}
		return nil
	}
	seen := logCursor{}
	for _, e := range seen.fresh([]wire.SandboxLogEntry{{Timestamp: time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC), Message: "first"}}) {
		print(e)
	}
	var stderr strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := followLog(ctx, c, "sb1", client.LogQuery{Limit: 1}, &seen, print, &stderr, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the follow did not end when the sandbox died")
	}
	bursts := 0
	for _, m := range printed {
		if m == "burst" {
			bursts++
		}
	}
	// Two pages take 1000 of the 1001 bursts; the third page repeats
	// them, and the follow steps past their millisecond, losing one.
	if printed[1] != "second" || printed[len(printed)-1] != "last" || bursts != 1000 {
		t.Errorf("printed %d entries: second %q, last %q, %d bursts, want 1000",
			len(printed), printed[1], printed[len(printed)-1], bursts)
	}
	if !strings.Contains(stderr.String(), "more than 1000 entries") {
		t.Errorf("no warning of the skipped millisecond: %q", stderr.String())
	}
}
