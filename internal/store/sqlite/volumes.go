package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.VolumeStore = (*Store)(nil)

const volumeColumns = `id, name, team_id, token, created_at`

func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?)`,
		v.ID, v.Name, v.TeamID, v.Token, v.CreatedAt.UnixNano())
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("create volume %s: %w", v.Name, store.ErrConflict)
		}
		return fmt.Errorf("create volume %s: %w", v.Name, classify(err))
	}
	return nil
}

func (s *Store) GetVolume(ctx context.Context, team, idOrName string) (*store.Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes
		WHERE id = ? OR (team_id = ? AND name = ?) ORDER BY id = ? DESC LIMIT 1`, idOrName, team, idOrName, idOrName))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("volume %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get volume %s: %w", idOrName, classify(err))
	}
	return v, nil
}

func (s *Store) ListVolumes(ctx context.Context, team string) ([]*store.Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE ? = '' OR team_id = ?
		ORDER BY name, id`, team, team)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", classify(err))
	}
	defer rows.Close()
	var out []*store.Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (s *Store) DeleteVolume(ctx context.Context, id string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "delete volume "+id, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
			WHERE target_kind = ? AND target_id = ? ORDER BY holder_kind, holder_id`, string(store.RefVolume), id)
		if err != nil {
			return err
		}
		holders, err = scanRefs(rows)
		rows.Close()
		if err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id)
		if err != nil {
			return err
		}
		return expectOneRow(res, "delete")
	})
	return holders, err
}

func scanVolume(r scanner) (*store.Volume, error) {
	var v store.Volume
	var created int64
	if err := r.Scan(&v.ID, &v.Name, &v.TeamID, &v.Token, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = time.Unix(0, created).UTC()
	return &v, nil
}
