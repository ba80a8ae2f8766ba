package api

import (
	"encoding/csv"
	"fmt"
	"net/http"
	"strconv"

	"github.com/aenv-dev/aenv/internal/usage"
)

// routeUsage registers GET /usage, over cfg.Ledger.
func (s *Server) routeUsage() {
	if s.cfg.Ledger == nil {
		return
	}
	s.route("GET /usage", s.teamUsage)
}

// teamUsage is GET /usage: each team's use by day, as JSON or (format=csv)
// CSV. A team's key sees its own team's; an admin's every team's, or
// team's.
func (s *Server) teamUsage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := usage.LedgerFilter{TeamID: q.Get("team"), From: q.Get("from"), To: q.Get("to")}
	if p := principal(r); !p.Admin {
		f.TeamID = p.TeamID
	}
	if err := usage.CheckDays(f.From, f.To); err != nil {
		return badRequest(err.Error())
	}
	format := q.Get("format")
	if format != "" && format != "json" && format != "csv" {
		return badRequest("format: json or csv")
	}
	// This node's use since its last flush is written first, so that a
	// caller reads it; a cluster's nodes write theirs every few seconds.
	if s.cfg.Usage != nil {
		if err := s.cfg.Usage.Flush(r.Context()); err != nil {
			s.logger.WarnContext(r.Context(), "team usage not written before a read", "err", err)
		}
	}
	// The answer is built whole: it is bounded, and a caller past the
	// bound is told to narrow it.
	f.Limit = usage.MaxRows + 1
	days, err := s.cfg.Ledger.ListTeamUsage(r.Context(), f)
	if err != nil {
		return err
	}
	if len(days) > usage.MaxRows {
		return badRequest(fmt.Sprintf("more than %d rows: narrow with team, from or to", usage.MaxRows))
	}
	if format != "csv" {
		writeJSON(w, http.StatusOK, days)
		return nil
	}
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="aenv-usage.csv"`)
	cw := csv.NewWriter(w)
	cw.Write([]string{"day", "team", "sandbox_seconds", "memory_mb_seconds", "vcpu_seconds", "cpu_seconds",
		"stored_mb_seconds"})
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, d := range days {
		cw.Write([]string{d.Day, d.TeamID, num(d.SandboxSeconds), num(d.MemoryMBSeconds), num(d.VCPUSeconds), num(d.CPUSeconds),
			num(d.StoredMBSeconds)})
	}
	cw.Flush()
	return cw.Error()
}
