package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) auditCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var filter client.AuditFilter
	var since string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log (admin)",
		Long: `Show who changed what, newest first: the time, the team and key that asked, the route, the object
(sandbox, template, snapshot, team or key ID), the answer's HTTP status and the caller's address.
Every create, kill, pause, resume, fork, snapshot, build, timeout, network, team and key change
is recorded; reads are not, nor commands and file transfers inside a sandbox. A cluster's gateways record what they serve. Reading the log
takes an admin key.`,
		Example: "  aenv audit --team lab-a --since 1h\n  aenv audit --object sbx123 -o json",
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			if since != "" {
				at, err := parseSince(since, a.now())
				if err != nil {
					return usageError{err}
				}
				filter.Since = at
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			events, err := c.ListAudit(cmd.Context(), filter)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(events, func(e client.AuditEvent) json.RawMessage { return e.Raw }))
			}
			t := newTable(a.stdout, "SEQ", "TIME", "TEAM", "KEY", "ACTION", "OBJECT", "STATUS", "FROM")
			for _, e := range events {
				key := firstNonEmpty(e.KeyName, e.KeyID, "operator")
				t.row(strconv.FormatInt(e.Seq, 10), e.At.Local().Format(time.DateTime), e.TeamID, key, e.Action,
					firstNonEmpty(e.Object, "-"), strconv.Itoa(e.Status), e.Remote)
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	fl := cmd.Flags()
	fl.StringVar(&filter.Team, "team", "", "only this team's changes")
	fl.StringVar(&filter.Action, "action", "", `only this route, such as "POST /sandboxes/{id}/pause"`)
	fl.StringVar(&filter.Object, "object", "", "only changes to this sandbox, template, snapshot, team or key ID")
	fl.StringVar(&since, "since", "", "only changes since this long ago (30m, 12h, 7d) or this RFC 3339 time")
	fl.Int64Var(&filter.Before, "before", 0, "page: only changes older than this SEQ")
	fl.IntVar(&filter.Limit, "limit", 100, "most changes shown (1 to 1000)")
	return cmd
}

// parseSince reads --since: a time ago ("30m", "7d") or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if at, err := time.Parse(time.RFC3339, s); err == nil {
		return at, nil
	}
	ago, err := parseLifetime(s)
	if err != nil || ago == 0 {
		return time.Time{}, fmt.Errorf("--since %q: give a time ago (30m, 12h, 7d) or an RFC 3339 time", s)
	}
	return now.Add(-ago), nil
}
