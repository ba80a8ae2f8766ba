package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.VolumeStore = (*Store)(nil)

const volumeColumns = `id, name, team_id, token, node_id, created_at`

// CreateVolume records v as this node's.
func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES ($1, $2, $3, $4, $5, $6)`,
		v.ID, v.Name, v.TeamID, v.Token, s.node, v.CreatedAt.UnixNano())
	if err != nil {
		if isUniqueViolation(err) {
			return dbError("create volume %s: %w", v.Name, store.ErrConflict)
		}
		return dbError("create volume %s: %w", v.Name, err)
	}
	v.NodeID = s.node
	return nil
}

func (s *Store) GetVolume(ctx context.Context, team, idOrName string) (*store.Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes
		WHERE id = $1 OR (team_id = $2 AND name = $1) ORDER BY id = $1 DESC LIMIT 1`, idOrName, team))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("volume %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get volume %s: %w", idOrName, err)
	}
	return v, nil
}

func (s *Store) ListVolumes(ctx context.Context, team string) ([]*store.Volume, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE $1 = '' OR team_id = $1
		ORDER BY name, id`, team)
	if err != nil {
		return nil, dbError("list volumes: %w", err)
	}
	defer rows.Close()
	var out []*store.Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, dbError("list volumes: %w", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list volumes: %w", err)
	}
	return out, nil
}

func (s *Store) DeleteVolume(ctx context.Context, id string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "delete volume "+id, func(tx pgx.Tx) error {
		if err := lockVolume(ctx, tx, id); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
			WHERE target_kind = $1 AND target_id = $2 ORDER BY holder_kind, holder_id`, string(store.RefVolume), id)
		if err != nil {
			return err
		}
		if holders, err = collectRefs(rows); err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict
		}
		tag, err := tx.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, id)
		if err != nil {
			return err
		}
		return expectOneRow(tag, "delete")
	})
	return holders, err
}

func scanVolume(r pgx.Row) (*store.Volume, error) {
	var v store.Volume
	var created int64
	if err := r.Scan(&v.ID, &v.Name, &v.TeamID, &v.Token, &v.NodeID, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = time.Unix(0, created).UTC()
	return &v, nil
}
