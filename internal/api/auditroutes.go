package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
)

// routeAudit registers GET /audit, over cfg.Audit.
func (s *Server) routeAudit() {
	if s.cfg.Audit == nil {
		return
	}
	s.route("GET /audit", s.listAudit)
}

// listAudit is GET /audit: the audit log, newest first, for admin keys.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	if !principal(r).Admin {
		return errAdminOnly
	}
	q := r.URL.Query()
	f := audit.Filter{TeamID: q.Get("team"), Action: q.Get("action"), Object: q.Get("object")}
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.name); v != "" {
			at, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return badRequest(t.name + ": want an RFC 3339 time, such as 2026-12-01T10:00:00Z")
			}
			*t.to = at
		}
	}
	if v := q.Get("before"); v != "" {
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return badRequest("before: want an event's seq")
		}
		f.Before = i
	}
	if v := q.Get("limit"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil {
			return badRequest("limit: want a number from 1 to " + strconv.Itoa(audit.MaxLimit))
		}
		f.Limit = i
	}
	if err := audit.CheckFilter(&f); err != nil {
		return badRequest(err.Error())
	}
	events, err := s.cfg.Audit.List(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, events)
	return nil
}
