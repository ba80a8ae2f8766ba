package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.SecretStore = (*Store)(nil)

const secretColumns = `id, team_id, name, metadata_json, version, created_at, updated_at`

func (s *Store) CreateSecret(ctx context.Context, sec *store.Secret, sealed []byte) error {
	meta, err := store.MarshalMetadata(sec.Metadata)
	if err != nil {
		return fmt.Errorf("create secret %s: %w", sec.Name, err)
	}
	return s.inTx(ctx, "create secret "+sec.Name, func(tx *sql.Tx) error {
		// A team deleted meanwhile has had its secrets deleted: this one
		// must not outlive it, to be inherited by a team made later
		// under the same ID.
		if err := requireTeam(ctx, tx, sec.TeamID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO user_secrets (`+secretColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			sec.ID, sec.TeamID, sec.Name, meta, sec.Version, sec.CreatedAt.UnixNano(), sec.UpdatedAt.UnixNano()); err != nil {
			if isUniqueViolation(err) {
				return store.ErrConflict
			}
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO user_secret_versions (secret_id, version, sealed, created_at)
			VALUES (?, ?, ?, ?)`, sec.ID, sec.Version, sealed, sec.UpdatedAt.UnixNano())
		return err
	})
}

func (s *Store) GetSecret(ctx context.Context, team, idOrName string) (*store.Secret, error) {
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM user_secrets
		WHERE id = ? OR (team_id = ? AND name = ?) ORDER BY id = ? DESC LIMIT 1`, idOrName, team, idOrName, idOrName))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("secret %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get secret %s: %w", idOrName, classify(err))
	}
	return sec, nil
}

func (s *Store) ListSecrets(ctx context.Context, team string) ([]*store.Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+secretColumns+` FROM user_secrets WHERE ? = '' OR team_id = ?
		ORDER BY created_at, id`, team, team)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", classify(err))
	}
	defer rows.Close()
	var out []*store.Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		out = append(out, sec)
	}
	return out, rows.Err()
}

func (s *Store) UpdateSecret(ctx context.Context, id string, sealed []byte, metadata map[string]string, at time.Time) (*store.Secret, error) {
	var out *store.Secret
	err := s.inTx(ctx, "update secret "+id, func(tx *sql.Tx) error {
		sec, err := scanSecret(tx.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM user_secrets WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
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
		if _, err := tx.ExecContext(ctx, `UPDATE user_secrets SET version = ?, metadata_json = ?, updated_at = ? WHERE id = ?`,
			sec.Version, meta, sec.UpdatedAt.UnixNano(), id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO user_secret_versions (secret_id, version, sealed, created_at)
			VALUES (?, ?, ?, ?)`, id, sec.Version, sealed, sec.UpdatedAt.UnixNano()); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM user_secret_versions WHERE secret_id = ? AND version <= ?`,
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
	return s.inTx(ctx, "delete secret "+id, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM user_secrets WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if err := expectOneRow(res, "delete"); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM user_secret_versions WHERE secret_id = ?`, id)
		return err
	})
}

func (s *Store) SecretValue(ctx context.Context, team, name string) (*store.Secret, []byte, error) {
	row := s.db.QueryRowContext(ctx, `SELECT s.id, s.team_id, s.name, s.metadata_json, s.version, s.created_at,
		s.updated_at, v.sealed FROM user_secrets s JOIN user_secret_versions v ON v.secret_id = s.id AND v.version = s.version
		WHERE s.team_id = ? AND s.name = ?`, team, name)
	var sealed []byte
	sec, err := scanSecret(row, &sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("secret %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read secret %s: %w", name, classify(err))
	}
	return sec, sealed, nil
}

// scanSecret reads secretColumns, then into extra.
func scanSecret(r scanner, extra ...any) (*store.Secret, error) {
	var sec store.Secret
	var meta string
	var created, updated int64
	dest := append([]any{&sec.ID, &sec.TeamID, &sec.Name, &meta, &sec.Version, &created, &updated}, extra...)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	sec.CreatedAt, sec.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	var err error
	if sec.Metadata, err = store.UnmarshalMetadata([]byte(meta)); err != nil {
		return nil, err
	}
	return &sec, nil
}
