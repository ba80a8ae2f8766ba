package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

var _ store.VolumeStore = (*Store)(nil)

const volumeColumns = `id, name, team_id, token, created_at, layers_json, size_bytes`

func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	layers, err := store.MarshalLayers(v.Layers)
	if err != nil {
		return fmt.Errorf("create volume %s: %w", v.Name, err)
	}
	err = s.inTx(ctx, "create volume "+v.Name, func(tx *sql.Tx) error {
		if err := requireTeam(ctx, tx, v.TeamID); err != nil {
			return err
		}
		if err := volumeRoom(ctx, tx, v.TeamID, v.SizeBytes); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			v.ID, v.Name, v.TeamID, v.Token, v.CreatedAt.UnixNano(), layers, v.SizeBytes); err != nil {
			if isUniqueViolation(err) {
				return store.ErrConflict
			}
			return err
		}
		for _, l := range v.Layers {
			if err := holdLayer(ctx, tx, v.ID, l); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// volumeRoom refuses, with ErrLimit, a volume of sizeBytes that would
// take team past its MaxVolumes or MaxVolumeMB. Transactions run one at a
// time (one connection), so two volumes never pass the count together. A
// team without these limits costs one read.
func volumeRoom(ctx context.Context, tx *sql.Tx, team string, sizeBytes int64) error {
	if team == "" {
		return nil
	}
	lim, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = ?`, team))
	if errors.Is(err, sql.ErrNoRows) || (err == nil && lim.MaxVolumes == 0 && lim.MaxVolumeMB == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	var held int
	var heldBytes int64
	if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(size_bytes), 0) FROM volumes WHERE team_id = ?`,
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

// holdLayer takes volume id's reference to layer.
func holdLayer(ctx context.Context, tx *sql.Tx, id, layer string) error {
	_, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO refs (holder_kind, holder_id, target_kind, target_id)
		VALUES (?, ?, ?, ?)`, string(store.RefVolume), id, string(store.RefLayer), layer)
	return err
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
	return s.queryVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE ? = '' OR team_id = ?
		ORDER BY name, id`, team, team)
}

// ListNodeVolumes lists every volume: a single server holds them all.
func (s *Store) ListNodeVolumes(ctx context.Context, _ string) ([]*store.Volume, error) {
	return s.queryVolumes(ctx, `SELECT `+volumeColumns+` FROM volumes ORDER BY id`)
}

func (s *Store) queryVolumes(ctx context.Context, query string, args ...any) ([]*store.Volume, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
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

func (s *Store) CountVolumes(ctx context.Context, team string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE team_id = ?`, team).Scan(&n); err != nil {
		return 0, fmt.Errorf("count volumes: %w", classify(err))
	}
	return n, nil
}

// volumeHolders are the references to volume id: the sandboxes that
// mount it.
func volumeHolders(ctx context.Context, tx *sql.Tx, id string) ([]store.Ref, error) {
	rows, err := tx.QueryContext(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
		WHERE target_kind = ? AND target_id = ? ORDER BY holder_kind, holder_id`, string(store.RefVolume), id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanRefs(rows)
}

func (s *Store) DeleteVolume(ctx context.Context, id string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "delete volume "+id, func(tx *sql.Tx) error {
		var err error
		if holders, err = volumeHolders(ctx, tx, id); err != nil {
			return err
		}
		if len(holders) > 0 {
			return store.ErrConflict
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if err := expectOneRow(res, "delete"); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefVolume, id)
	})
	return holders, err
}

func (s *Store) FreezeVolume(ctx context.Context, id, layer, holder string) ([]store.Ref, error) {
	var holders []store.Ref
	err := s.inTx(ctx, "freeze volume "+id, func(tx *sql.Tx) error {
		var err error
		if holders, err = volumeHolders(ctx, tx, id); err != nil {
			return err
		}
		if store.HeldByOtherSandbox(holders, holder) {
			return store.ErrConflict
		}
		v, err := scanVolume(tx.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		layers, err := store.MarshalLayers(append([]string{layer}, v.Layers...))
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE volumes SET layers_json = ? WHERE id = ?`, layers, id); err != nil {
			return err
		}
		return holdLayer(ctx, tx, id, layer)
	})
	return holders, err
}

// layerHeldQuery is 1 when a layer is held: by a reference, or named in a
// volume's record (read from the volumes that have layers only, by the
// partial index volumes_layered).
const layerHeldQuery = `SELECT EXISTS (SELECT 1 FROM refs WHERE target_kind = ? AND target_id = ?)
	OR EXISTS (SELECT 1 FROM volumes, json_each(volumes.layers_json) AS j
		WHERE volumes.layers_json != '' AND j.value = ?)`

func (s *Store) UnheldLayers(ctx context.Context, layers []string) ([]string, error) {
	var out []string
	for _, l := range layers {
		var n int
		if err := s.db.QueryRowContext(ctx, layerHeldQuery, string(store.RefLayer), l, l).Scan(&n); err != nil {
			return nil, fmt.Errorf("layers held: %w", classify(err))
		}
		if n == 0 {
			out = append(out, l)
		}
	}
	return out, nil
}

func scanVolume(r scanner) (*store.Volume, error) {
	var v store.Volume
	var created int64
	var layers string
	if err := r.Scan(&v.ID, &v.Name, &v.TeamID, &v.Token, &created, &layers, &v.SizeBytes); err != nil {
		return nil, err
	}
	v.CreatedAt = time.Unix(0, created).UTC()
	var err error
	if v.Layers, err = store.UnmarshalLayers([]byte(layers)); err != nil {
		return nil, err
	}
	return &v, nil
}
