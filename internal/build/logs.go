package build

import (
	"strings"
	"sync"
	"time"
)

// Build logs are kept in memory, bounded three ways: a line's length, a
// build's bytes and the bytes of all builds together (the oldest finished
// builds' logs make room for new ones). Status answers them a page at a
// time, so no answer is larger than a page.
const (
	maxLogLineBytes  = 16 << 10
	maxBuildLogBytes = 8 << 20
	maxTotalLogBytes = 256 << 20
	// entryOverhead is what an entry costs beyond its text.
	entryOverhead = 64
	// logPageEntries is E2B's default and largest status limit.
	logPageEntries = 100
	// maxLogPageBytes bounds a page's text; a page has at least one entry.
	maxLogPageBytes = 1 << 20
)

// logBudget is the bytes all builds' logs may hold together.
type logBudget struct {
	mu   sync.Mutex
	used int64
	max  int64
}

// take reserves n bytes unless that would pass the bound (force reserves
// them anyway: a build's few error lines are always kept).
func (l *logBudget) take(n int64, force bool) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !force && l.used+n > l.max {
		return false
	}
	l.used += n
	return true
}

func (l *logBudget) give(n int64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.used -= n
	l.mu.Unlock()
}

// buildLog is one build's log; its build's mu guards it. Entries before
// first were released; offsets stay those of the whole log.
type buildLog struct {
	entries []LogEntry
	first   int
	bytes   int64
	full    bool // lines are dropped from here on
	budget  *logBudget
	// reclaim frees the logs of older finished builds to make room for n
	// bytes; it is called without the build's lock. nil: nothing to free.
	reclaim func(n int64)
}

func entrySize(e LogEntry) int64 {
	return int64(len(e.Message)+len(e.Step)+len(e.Level)) + entryOverhead
}

// add appends e unless a bound says no; it reports false when only the
// total bound did, so the caller may reclaim and try again.
func (l *buildLog) add(e LogEntry, lastTry bool) bool {
	if l.full && e.Level != "error" {
		return true
	}
	size := entrySize(e)
	force := e.Level == "error"
	if !force && l.bytes+size > maxBuildLogBytes {
		l.drop("build log too long; further lines are dropped")
		return true
	}
	if !l.budget.take(size, force) {
		if !lastTry {
			return false
		}
		l.drop("the server's build logs are full; further lines of this build are dropped")
		return true
	}
	l.entries = append(l.entries, e)
	l.bytes += size
	return true
}

// drop ends the log with a warning (kept beyond the bounds: it is one).
func (l *buildLog) drop(why string) {
	l.full = true
	e := LogEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: why}
	l.budget.take(entrySize(e), true)
	l.bytes += entrySize(e)
	l.entries = append(l.entries, e)
}

// release gives the log's bytes back; what was read is gone.
func (l *buildLog) release() {
	l.budget.give(l.bytes)
	l.first += len(l.entries)
	l.entries, l.bytes = nil, 0
}

// page returns the entries from offset on: at most limit (E2B's default
// and maximum when limit is 0 or more) and about maxLogPageBytes.
func (l *buildLog) page(offset, limit int) []LogEntry {
	if limit <= 0 || limit > logPageEntries {
		limit = logPageEntries
	}
	i := max(offset-l.first, 0)
	var out []LogEntry
	var bytes int64
	for ; i < len(l.entries) && len(out) < limit; i++ {
		size := entrySize(l.entries[i])
		if len(out) > 0 && bytes+size > maxLogPageBytes {
			break
		}
		out = append(out, l.entries[i])
		bytes += size
	}
	return out
}

// log appends an entry to b's log, its message cut to maxLogLineBytes.
func (b *build) log(level, step, msg string) {
	if len(msg) > maxLogLineBytes {
		msg = strings.ToValidUTF8(msg[:maxLogLineBytes], "") + "… (line truncated)"
	}
	e := LogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step}
	b.mu.Lock()
	added := b.logs.add(e, b.logs.reclaim == nil)
	b.mu.Unlock()
	if added {
		return
	}
	b.logs.reclaim(entrySize(e))
	b.mu.Lock()
	b.logs.add(e, true)
	b.mu.Unlock()
}

// stepLogs returns the entries of one step, the last n of them.
func (b *build) stepLogs(step string, n int) []LogEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []LogEntry
	for i := len(b.logs.entries) - 1; i >= 0 && len(out) < n; i-- {
		if e := b.logs.entries[i]; e.Step == step {
			out = append(out, e)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// reclaimLogs releases the logs of the oldest finished builds until n
// bytes are free (or no finished build has any left).
func (s *Service) reclaimLogs(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var freed int64
	for _, id := range s.order {
		if freed >= n {
			return
		}
		b := s.builds[id]
		b.mu.Lock()
		if b.status == StatusReady || b.status == StatusError {
			freed += b.logs.bytes
			b.logs.release()
		}
		b.mu.Unlock()
	}
}
