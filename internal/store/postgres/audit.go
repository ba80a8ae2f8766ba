package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/store"
)

// The cluster's database keeps the audit log too (audit.Store): every
// gateway writes the requests it serves.
var _ audit.Store = (*Store)(nil)

const auditColumns = `at, team_id, key_id, key_name, admin, action, object, status, remote, request_id`

func (s *Store) AppendAudit(ctx context.Context, events []audit.Event) error {
	rows := make([][]any, 0, len(events))
	for _, e := range events {
		rows = append(rows, []any{e.At.UnixNano(), e.TeamID, e.KeyID, e.KeyName, e.Admin, e.Action, e.Object,
			e.Status, e.Remote, e.RequestID})
	}
	_, err := s.pool.CopyFrom(ctx, pgx.Identifier{"audit_events"}, strings.Split(strings.ReplaceAll(auditColumns, " ", ""), ","),
		pgx.CopyFromRows(rows))
	if err != nil {
		return dbError("append audit events: %w", err)
	}
	return nil
}

func (s *Store) ListAudit(ctx context.Context, f audit.Filter) ([]audit.Event, error) {
	var where []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.TeamID != "" {
		add("team_id = $%d", f.TeamID)
	}
	if f.Action != "" {
		add("action = $%d", f.Action)
	}
	if f.Object != "" {
		add("object = $%d", f.Object)
	}
	if !f.Since.IsZero() {
		add("at >= $%d", f.Since.UnixNano())
	}
	if !f.Until.IsZero() {
		add("at < $%d", f.Until.UnixNano())
	}
	if f.Before > 0 {
		add("seq < $%d", f.Before)
	}
	q := `SELECT seq, ` + auditColumns + ` FROM audit_events`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit)
	q += fmt.Sprintf(` ORDER BY seq DESC LIMIT $%d`, len(args))
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, dbError("list audit events: %w", err)
	}
	defer rows.Close()
	out := []audit.Event{}
	for rows.Next() {
		var e audit.Event
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.TeamID, &e.KeyID, &e.KeyName, &e.Admin, &e.Action, &e.Object,
			&e.Status, &e.Remote, &e.RequestID); err != nil {
			return nil, dbError("list audit events: %w", err)
		}
		e.At = store.FromUnixNanos(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list audit events: %w", err)
	}
	return out, nil
}

func (s *Store) PurgeAudit(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM audit_events WHERE at < $1`, before.UnixNano())
	if err != nil {
		return 0, dbError("purge audit events: %w", err)
	}
	return tag.RowsAffected(), nil
}
