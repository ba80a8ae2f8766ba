// Package sandboxlog reads a sandbox's own log: what its init, envd, wrote
// to its standard error (the runtime keeps it in a file per sandbox), as
// E2B's sandbox log entries. envd logs with slog's text handler, so each
// line reads time=... level=INFO msg="process started" pid=12 ...: keys in
// that order, values quoted by Go's strconv rules when they need it (which
// is why this reads them with strconv rather than a logfmt library, whose
// escapes are JSON's).
package sandboxlog

import (
	"bytes"
	"strconv"
	"strings"
	"time"
)

// MaxBytes is how much of a sandbox's log is read: its last MiB, some
// 7,000 of envd's lines. Older lines are not served.
const MaxBytes = 1 << 20

// MaxLines bounds the lines read of those bytes (the newest), so that a
// log of tiny lines (a process in the sandbox can write to envd's stderr)
// costs a request no more than envd's own lines do.
const MaxLines = 20_000

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
	rest    string            // the fields, unparsed, until selected
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

// Read returns the entries of a log's tail that q selects, oldest first
// in either direction. When truncated is set, data starts mid-file and its
// first line is partial: it is dropped, as is a last line not yet ended by
// a newline (a write in progress). A line that is not envd's (the
// runtime's own output) is an info entry whose message is the whole line,
// timed as the entry before it, or the first after it, or else written
// (when the log was last written).
func Read(data []byte, truncated bool, written time.Time, q Query) []Entry {
	entries := parse(data, truncated, written)
	out := selectEntries(entries, q)
	for i := range out {
		out[i].Fields = fields(out[i].rest)
	}
	return out
}

// parse reads the newest MaxLines whole lines of data, leaving their
// fields unparsed.
func parse(data []byte, truncated bool, written time.Time) []Entry {
	if truncated {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return nil
		}
		data = data[i+1:]
	}
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		return nil
	}
	data = data[:end+1]
	// The newest MaxLines lines: each pass finds the start of one more,
	// from the last.
	for n, i := 1, end; ; n++ {
		j := bytes.LastIndexByte(data[:i], '\n')
		if j < 0 {
			break
		}
		if n == MaxLines {
			data = data[j+1:]
			break
		}
		i = j
	}
	var out []Entry
	untimed := 0 // entries at the start with no time yet
	var last time.Time
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		line := strings.TrimRight(string(data[:i]), "\r")
		data = data[i+1:]
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, ok := parseLine(line)
		switch {
		case ok:
			if last.IsZero() {
				for i := range untimed {
					out[i].Time = e.Time
				}
			}
			last = e.Time
		case last.IsZero():
			untimed++
		default:
			e.Time = last
		}
		out = append(out, e)
	}
	if last.IsZero() {
		for i := range out {
			out[i].Time = written.UTC()
		}
	}
	return out
}

// parseLine reads one of envd's lines; any other is an info entry of the
// whole line, untimed.
func parseLine(line string) (Entry, bool) {
	foreign := Entry{Level: LevelInfo, Message: line, Line: line}
	rest, ok := strings.CutPrefix(line, "time=")
	if !ok {
		return foreign, false
	}
	stamp, rest, _ := strings.Cut(rest, " ")
	t, err := time.Parse(time.RFC3339Nano, stamp)
	if err != nil {
		return foreign, false
	}
	if rest, ok = strings.CutPrefix(rest, "level="); !ok {
		return foreign, false
	}
	level, rest, _ := strings.Cut(rest, " ")
	if rest, ok = strings.CutPrefix(rest, "msg="); !ok {
		return foreign, false
	}
	msg, rest, ok := value(rest)
	if !ok {
		return foreign, false
	}
	return Entry{Time: t.UTC(), Level: levelOf(level), Message: msg, Line: line, rest: rest}, true
}

// value reads a value at the start of s, quoted or bare, and what follows
// its separating space.
func value(s string) (v, rest string, ok bool) {
	if !strings.HasPrefix(s, `"`) {
		v, rest, _ = strings.Cut(s, " ")
		return v, rest, true
	}
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", false
	}
	if v, err = strconv.Unquote(q); err != nil {
		return "", "", false
	}
	return v, strings.TrimPrefix(s[len(q):], " "), true
}

// fields reads key=value pairs; what cannot be read is kept whole under
// the key "_" rather than lost.
func fields(rest string) map[string]string {
	out := map[string]string{}
	for rest != "" {
		var key string
		var ok bool
		if strings.HasPrefix(rest, `"`) {
			// A key that needed quoting.
			q, err := strconv.QuotedPrefix(rest)
			if err == nil && strings.HasPrefix(rest[len(q):], "=") {
				key, _ = strconv.Unquote(q)
				rest, ok = rest[len(q)+1:], true
			}
		} else {
			key, rest, ok = strings.Cut(rest, "=")
		}
		if !ok {
			out["_"] = key + rest
			return out
		}
		var v string
		if v, rest, ok = value(rest); !ok {
			out[key] = rest
			return out
		}
		out[key] = v
	}
	return out
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

// selectEntries returns the entries q asks for, oldest first in either
// direction. Going backward it reads from the newest and stops at the
// limit.
func selectEntries(entries []Entry, q Query) []Entry {
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
