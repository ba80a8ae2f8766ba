package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/store"
)

// The store keeps the audit log too (audit.Store).
var _ audit.Store = (*Store)(nil)

const auditColumns = `at, team_id, key_id, key_name, admin, action, object, status, remote, request_id`

func (s *Store) AppendAudit(ctx context.Context, events []audit.Event) error {
	return s.inTx(ctx, "append audit events", func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO audit_events (`+auditColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, e := range events {
			if _, err := stmt.ExecContext(ctx, e.At.UnixNano(), e.TeamID, e.KeyID, e.KeyName, e.Admin, e.Action,
				e.Object, e.Status, e.Remote, e.RequestID); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Store) ListAudit(ctx context.Context, f audit.Filter) ([]audit.Event, error) {
	var where []string
	var args []any
	add := func(cond string, arg any) {
		where = append(where, cond)
		args = append(args, arg)
	}
	if f.TeamID != "" {
		add("team_id = ?", f.TeamID)
	}
	if f.Action != "" {
		add("action = ?", f.Action)
	}
	if f.Object != "" {
		add("object = ?", f.Object)
	}
	if !f.Since.IsZero() {
		add("at >= ?", f.Since.UnixNano())
	}
	if !f.Until.IsZero() {
		add("at < ?", f.Until.UnixNano())
	}
	if f.Before > 0 {
		add("seq < ?", f.Before)
	}
	q := `SELECT seq, ` + auditColumns + ` FROM audit_events`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY seq DESC LIMIT ?`
	rows, err := s.db.QueryContext(ctx, q, append(args, f.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list audit events: %w", classify(err))
	}
	defer rows.Close()
	out := []audit.Event{}
	for rows.Next() {
		var e audit.Event
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.TeamID, &e.KeyID, &e.KeyName, &e.Admin, &e.Action, &e.Object,
			&e.Status, &e.Remote, &e.RequestID); err != nil {
			return nil, fmt.Errorf("list audit events: %w", err)
		}
		e.At = store.FromUnixNanos(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

func (s *Store) PurgeAudit(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM audit_events WHERE at < ?`, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("purge audit events: %w", classify(err))
	}
	return res.RowsAffected()
}
