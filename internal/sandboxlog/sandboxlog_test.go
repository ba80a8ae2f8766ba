package sandboxlog

import (
	"bytes"
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

// envdLog writes lines as envd does: slog's text handler.
func envdLog(t *testing.T, write func(*slog.Logger)) []byte {
	t.Helper()
	var buf bytes.Buffer
	write(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return buf.Bytes()
}

var all = Query{Limit: MaxLines}

func messages(es []Entry) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.Message)
	}
	return out
}

func TestReadEnvdLines(t *testing.T) {
	data := envdLog(t, func(l *slog.Logger) {
		l.Info("envd serving", "addr", ":49983")
		l.Warn("file read cut short", "path", `/tmp/a "quoted" name`, "err", "broken pipe")
		l.Error("process start failed", "cmd", "/no/such", "err", "bell \a and\ttab")
		l.Debug("tick")
		l.Log(context.Background(), slog.LevelInfo+2, "odd level", "a key", "v=1")
	})
	data = append(data, "runsc: a line of the runtime's own\n\n"...)
	got := Read(data, false, time.Time{}, all)
	want := []struct {
		level, msg string
		fields     map[string]string
	}{
		{LevelInfo, "envd serving", map[string]string{"addr": ":49983"}},
		{LevelWarn, "file read cut short", map[string]string{"path": `/tmp/a "quoted" name`, "err": "broken pipe"}},
		{LevelError, "process start failed", map[string]string{"cmd": "/no/such", "err": "bell \a and\ttab"}},
		{LevelDebug, "tick", map[string]string{}},
		{LevelInfo, "odd level", map[string]string{"a key": "v=1"}},
		{LevelInfo, "runsc: a line of the runtime's own", map[string]string{}},
	}
	if len(got) != len(want) {
		t.Fatalf("entries: got %d, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Level != w.level || e.Message != w.msg || !reflect.DeepEqual(e.Fields, w.fields) {
			t.Errorf("entry %d: got %s %q %#v, want %s %q %#v", i, e.Level, e.Message, e.Fields, w.level, w.msg, w.fields)
		}
		if e.Time.IsZero() || time.Since(e.Time) > time.Minute {
			t.Errorf("entry %d: time %v", i, e.Time)
		}
	}
	if got[5].Time != got[4].Time {
		t.Errorf("a foreign line is not timed as the entry before it: %v, %v", got[5].Time, got[4].Time)
	}
}

func TestReadEdges(t *testing.T) {
	written := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	first := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		data      string
		truncated bool
		want      []string
	}{
		{"a partial first line is dropped", "d\" pid=3\ntime=2026-12-04T08:00:00Z level=INFO msg=whole\n", true, []string{"whole"}},
		{"a whole first line is kept", "time=2026-12-04T08:00:00Z level=INFO msg=first\n", false, []string{"first"}},
		{"a partial line alone", "no newline at all", true, []string{}},
		{"a last line still being written is dropped", "time=2026-12-04T08:00:00Z level=INFO msg=done\ntime=2026-12-04T08:00:01Z level=INFO msg=\"half", false, []string{"done"}},
		{"a broken quote is a foreign line", "time=2026-12-04T08:00:00Z level=INFO msg=\"open\n", false, []string{"time=2026-12-04T08:00:00Z level=INFO msg=\"open"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := messages(Read([]byte(tc.data), tc.truncated, written, all)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	// Foreign lines before the first of envd's take its time; with none
	// of envd's, the time the log was written.
	got := Read([]byte("panic: early\ngoroutine 1\ntime=2026-12-04T08:00:00Z level=ERROR msg=late\n"), false, written, all)
	if len(got) != 3 || !got[0].Time.Equal(first) || !got[1].Time.Equal(first) {
		t.Errorf("foreign lines before envd's: %+v", got)
	}
	got = Read([]byte("panic: alone\n"), false, written, all)
	if len(got) != 1 || !got[0].Time.Equal(written) {
		t.Errorf("only foreign lines: %+v", got)
	}
}

// A log of tiny lines (a process in the sandbox writing to envd's stderr)
// is read to its newest MaxLines lines, and a page of it is cheap.
func TestReadBounded(t *testing.T) {
	data := []byte(strings.Repeat("a\n", MaxBytes/2-1) + "time=2026-12-04T08:00:00Z level=INFO msg=newest\n")
	if got := len(parse(data, false, time.Now())); got != MaxLines {
		t.Fatalf("parsed %d lines, want the newest %d", got, MaxLines)
	}
	got := Read(data, false, time.Now(), Query{Limit: 1, Backward: true})
	if len(got) != 1 || got[0].Message != "newest" {
		t.Fatalf("newest entry: %+v", got)
	}
	allocs := testing.AllocsPerRun(3, func() { Read(data, false, time.Now(), Query{Limit: 200, Backward: true}) })
	if allocs > 3*MaxLines {
		t.Errorf("a page of a log of tiny lines takes %.0f allocations", allocs)
	}
}

func TestSelect(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 12, 4, 8, 0, s, 0, time.UTC) }
	entries := []Entry{
		{Time: at(1), Level: LevelInfo, Message: "process started"},
		{Time: at(2), Level: LevelDebug, Message: "tick"},
		{Time: at(3), Level: LevelWarn, Message: "file read cut short"},
		{Time: at(4), Level: LevelError, Message: "process start failed"},
		{Time: at(5), Level: LevelInfo, Message: "process ended"},
	}
	for _, tc := range []struct {
		name string
		q    Query
		want []string
	}{
		{"all", Query{Limit: 10}, messages(entries)},
		{"limit forward keeps the oldest", Query{Limit: 2}, []string{"process started", "tick"}},
		{"limit backward keeps the newest, oldest first", Query{Limit: 2, Backward: true}, []string{"process start failed", "process ended"}},
		{"cursor forward is inclusive", Query{Limit: 10, Cursor: at(4)}, []string{"process start failed", "process ended"}},
		{"cursor backward is inclusive", Query{Limit: 10, Cursor: at(2), Backward: true}, []string{"process started", "tick"}},
		{"lowest level", Query{Limit: 10, MinLevel: LevelWarn}, []string{"file read cut short", "process start failed"}},
		{"search is case-sensitive", Query{Limit: 10, Search: "process"}, []string{"process started", "process start failed", "process ended"}},
		{"search misses other case", Query{Limit: 10, Search: "Process"}, []string{}},
		{"zero limit", Query{}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := messages(selectEntries(entries, tc.q)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// BenchmarkRead reads a page of a full log: envd's own lines, and tiny
// lines a process in the sandbox wrote.
func BenchmarkRead(b *testing.B) {
	var envd bytes.Buffer
	l := slog.New(slog.NewTextHandler(&envd, nil))
	for envd.Len() < MaxBytes {
		l.Info("process started", "pid", 1234, "cmd", "/bin/bash", "user", "user")
	}
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"envd", envd.Bytes()[:MaxBytes]},
		{"tiny", []byte(strings.Repeat("a\n", MaxBytes/2))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Read(bc.data, true, time.Now(), Query{Limit: 200, Backward: true})
			}
		})
	}
}
