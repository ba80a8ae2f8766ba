package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.VolumeStore = (*Store)(nil)

// volumeInsertColumns are those a new volume is given.
const volumeInsertColumns = `id, name, team_id, token, node_id, created_at, layers, size_bytes`

const volumeColumns = `id, name, team_id, token, node_id, created_at, layers, size_bytes, moving_to, moving_since`

// CreateVolume records v as this node's.
func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	layers, err := store.MarshalLayers(v.Layers)
	if err != nil {
		return dbError("create volume %s: %w", v.Name, err)
	}
	err = s.inTx(ctx, "create volume "+v.Name, func(tx pgx.Tx) error {
		if err := requireTeam(ctx, tx, v.TeamID); err != nil {
			return err
		}
		if err := volumeRoom(ctx, tx, v.TeamID, v.SizeBytes); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO volumes (`+volumeInsertColumns+`) VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, '')::jsonb, $8)`,
			v.ID, v.Name, v.TeamID, v.Token, s.node, v.CreatedAt.UnixNano(), layers, v.SizeBytes)
		if err != nil {
			if isUniqueViolation(err) {
				return store.ErrConflict
			}
			return err
		}
		for _, l := range v.Layers {
			if err := holdLayer(ctx, tx, s.node, v.ID, l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	v.NodeID = s.node
	return nil
}

// volumeRoom refuses, with ErrLimit, a volume of sizeBytes that would
// take team past its MaxVolumes or MaxVolumeMB, cluster-wide. The row of
// a team with these limits is locked until tx ends, so that two nodes'
// volumes never pass the count together (the team's advisory lock, which
// requireTeam took first, is shared). A team without them costs one read.
func volumeRoom(ctx context.Context, tx pgx.Tx, team string, sizeBytes int64) error {
	if team == "" {
		return nil
	}
	lim, err := scanTeam(tx.QueryRow(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = $1`, team))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && lim.MaxVolumes == 0 && lim.MaxVolumeMB == 0) {
		return nil
	}
	if err == nil {
		lim, err = scanTeam(tx.QueryRow(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = $1 FOR UPDATE`, team))
	}
	if err != nil {
		return err
	}
	var held int
	var heldBytes int64
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(size_bytes), 0)::bigint FROM volumes WHERE team_id = $1`,
		team).Scan(&held, &heldBytes); err != nil {
		return err
	}
	if err := lim.VolumeRoom(held, heldBytes, sizeBytes); errdefs.Kind(err) != nil {
		return err
	} else if err != nil {
		return fmt.Errorf("%v: %w", err, store.ErrLimit)
	}
	return nil
}

// holdLayer takes volume id's reference (as node's) to layer.
func holdLayer(ctx context.Context, tx pgx.Tx, node, id, layer string) error {
	_, err := tx.Exec(ctx, `INSERT INTO refs (node_id, holder_kind, holder_id, target_kind, target_id)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, node, string(store.RefVolume), id, string(store.RefLayer), layer)
	return err
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
	return s.queryVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE $1 = '' OR team_id = $1
		ORDER BY name, id`, team)
}

func (s *Store) ListNodeVolumes(ctx context.Context, node string) ([]*store.Volume, error) {
	return s.queryVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE node_id = $1 ORDER BY id`, node)
}

func (s *Store) queryVolumes(ctx context.Context, query string, args ...any) ([]*store.Volume, error) {
	rows, err := s.pool.Query(ctx, query, args...)
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

func (s *Store) CountVolumes(ctx context.Context, team string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT COUNT(*) FROM volumes WHERE team_id = $1`, team).Scan(&n); err != nil {
		return 0, dbError("count volumes: %w", err)
	}
	return n, nil
}

// volumeHolders locks volume id until tx ends and returns the references
// to it: the sandboxes that mount it.
func volumeHolders(ctx context.Context, tx pgx.Tx, id string) ([]store.Ref, error) {
	if err := lockVolume(ctx, tx, id); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
		WHERE target_kind = $1 AND target_id = $2 ORDER BY holder_kind, holder_id`, string(store.RefVolume), id)
	if err != nil {
		return nil, err
	}
	return collectRefs(rows)
}

func (s *Store) DeleteVolume(ctx context.Context, id string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "delete volume "+id, func(tx pgx.Tx) error {
		var err error
		if holders, err = volumeHolders(ctx, tx, id); err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict
		}
		var node, moving string
		err = tx.QueryRow(ctx, `SELECT node_id, moving_to FROM volumes WHERE id = $1`, id).Scan(&node, &moving)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		// A node deletes only what it keeps (a gateway, of no node, any
		// record), and nothing moving: its files are on their way.
		if moving != "" || (s.node != "" && node != s.node) {
			return fmt.Errorf("volume %s is kept by node %s (moving to %q): %w", id, node, moving, store.ErrVolumeMoving)
		}
		tag, err := tx.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if err := expectOneRow(tag, "delete"); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefVolume, id)
	})
	return holders, err
}

func (s *Store) FreezeVolume(ctx context.Context, id, layer, holder string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "freeze volume "+id, func(tx pgx.Tx) error {
		var err error
		if holders, err = volumeHolders(ctx, tx, id); err != nil {
			return err
		}
		if store.HeldByOtherSandbox(holders, holder) {
			return store.ErrConflict
		}
		var node string
		err = tx.QueryRow(ctx, `UPDATE volumes SET layers = to_jsonb(ARRAY[$2::text]) || COALESCE(layers, '[]'::jsonb)
			WHERE id = $1 RETURNING node_id`, id, layer).Scan(&node)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		return holdLayer(ctx, tx, node, id, layer)
	})
	return holders, err
}

func (s *Store) UnheldLayers(ctx context.Context, layers []string) ([]string, error) {
	if len(layers) == 0 {
		return nil, nil
	}
	// Both probes are indexed (refs_target, volumes_layers).
	rows, err := s.pool.Query(ctx, `SELECT l FROM unnest($1::text[]) AS l
		WHERE NOT EXISTS (SELECT 1 FROM refs WHERE target_kind = $2 AND target_id = l)
		AND NOT EXISTS (SELECT 1 FROM volumes WHERE layers ? l)`, layers, string(store.RefLayer))
	if err != nil {
		return nil, dbError("layers held: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, dbError("layers held: %w", err)
	}
	return out, nil
}

func scanVolume(r pgx.Row) (*store.Volume, error) {
	var v store.Volume
	var created int64
	var layers []byte
	if err := r.Scan(&v.ID, &v.Name, &v.TeamID, &v.Token, &v.NodeID, &created, &layers, &v.SizeBytes, &v.MovingTo, &v.MoveToken); err != nil {
		return nil, err
	}
	v.CreatedAt = time.Unix(0, created).UTC()
	var err error
	if v.Layers, err = store.UnmarshalLayers(layers); err != nil {
		return nil, err
	}
	return &v, nil
}

var _ store.VolumeMover = (*Store)(nil)

func (s *Store) BeginVolumeMove(ctx context.Context, id, from, to string) (int64, []store.Ref, error) {
	var holders []store.Ref
	var token int64
	err := s.inTx(ctx, "begin the move of volume "+id, func(tx pgx.Tx) error {
		var err error
		if holders, err = volumeHolders(ctx, tx, id); err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict
		}
		err = tx.QueryRow(ctx, `UPDATE volumes SET moving_to = $3, moving_since = `+dbNow+`
			WHERE id = $1 AND node_id = $2 AND (moving_to = '' OR moving_since < `+dbNow+` - $4)
			RETURNING moving_since`, id, from, to, store.StaleVolumeMove.Nanoseconds()).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM volumes WHERE id = $1)`, id).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				return store.ErrNotFound
			}
			return store.ErrConflict
		}
		return err
	})
	return token, holders, err
}

func (s *Store) FinishVolumeMove(ctx context.Context, id, from, to string, token, size int64) error {
	return s.inTx(ctx, "finish the move of volume "+id, func(tx pgx.Tx) error {
		holders, err := volumeHolders(ctx, tx, id)
		if err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict // a stale move ended by a mount
		}
		tag, err := tx.Exec(ctx, `UPDATE volumes SET node_id = $3, moving_to = '', moving_since = 0, layers = NULL, size_bytes = $5
			WHERE id = $1 AND node_id = $2 AND moving_to = $3 AND moving_since = $4 AND moving_since >= `+dbNow+` - $6`,
			id, from, to, token, size, store.StaleVolumeMove.Nanoseconds())
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return store.ErrConflict
		}
		// The layers it was made over stay on the node it left.
		_, err = tx.Exec(ctx, `DELETE FROM refs WHERE holder_kind = $1 AND holder_id = $2 AND target_kind = $3`,
			string(store.RefVolume), id, string(store.RefLayer))
		return err
	})
}

func (s *Store) AbortVolumeMove(ctx context.Context, id string, token int64) error {
	_, err := s.pool.Exec(ctx, `UPDATE volumes SET moving_to = '', moving_since = 0 WHERE id = $1 AND moving_since = $2 AND moving_to != ''`, id, token)
	if err != nil {
		return dbError("abort the move of volume %s: %w", id, err)
	}
	return nil
}
