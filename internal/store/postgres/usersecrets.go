package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.SecretStore = (*Store)(nil)

const secretColumns = `id, team_id, name, metadata, version, created_at, updated_at`

func (s *Store) CreateSecret(ctx context.Context, sec *store.Secret, sealed []byte) error {
	meta, err := store.MarshalMetadata(sec.Metadata)
	if err != nil {
		return dbError("create secret %s: %w", sec.Name, err)
	}
	return s.inTx(ctx, "create secret "+sec.Name, func(tx pgx.Tx) error {
		// A team deleted meanwhile has had its secrets deleted: this one
		// must not outlive it, to be inherited by a team made later
		// under the same ID.
		if err := requireTeam(ctx, tx, sec.TeamID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO user_secrets (`+secretColumns+`) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)`,
			sec.ID, sec.TeamID, sec.Name, meta, sec.Version, sec.CreatedAt.UnixNano(), sec.UpdatedAt.UnixNano()); err != nil {
			if isUniqueViolation(err) {
				return store.ErrConflict
			}
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO user_secret_versions (secret_id, version, sealed, created_at)
			VALUES ($1, $2, $3, $4)`, sec.ID, sec.Version, sealed, sec.UpdatedAt.UnixNano())
		return err
	})
}

func (s *Store) GetSecret(ctx context.Context, team, idOrName string) (*store.Secret, error) {
	sec, err := scanSecret(s.pool.QueryRow(ctx, `SELECT `+secretColumns+` FROM user_secrets
		WHERE id = $1 OR (team_id = $2 AND name = $1) ORDER BY id = $1 DESC LIMIT 1`, idOrName, team))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("secret %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get secret %s: %w", idOrName, err)
	}
	return sec, nil
}

func (s *Store) ListSecrets(ctx context.Context, team string) ([]*store.Secret, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+secretColumns+` FROM user_secrets WHERE $1 = '' OR team_id = $1
		ORDER BY created_at, id`, team)
	if err != nil {
		return nil, dbError("list secrets: %w", err)
	}
	defer rows.Close()
	var out []*store.Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, dbError("list secrets: %w", err)
		}
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list secrets: %w", err)
	}
	return out, nil
}

func (s *Store) UpdateSecret(ctx context.Context, id string, sealed []byte, metadata map[string]string, at time.Time) (*store.Secret, error) {
	var out *store.Secret
	err := s.inTx(ctx, "update secret "+id, func(tx pgx.Tx) error {
		// FOR UPDATE: two updates at once make two versions, one after
		// the other, never the same one twice.
		sec, err := scanSecret(tx.QueryRow(ctx, `SELECT `+secretColumns+` FROM user_secrets WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		sec.Version++
		sec.UpdatedAt = at.UTC()
		if metadata != nil {
			sec.Metadata = metadata
		}
		meta, err := store.MarshalMetadata(sec.Metadata)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE user_secrets SET version = $1, metadata = $2::jsonb, updated_at = $3 WHERE id = $4`,
			sec.Version, meta, sec.UpdatedAt.UnixNano(), id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO user_secret_versions (secret_id, version, sealed, created_at)
			VALUES ($1, $2, $3, $4)`, id, sec.Version, sealed, sec.UpdatedAt.UnixNano()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM user_secret_versions WHERE secret_id = $1 AND version <= $2`,
			id, sec.Version-store.SecretVersionsKept); err != nil {
			return err
		}
		out = sec
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Store) DeleteSecret(ctx context.Context, id string) error {
	// Its versions go with it (ON DELETE CASCADE).
	tag, err := s.pool.Exec(ctx, `DELETE FROM user_secrets WHERE id = $1`, id)
	if err != nil {
		return dbError("delete secret %s: %w", id, err)
	}
	return expectOneRow(tag, "delete secret "+id)
}

func (s *Store) SecretValue(ctx context.Context, team, name string) (*store.Secret, []byte, error) {
	row := s.pool.QueryRow(ctx, `SELECT s.id, s.team_id, s.name, s.metadata, s.version, s.created_at,
		s.updated_at, v.sealed FROM user_secrets s JOIN user_secret_versions v ON v.secret_id = s.id AND v.version = s.version
		WHERE s.team_id = $1 AND s.name = $2`, team, name)
	var sealed []byte
	sec, err := scanSecret(row, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, dbError("secret %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, nil, dbError("read secret %s: %w", name, err)
	}
	return sec, sealed, nil
}

// scanSecret reads secretColumns, then into extra.
func scanSecret(r pgx.Row, extra ...any) (*store.Secret, error) {
	var sec store.Secret
	var meta []byte
	var created, updated int64
	dest := append([]any{&sec.ID, &sec.TeamID, &sec.Name, &meta, &sec.Version, &created, &updated}, extra...)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	sec.CreatedAt, sec.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	var err error
	if sec.Metadata, err = store.UnmarshalMetadata(meta); err != nil {
		return nil, err
	}
	return &sec, nil
}
