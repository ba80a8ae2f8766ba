package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/usage"
)

// The store keeps the teams' usage by day too (usage.Ledger).
var _ usage.Ledger = (*Store)(nil)

func (s *Store) AddTeamUsage(ctx context.Context, days []usage.TeamDay) error {
	return s.inTx(ctx, "add team usage", func(tx *sql.Tx) error {
		for _, d := range days {
			if _, err := tx.ExecContext(ctx, `INSERT INTO team_usage
				(team_id, day, sandbox_seconds, memory_mb_seconds, vcpu_seconds, cpu_seconds, stored_mb_seconds)
				VALUES (?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (team_id, day) DO UPDATE SET
				sandbox_seconds = sandbox_seconds + excluded.sandbox_seconds,
				memory_mb_seconds = memory_mb_seconds + excluded.memory_mb_seconds,
				vcpu_seconds = vcpu_seconds + excluded.vcpu_seconds,
				cpu_seconds = cpu_seconds + excluded.cpu_seconds,
				stored_mb_seconds = stored_mb_seconds + excluded.stored_mb_seconds`,
				d.TeamID, d.Day, d.SandboxSeconds, d.MemoryMBSeconds, d.VCPUSeconds, d.CPUSeconds,
				d.StoredMBSeconds); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Store) ListTeamUsage(ctx context.Context, f usage.LedgerFilter) ([]usage.TeamDay, error) {
	var where []string
	var args []any
	for _, c := range []struct {
		cond string
		v    string
	}{{"team_id = ?", f.TeamID}, {"day >= ?", f.From}, {"day <= ?", f.To}} {
		if c.v != "" {
			where = append(where, c.cond)
			args = append(args, c.v)
		}
	}
	q := `SELECT team_id, day, sandbox_seconds, memory_mb_seconds, vcpu_seconds, cpu_seconds, stored_mb_seconds
		FROM team_usage`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY day, team_id`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list team usage: %w", classify(err))
	}
	defer rows.Close()
	out := []usage.TeamDay{}
	for rows.Next() {
		var d usage.TeamDay
		if err := rows.Scan(&d.TeamID, &d.Day, &d.SandboxSeconds, &d.MemoryMBSeconds, &d.VCPUSeconds, &d.CPUSeconds,
			&d.StoredMBSeconds); err != nil {
			return nil, fmt.Errorf("list team usage: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// TeamImageBytes sums, by team, the image bytes of the snapshots and
// templates of sandboxes kept: what a team's storage use counts of them.
func (s *Store) TeamImageBytes(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT team_id, sum(image_bytes) FROM templates
		WHERE kind IN (?, ?) GROUP BY team_id`, string(store.KindSnapshot), string(store.KindSandboxTemplate))
	if err != nil {
		return nil, fmt.Errorf("image bytes by team: %w", classify(err))
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var team string
		var n int64
		if err := rows.Scan(&team, &n); err != nil {
			return nil, fmt.Errorf("image bytes by team: %w", err)
		}
		out[team] = n
	}
	return out, rows.Err()
}
