package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// The cluster's database keeps teams and API keys too (auth.Store): every
// gateway and node reads the same ones.
var _ auth.Store = (*Store)(nil)

func (s *Store) CreateTeam(ctx context.Context, t *auth.Team) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO teams (`+teamColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		t.ID, t.CreatedAt.UnixNano(), t.MaxSandboxes, t.MaxMemoryMB, t.MaxVCPUs, t.MaxStarting, t.CreatesPerSecond,
		t.Bucket.Tokens, store.UnixNanos(t.Bucket.At), t.MaxSnapshots, t.MaxVolumes, t.MaxVolumeMB, t.MaxSnapshotMB)
	if err != nil {
		if isUniqueViolation(err) {
			return dbError("create team %s: %w", t.ID, store.ErrConflict)
		}
		return dbError("create team %s: %w", t.ID, err)
	}
	return nil
}

func (s *Store) GetTeam(ctx context.Context, id string) (*auth.Team, error) {
	t, err := scanTeam(s.pool.QueryRow(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("team %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get team %s: %w", id, err)
	}
	return t, nil
}

func (s *Store) ListTeams(ctx context.Context) ([]*auth.Team, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+teamColumns+` FROM teams ORDER BY id`)
	if err != nil {
		return nil, dbError("list teams: %w", err)
	}
	defer rows.Close()
	var out []*auth.Team
	for rows.Next() {
		t, err := scanTeam(rows)
		if err != nil {
			return nil, dbError("list teams: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list teams: %w", err)
	}
	return out, nil
}

func (s *Store) TeamUse(ctx context.Context, id string) (auth.Usage, error) {
	used, err := teamUse(ctx, s.pool, id)
	if err != nil {
		return auth.Usage{}, dbError("use of team %s: %w", id, err)
	}
	return used, nil
}

// teamUse sums what team id's sandboxes that are not dead hold, in q (the
// pool, or a transaction).
func teamUse(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, id string) (auth.Usage, error) {
	var used auth.Usage
	err := q.QueryRow(ctx, store.TeamUseQuery+` WHERE team_id = $1 AND state <> 'dead'`, id).Scan(
		&used.Sandboxes, &used.MemoryMB, &used.VCPUs, &used.Starting)
	return used, err
}

func (s *Store) SetTeamLimits(ctx context.Context, id string, p auth.LimitsPatch) error {
	// A limit not named keeps its value: COALESCE(NULL, column).
	tag, err := s.pool.Exec(ctx, `UPDATE teams SET max_sandboxes = COALESCE($2, max_sandboxes),
		max_memory_mb = COALESCE($3, max_memory_mb), max_vcpus = COALESCE($4, max_vcpus),
		max_starting = COALESCE($5, max_starting), creates_per_second = COALESCE($6, creates_per_second),
		max_snapshots = COALESCE($7, max_snapshots), max_volumes = COALESCE($8, max_volumes),
		max_volume_mb = COALESCE($9, max_volume_mb), max_snapshot_mb = COALESCE($10, max_snapshot_mb) WHERE id = $1`,
		id, p.MaxSandboxes, p.MaxMemoryMB, p.MaxVCPUs, p.MaxStarting, p.CreatesPerSecond, p.MaxSnapshots, p.MaxVolumes,
		p.MaxVolumeMB, p.MaxSnapshotMB)
	if err != nil {
		return dbError("set limits of team %s: %w", id, err)
	}
	return expectOneRow(tag, "set limits of team "+id)
}

func (s *Store) DeleteTeam(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete team "+id, func(tx pgx.Tx) error {
		// The team's advisory lock, exclusive, which every create of the
		// team's holds shared until it commits: the counts below include
		// them. Then its row, in the order every transaction that takes
		// both takes them (teamLock).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, teamLock(id)); err != nil {
			return err
		}
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM teams WHERE id = $1 FOR UPDATE`, id).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("delete team %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var volumes, live int
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM volumes WHERE team_id = $1),
			(SELECT count(*) FROM sandboxes WHERE team_id = $1 AND state = ANY($2))`, id,
			[]string{string(store.StateStarting), string(store.StateRunning), string(store.StatePaused)}).Scan(&volumes, &live); err != nil {
			return err
		}
		if err := store.TeamInUse(id, volumes, live); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM api_keys WHERE team_id = $1`, id); err != nil {
			return err
		}
		// Its secrets go with it (their versions by ON DELETE CASCADE): a
		// team made later under the same ID must not inherit them.
		if _, err := tx.Exec(ctx, `DELETE FROM user_secrets WHERE team_id = $1`, id); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM teams WHERE id = $1`, id)
		if err != nil {
			return err
		}
		return expectOneRow(tag, "delete team "+id)
	})
}

// teamColumns are scanned by scanTeam.
const teamColumns = `id, created_at, max_sandboxes, max_memory_mb, max_vcpus, max_starting, creates_per_second,
	bucket_tokens, bucket_at, max_snapshots, max_volumes, max_volume_mb, max_snapshot_mb`

const keyColumns = `id, team_id, name, prefix, key_sha256, admin, created_at, expires_at, last_used_at, revoked_at`

func (s *Store) CreateKey(ctx context.Context, k *auth.Key) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		k.ID, k.TeamID, k.Name, k.Prefix, k.Digest, k.Admin, store.UnixNanos(k.CreatedAt), store.UnixNanos(k.ExpiresAt),
		store.UnixNanos(k.LastUsedAt), store.UnixNanos(k.RevokedAt))
	if err != nil {
		if isUniqueViolation(err) {
			return dbError("create key %s: %w", k.ID, store.ErrConflict)
		}
		return dbError("create key %s: %w", k.ID, err)
	}
	return nil
}

func (s *Store) KeyByDigest(ctx context.Context, digest string) (*auth.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE key_sha256 = $1`, digest))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("API key: %w", store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("look up API key: %w", err)
	}
	return k, nil
}

func (s *Store) GetKey(ctx context.Context, id string) (*auth.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("API key %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get API key %s: %w", id, err)
	}
	return k, nil
}

func (s *Store) ListKeys(ctx context.Context, team string) ([]*auth.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE $1 = '' OR team_id = $1
		ORDER BY created_at, id`, team)
	if err != nil {
		return nil, dbError("list keys: %w", err)
	}
	defer rows.Close()
	var out []*auth.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, dbError("list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list keys: %w", err)
	}
	return out, nil
}

func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN $2 ELSE revoked_at END
		WHERE id = $1`, id, at.UnixNano())
	if err != nil {
		return dbError("revoke key %s: %w", id, err)
	}
	return expectOneRow(tag, "revoke key "+id)
}

func (s *Store) PurgeKeys(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM api_keys WHERE (revoked_at <> 0 AND revoked_at < $1)
		OR (expires_at <> 0 AND expires_at < $1)`, before.UnixNano())
	if err != nil {
		return 0, dbError("purge old keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (s *Store) TouchKey(ctx context.Context, id string, at time.Time) error {
	if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = $2 WHERE id = $1`, id, at.UnixNano()); err != nil {
		return dbError("record use of key %s: %w", id, err)
	}
	return nil
}

func scanTeam(r pgx.Row) (*auth.Team, error) {
	var t auth.Team
	var created, bucketAt int64
	if err := r.Scan(&t.ID, &created, &t.MaxSandboxes, &t.MaxMemoryMB, &t.MaxVCPUs, &t.MaxStarting, &t.CreatesPerSecond,
		&t.Bucket.Tokens, &bucketAt, &t.MaxSnapshots, &t.MaxVolumes, &t.MaxVolumeMB, &t.MaxSnapshotMB); err != nil {
		return nil, err
	}
	t.CreatedAt = store.FromUnixNanos(created)
	t.Bucket.At = store.FromUnixNanos(bucketAt)
	return &t, nil
}

func scanKey(r pgx.Row) (*auth.Key, error) {
	var k auth.Key
	var created, expires, used, revoked int64
	if err := r.Scan(&k.ID, &k.TeamID, &k.Name, &k.Prefix, &k.Digest, &k.Admin, &created, &expires, &used, &revoked); err != nil {
		return nil, err
	}
	k.CreatedAt, k.ExpiresAt, k.LastUsedAt, k.RevokedAt = store.FromUnixNanos(created), store.FromUnixNanos(expires), store.FromUnixNanos(used), store.FromUnixNanos(revoked)
	return &k, nil
}
