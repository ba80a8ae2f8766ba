package build

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
)

func newTestService(t *testing.T) *Service {
	t.Helper()
	uploads, err := NewUploads(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, nil, uploads, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// A build whose steps print 2 MiB each (40 MiB) keeps a bounded log, and its
// status answers it a page at a time (E2B's limit of 100 entries at most,
// about 1 MiB), never the whole log in one answer; paging by offset reads
// every kept entry once, ending with the note that lines were dropped.
func TestBuildLogBoundedAndPaged(t *testing.T) {
	s := newTestService(t)
	id, err := s.Request("app", "", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.get("app", id)
	// Each step prints 1 MiB in one line and 1 MiB in 1 KiB lines.
	big, short := strings.Repeat("x", 1<<20), strings.Repeat("z", 1<<10)
	for i := range 40 {
		b.log("info", strconv.Itoa(i+1), big)
		for range 1 << 10 {
			b.log("info", strconv.Itoa(i+1), short)
		}
	}
	const maxKept = 16 << 20
	var kept, entries, pages int
	var last LogEntry
	for offset := 0; ; pages++ {
		info, err := s.Status("app", id, offset, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Logs) == 0 {
			break
		}
		page := 0
		for _, e := range info.Logs {
			page += len(e.Message)
			last = e
		}
		if len(info.Logs) > 100 || (len(info.Logs) > 1 && page > 2<<20) {
			t.Fatalf("a page of %d entries, %d bytes", len(info.Logs), page)
		}
		kept += page
		entries += len(info.Logs)
		offset += len(info.Logs)
	}
	if kept > maxKept {
		t.Errorf("the build keeps %d bytes of log, want at most %d", kept, maxKept)
	}
	if last.Level != "warn" || !strings.Contains(last.Message, "dropped") {
		t.Errorf("the log ends with %+v, want a note that lines were dropped", last)
	}
	t.Logf("kept %d bytes in %d entries, read in %d pages", kept, entries, pages)
}

// All builds' logs together stay within the total bound: the oldest
// finished builds' logs make room, a running build's are kept, and a
// build's error lines are kept whatever the bounds.
func TestBuildLogsTotalBound(t *testing.T) {
	s := newTestService(t)
	s.logBudget.max = 4 * maxBuildLogBytes
	line := strings.Repeat("y", maxLogLineBytes)
	fill := func(b *build) {
		for range maxBuildLogBytes / maxLogLineBytes {
			b.log("info", "1", line)
		}
	}
	var builds []*build
	for i := range 6 {
		id, _ := s.Request("app"+strconv.Itoa(i), "", false, 0, 0)
		b, _ := s.get("app"+strconv.Itoa(i), id)
		builds = append(builds, b)
		if i == 0 {
			b.setStatus(StatusBuilding, nil) // still running: its log stays
		}
		fill(b)
		if i > 0 {
			b.setStatus(StatusReady, nil)
		}
		if used := s.logBudget.used; used > s.logBudget.max+maxBuildLogBytes/8 {
			t.Fatalf("after %d builds the logs hold %d bytes, bound %d", i+1, used, s.logBudget.max)
		}
	}
	if got := len(builds[0].logs.page(0, 1)); got != 1 {
		t.Error("the running build's log was released")
	}
	if got := len(builds[5].logs.page(0, 1)); got != 1 {
		t.Error("the newest build's log was not kept")
	}
	if got := len(builds[1].logs.page(0, 1)); got != 0 {
		t.Error("the oldest finished build's log was kept over the bound")
	}
	builds[0].log("error", "3", "step 3 failed")
	if got := builds[0].stepLogs("3", 5); len(got) != 1 || got[0].Message != "step 3 failed" {
		t.Errorf("the error line past the bounds: %+v", got)
	}
}
