package sandboxlog

import (
	"bytes"
	"context"
	"log/slog"
	"reflect"
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

func TestParseEnvdLines(t *testing.T) {
	data := envdLog(t, func(l *slog.Logger) {
		l.Info("envd serving", "addr", ":49983")
		l.Warn("file read cut short", "path", `/tmp/a "quoted" name`, "err", "broken pipe")
		l.Error("process start failed", "cmd", "/no/such", "err", "exec: not found")
		l.Debug("tick")
		l.Log(context.Background(), slog.LevelInfo+2, "odd level")
	})
	data = append(data, "runsc: a line of the runtime's own\n\n"...)
	got := Parse(data, false)
	if len(got) != 6 {
		t.Fatalf("entries: got %d, want 6: %+v", len(got), got)
	}
	want := []struct {
		level, msg string
		fields     map[string]string
	}{
		{LevelInfo, "envd serving", map[string]string{"addr": ":49983"}},
		{LevelWarn, "file read cut short", map[string]string{"path": `/tmp/a "quoted" name`, "err": "broken pipe"}},
		{LevelError, "process start failed", map[string]string{"cmd": "/no/such", "err": "exec: not found"}},
		{LevelDebug, "tick", map[string]string{}},
		{LevelInfo, "odd level", map[string]string{}},
		{LevelInfo, "runsc: a line of the runtime's own", map[string]string{}},
	}
	for i, w := range want {
		e := got[i]
		if e.Level != w.level || e.Message != w.msg || !reflect.DeepEqual(e.Fields, w.fields) {
			t.Errorf("entry %d: got %s %q %v, want %s %q %v", i, e.Level, e.Message, e.Fields, w.level, w.msg, w.fields)
		}
		if e.Time.IsZero() || time.Since(e.Time) > time.Minute {
			t.Errorf("entry %d: time %v", i, e.Time)
		}
	}
	if got[5].Time != got[4].Time {
		t.Errorf("a foreign line is not timed as the entry before it: %v, %v", got[5].Time, got[4].Time)
	}
}

func TestParseTruncated(t *testing.T) {
	data := []byte("d\" pid=3\ntime=2026-12-04T08:00:00Z level=INFO msg=whole\n")
	got := Parse(data, true)
	if len(got) != 1 || got[0].Message != "whole" {
		t.Fatalf("got %+v, want only the whole line", got)
	}
	if got := Parse([]byte("no newline at all"), true); len(got) != 0 {
		t.Fatalf("a partial line alone: got %+v", got)
	}
	if got := Parse([]byte("time=2026-12-04T08:00:00Z level=INFO msg=last"), false); len(got) != 1 {
		t.Fatalf("a last line without newline: got %+v", got)
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
	msgs := func(es []Entry) []string {
		out := []string{}
		for _, e := range es {
			out = append(out, e.Message)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		q    Query
		want []string
	}{
		{"all", Query{Limit: 10}, msgs(entries)},
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
			if got := msgs(Select(entries, tc.q)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
