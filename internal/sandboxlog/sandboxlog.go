// Package sandboxlog reads a sandbox's own log: what its init, envd, wrote
// to its standard error (the runtime keeps it in a file per sandbox), as
// E2B's sandbox log entries. envd logs with slog's text handler, so each
// line is logfmt: time=... level=INFO msg="process started" pid=12 ...
package sandboxlog

import (
	"bufio"
	"bytes"
	"strings"
	"time"

	"github.com/go-logfmt/logfmt"
)

// MaxBytes is how much of a sandbox's log is read: its last MiB, some
// 7,000 of envd's lines. Older lines are not served.
const MaxBytes = 1 << 20

// Levels, lowest first, in E2B's words.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"
)

var levelRank = map[string]int{LevelDebug: 0, LevelInfo: 1, LevelWarn: 2, LevelError: 3}

// ValidLevel reports whether l is one of E2B's levels.
func ValidLevel(l string) bool {
	_, ok := levelRank[l]
	return ok
}

// Entry is one line of the log.
type Entry struct {
	Time    time.Time
	Level   string // one of the Level constants
	Message string
	Fields  map[string]string // the line's other keys; never nil
	Line    string            // the line as written
}

// Parse reads the entries of a log's tail. When truncated is set the data
// starts mid-file and its first, partial, line is dropped. A line that is
// not logfmt (the runtime's own output) is an info entry whose message is
// the whole line, timed as the entry before it.
func Parse(data []byte, truncated bool) []Entry {
	if truncated {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return nil
		}
		data = data[i+1:]
	}
	var out []Entry
	var last time.Time
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), MaxBytes)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, ok := parseLine(line)
		if !ok {
			e = Entry{Level: LevelInfo, Message: line, Fields: map[string]string{}, Line: line}
		}
		if e.Time.IsZero() {
			e.Time = last
		}
		last = e.Time
		out = append(out, e)
	}
	return out
}

// parseLine reads one of slog's text lines; ok is false for anything
// else (a line without time, level and msg keys, or not logfmt).
func parseLine(line string) (Entry, bool) {
	e := Entry{Fields: map[string]string{}, Line: line}
	d := logfmt.NewDecoder(strings.NewReader(line))
	if !d.ScanRecord() {
		return e, false
	}
	var seen int
	for d.ScanKeyval() {
		k, v := string(d.Key()), string(d.Value())
		switch k {
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return e, false
			}
			e.Time, seen = t.UTC(), seen+1
		case "level":
			e.Level, seen = levelOf(v), seen+1
		case "msg":
			e.Message, seen = v, seen+1
		default:
			e.Fields[k] = v
		}
	}
	if d.Err() != nil || seen != 3 {
		return e, false
	}
	return e, true
}

// levelOf maps slog's level names (DEBUG, INFO, WARN, ERROR, and offsets
// such as INFO+2) to E2B's.
func levelOf(v string) string {
	switch v = strings.ToUpper(v); {
	case strings.HasPrefix(v, "ERROR"):
		return LevelError
	case strings.HasPrefix(v, "WARN"):
		return LevelWarn
	case strings.HasPrefix(v, "DEBUG"):
		return LevelDebug
	}
	return LevelInfo
}

// Query selects entries, as E2B's log calls do.
type Query struct {
	// Cursor bounds the entries: at or after it going forward, at or
	// before it going backward. Zero is no bound.
	Cursor   time.Time
	Backward bool
	// Limit is the most entries returned: the oldest going forward, the
	// newest going backward. Zero is none.
	Limit    int
	MinLevel string // "" = every level
	Search   string // a case-sensitive substring of the message; "" = any
}

// Select returns the entries q asks for, oldest first in either direction.
func Select(entries []Entry, q Query) []Entry {
	min := levelRank[q.MinLevel]
	keep := func(e Entry) bool {
		if levelRank[e.Level] < min || !strings.Contains(e.Message, q.Search) {
			return false
		}
		if q.Cursor.IsZero() {
			return true
		}
		if q.Backward {
			return !e.Time.After(q.Cursor)
		}
		return !e.Time.Before(q.Cursor)
	}
	out := []Entry{}
	if q.Backward {
		for i := len(entries) - 1; i >= 0 && len(out) < q.Limit; i-- {
			if keep(entries[i]) {
				out = append(out, entries[i])
			}
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	for _, e := range entries {
		if len(out) == q.Limit {
			break
		}
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
