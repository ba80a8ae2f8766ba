package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/usage"
)

// The cluster's database keeps the teams' usage by day too
// (usage.Ledger): every node adds what its sandboxes used.
var _ usage.Ledger = (*Store)(nil)

func (s *Store) AddTeamUsage(ctx context.Context, days []usage.TeamDay) error {
	return s.inTx(ctx, "add team usage", func(tx pgx.Tx) error {
		for _, d := range days {
			if _, err := tx.Exec(ctx, `INSERT INTO team_usage
				(team_id, day, sandbox_seconds, memory_mb_seconds, vcpu_seconds, cpu_seconds, stored_mb_seconds)
				VALUES ($1, $2, $3, $4, $5, $6, $7)
				ON CONFLICT (team_id, day) DO UPDATE SET
				sandbox_seconds = team_usage.sandbox_seconds + excluded.sandbox_seconds,
				memory_mb_seconds = team_usage.memory_mb_seconds + excluded.memory_mb_seconds,
				vcpu_seconds = team_usage.vcpu_seconds + excluded.vcpu_seconds,
				cpu_seconds = team_usage.cpu_seconds + excluded.cpu_seconds,
				stored_mb_seconds = team_usage.stored_mb_seconds + excluded.stored_mb_seconds`,
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
	}{{"team_id = $%d", f.TeamID}, {"day >= $%d", f.From}, {"day <= $%d", f.To}} {
		if c.v != "" {
			args = append(args, c.v)
			where = append(where, fmt.Sprintf(c.cond, len(args)))
		}
	}
	q := `SELECT team_id, day, sandbox_seconds, memory_mb_seconds, vcpu_seconds, cpu_seconds, stored_mb_seconds
		FROM team_usage`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY day, team_id`
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += fmt.Sprintf(` LIMIT $%d`, len(args))
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, dbError("list team usage: %w", err)
	}
	defer rows.Close()
	out := []usage.TeamDay{}
	for rows.Next() {
		var d usage.TeamDay
		if err := rows.Scan(&d.TeamID, &d.Day, &d.SandboxSeconds, &d.MemoryMBSeconds, &d.VCPUSeconds, &d.CPUSeconds,
			&d.StoredMBSeconds); err != nil {
			return nil, dbError("list team usage: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list team usage: %w", err)
	}
	return out, nil
}

// TeamImageBytes sums, by team, the image bytes of this node's snapshots
// and templates of sandboxes (every node's for a store of no node): what
// a team's storage use counts of them. An image another node uploaded
// and this one fetched is the other's to count.
func (s *Store) TeamImageBytes(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT team_id, sum(image_bytes)::bigint FROM templates
		WHERE kind IN ($1, $2) AND ($3 = '' OR node_id = $3) GROUP BY team_id`,
		string(store.KindSnapshot), string(store.KindSandboxTemplate), s.node)
	if err != nil {
		return nil, dbError("image bytes by team: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var team string
		var n int64
		if err := rows.Scan(&team, &n); err != nil {
			return nil, dbError("image bytes by team: %w", err)
		}
		out[team] = n
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("image bytes by team: %w", err)
	}
	return out, nil
}
