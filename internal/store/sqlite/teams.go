package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// The store keeps teams and API keys too (auth.Store).
var _ auth.Store = (*Store)(nil)

func (s *Store) CreateTeam(ctx context.Context, t *auth.Team) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO teams (`+teamColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.CreatedAt.UnixNano(), t.MaxSandboxes, t.MaxMemoryMB, t.MaxVCPUs, t.MaxStarting, t.CreatesPerSecond,
		t.Bucket.Tokens, store.UnixNanos(t.Bucket.At), t.MaxSnapshots, t.MaxVolumes, t.MaxVolumeMB, t.MaxSnapshotMB)
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("create team %s: %w", t.ID, store.ErrConflict)
		}
		return fmt.Errorf("create team %s: %w", t.ID, classify(err))
	}
	return nil
}

func (s *Store) GetTeam(ctx context.Context, id string) (*auth.Team, error) {
	t, err := scanTeam(s.db.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("team %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get team %s: %w", id, classify(err))
	}
	return t, nil
}

func (s *Store) ListTeams(ctx context.Context) ([]*auth.Team, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+teamColumns+` FROM teams ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list teams: %w", classify(err))
	}
	defer rows.Close()
	var out []*auth.Team
	for rows.Next() {
		t, err := scanTeam(rows)
		if err != nil {
			return nil, fmt.Errorf("list teams: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

func (s *Store) TeamUse(ctx context.Context, id string) (auth.Usage, error) {
	used, err := teamUse(ctx, s.db, id)
	if err != nil {
		return auth.Usage{}, fmt.Errorf("use of team %s: %w", id, classify(err))
	}
	return used, nil
}

// teamUse sums what team id's sandboxes that are not dead hold, in q (the
// store, or a transaction).
func teamUse(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, id string) (auth.Usage, error) {
	var used auth.Usage
	err := q.QueryRowContext(ctx, store.TeamUseQuery+` WHERE team_id = ? AND state <> 'dead'`, id).Scan(
		&used.Sandboxes, &used.MemoryMB, &used.VCPUs, &used.Starting)
	return used, err
}

func (s *Store) SetTeamLimits(ctx context.Context, id string, p auth.LimitsPatch) error {
	// A limit not named keeps its value: COALESCE(NULL, column).
	res, err := s.db.ExecContext(ctx, `UPDATE teams SET max_sandboxes = COALESCE(?, max_sandboxes),
		max_memory_mb = COALESCE(?, max_memory_mb), max_vcpus = COALESCE(?, max_vcpus),
		max_starting = COALESCE(?, max_starting), creates_per_second = COALESCE(?, creates_per_second),
		max_snapshots = COALESCE(?, max_snapshots), max_volumes = COALESCE(?, max_volumes),
		max_volume_mb = COALESCE(?, max_volume_mb), max_snapshot_mb = COALESCE(?, max_snapshot_mb) WHERE id = ?`,
		p.MaxSandboxes, p.MaxMemoryMB, p.MaxVCPUs, p.MaxStarting, p.CreatesPerSecond, p.MaxSnapshots, p.MaxVolumes,
		p.MaxVolumeMB, p.MaxSnapshotMB, id)
	if err != nil {
		return fmt.Errorf("set limits of team %s: %w", id, classify(err))
	}
	return expectOneRow(res, "set limits of team "+id)
}

func (s *Store) DeleteTeam(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete team "+id, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM teams WHERE id = ?`, id).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("delete team %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var volumes, live int
		if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM volumes WHERE team_id = ?),
			(SELECT count(*) FROM sandboxes WHERE team_id = ? AND state IN (?, ?, ?))`, id, id,
			string(store.StateStarting), string(store.StateRunning), string(store.StatePaused)).Scan(&volumes, &live); err != nil {
			return err
		}
		if err := store.TeamInUse(id, volumes, live); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM api_keys WHERE team_id = ?`, id); err != nil {
			return err
		}
		// Its secrets go with it: a team made later under the same ID
		// must not inherit them.
		if _, err := tx.ExecContext(ctx, `DELETE FROM user_secret_versions
			WHERE secret_id IN (SELECT id FROM user_secrets WHERE team_id = ?)`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM user_secrets WHERE team_id = ?`, id); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM teams WHERE id = ?`, id)
		if err != nil {
			return err
		}
		return expectOneRow(res, "delete team "+id)
	})
}

// teamColumns are scanned by scanTeam.
const teamColumns = `id, created_at, max_sandboxes, max_memory_mb, max_vcpus, max_starting, creates_per_second,
	bucket_tokens, bucket_at, max_snapshots, max_volumes, max_volume_mb, max_snapshot_mb`

const keyColumns = `id, team_id, name, prefix, key_sha256, admin, created_at, expires_at, last_used_at, revoked_at`

func (s *Store) CreateKey(ctx context.Context, k *auth.Key) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.TeamID, k.Name, k.Prefix, k.Digest, boolInt(k.Admin), store.UnixNanos(k.CreatedAt), store.UnixNanos(k.ExpiresAt),
		store.UnixNanos(k.LastUsedAt), store.UnixNanos(k.RevokedAt))
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("create key %s: %w", k.ID, store.ErrConflict)
		}
		return fmt.Errorf("create key %s: %w", k.ID, classify(err))
	}
	return nil
}

func (s *Store) KeyByDigest(ctx context.Context, digest string) (*auth.Key, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE key_sha256 = ?`, digest))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("API key: %w", store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("look up API key: %w", classify(err))
	}
	return k, nil
}

func (s *Store) GetKey(ctx context.Context, id string) (*auth.Key, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("API key %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get API key %s: %w", id, classify(err))
	}
	return k, nil
}

func (s *Store) ListKeys(ctx context.Context, team string) ([]*auth.Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE ? = '' OR team_id = ?
		ORDER BY created_at, id`, team, team)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", classify(err))
	}
	defer rows.Close()
	var out []*auth.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN ? ELSE revoked_at END
		WHERE id = ?`, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", id, classify(err))
	}
	return expectOneRow(res, "revoke key "+id)
}

func (s *Store) PurgeKeys(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE (revoked_at <> 0 AND revoked_at < ?)
		OR (expires_at <> 0 AND expires_at < ?)`, before.UnixNano(), before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("purge old keys: %w", classify(err))
	}
	return res.RowsAffected()
}

func (s *Store) TouchKey(ctx context.Context, id string, at time.Time) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, at.UnixNano(), id); err != nil {
		return fmt.Errorf("record use of key %s: %w", id, classify(err))
	}
	return nil
}

func scanTeam(r scanner) (*auth.Team, error) {
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

func scanKey(r scanner) (*auth.Key, error) {
	var k auth.Key
	var admin int
	var created, expires, used, revoked int64
	if err := r.Scan(&k.ID, &k.TeamID, &k.Name, &k.Prefix, &k.Digest, &admin, &created, &expires, &used, &revoked); err != nil {
		return nil, err
	}
	k.Admin = admin != 0
	k.CreatedAt, k.ExpiresAt, k.LastUsedAt, k.RevokedAt = store.FromUnixNanos(created), store.FromUnixNanos(expires), store.FromUnixNanos(used), store.FromUnixNanos(revoked)
	return &k, nil
}
