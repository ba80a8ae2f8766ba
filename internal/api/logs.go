package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/sandboxlog"
	"github.com/aenv-dev/aenv/internal/wire"
)

// maxSandboxLogLimit is E2B's largest (and default) page of sandbox logs.
const maxSandboxLogLimit = 1000

// maxLogSearch is E2B's longest search string.
const maxLogSearch = 256

// sandboxLogs is E2B's older GET /sandboxes/{id}/logs?start=&limit=: the
// oldest entries from start, as lines and as structured entries.
func (s *Server) sandboxLogs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	start, err := queryMillis(q, "start")
	if err != nil {
		return err
	}
	limit, err := logLimit(q)
	if err != nil {
		return err
	}
	entries, err := s.sandboxes.SandboxLog(r.Context(), r.PathValue("id"), sandboxlog.Query{Cursor: start, Limit: limit})
	if err != nil {
		return err
	}
	out := wire.SandboxLogs{Logs: []wire.SandboxLogLine{}, LogEntries: []wire.SandboxLogEntry{}}
	for _, e := range entries {
		out.Logs = append(out.Logs, wire.SandboxLogLine{Timestamp: e.Time, Line: e.Line})
		out.LogEntries = append(out.LogEntries, wireLogEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sandboxLogsV2 is E2B's GET /v2/sandboxes/{id}/logs?cursor=&limit=
// &direction=&level=&search=. Entries come oldest first either way.
func (s *Server) sandboxLogsV2(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	sel := sandboxlog.Query{MinLevel: q.Get("level"), Search: q.Get("search")}
	var err error
	if sel.Cursor, err = queryMillis(q, "cursor"); err != nil {
		return err
	}
	if sel.Limit, err = logLimit(q); err != nil {
		return err
	}
	switch d := q.Get("direction"); d {
	case "", string(wire.GetSandboxLogsV2ParamsDirectionForward):
	case string(wire.GetSandboxLogsV2ParamsDirectionBackward):
		sel.Backward = true
	default:
		return badRequest(fmt.Sprintf("direction must be forward or backward, not %q", d))
	}
	if sel.MinLevel != "" && !sandboxlog.ValidLevel(sel.MinLevel) {
		return badRequest(fmt.Sprintf("level must be debug, info, warn or error, not %q", sel.MinLevel))
	}
	if len(sel.Search) > maxLogSearch {
		return badRequest(fmt.Sprintf("search must be at most %d bytes", maxLogSearch))
	}
	entries, err := s.sandboxes.SandboxLog(r.Context(), r.PathValue("id"), sel)
	if err != nil {
		return err
	}
	out := wire.SandboxLogsV2{Logs: []wire.SandboxLogEntry{}}
	for _, e := range entries {
		out.Logs = append(out.Logs, wireLogEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func wireLogEntry(e sandboxlog.Entry) wire.SandboxLogEntry {
	return wire.SandboxLogEntry{Timestamp: e.Time, Level: wire.LogLevel(e.Level), Message: e.Message, Fields: e.Fields}
}

// logLimit reads limit: E2B's default and largest is 1000.
func logLimit(q url.Values) (int, error) {
	if q.Get("limit") == "" {
		return maxSandboxLogLimit, nil
	}
	n, err := queryInt(q, "limit")
	if err != nil {
		return 0, err
	}
	if n > maxSandboxLogLimit {
		return 0, badRequest(fmt.Sprintf("limit must be at most %d", maxSandboxLogLimit))
	}
	return n, nil
}

// queryMillis reads a Unix time in milliseconds, as E2B's log calls take
// it; absent is zero.
func queryMillis(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, badRequest(fmt.Sprintf("%s must be non-negative Unix milliseconds", name))
	}
	return time.UnixMilli(n).UTC(), nil
}
