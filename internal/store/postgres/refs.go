package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/store"
)

// References (store.Ref) are kept per node: root filesystems are paths on
// a node's own disk, so the same path on two nodes is two targets.

func (s *Store) CreateSandboxHolding(ctx context.Context, sb *store.Sandbox, rootfs string) error {
	args, err := sandboxArgs(s.box, sb)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "create sandbox "+sb.ID, func(tx pgx.Tx) error {
		if err := checkTeamLimit(ctx, tx, sb); err != nil {
			return err
		}
		if err := holdRootfs(ctx, tx, s.node, store.RefSandbox, sb.ID, rootfs); err != nil {
			return err
		}
		return s.insertSandbox(ctx, tx, sb, args)
	})
}

// lockVolume serialises, until tx ends, the transactions that take or
// check references to volume id, as lockRootfs does for root filesystems.
func lockVolume(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "volume\n"+id)
	return err
}

// holdVolumes takes the references of holder (kind, id), as node's, to
// the volumes of mounts, which must exist (else ErrNotFound: deleted since
// the create looked them up).
func holdVolumes(ctx context.Context, tx pgx.Tx, node string, kind store.RefKind, holder string, mounts []store.VolumeMount) error {
	// Locked in one order, whatever the mounts' order, so that two creates
	// mounting the same volumes cannot wait on each other.
	ids := make([]string, 0, len(mounts))
	for _, m := range mounts {
		ids = append(ids, m.VolumeID)
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		if err := lockVolume(ctx, tx, id); err != nil {
			return err
		}
		var keeper, moving string
		var stale bool
		err := tx.QueryRow(ctx, `SELECT node_id, moving_to, moving_to != '' AND moving_since < `+dbNow+` - $2
			FROM volumes WHERE id = $1`, id, store.StaleVolumeMove.Nanoseconds()).Scan(&keeper, &moving, &stale)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("volume %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if stale {
			// A move gone stale (its gateway died) ends here: its import
			// can no longer finish.
			if _, err := tx.Exec(ctx, `UPDATE volumes SET moving_to = '', moving_since = 0 WHERE id = $1`, id); err != nil {
				return err
			}
			moving = ""
		}
		// Its files are on its node only, and a moving one's are going.
		if moving != "" {
			return fmt.Errorf("volume %s: %w", id, store.ErrVolumeMoving)
		}
		if keeper != node {
			return fmt.Errorf("volume %s is kept by node %s, not %s: %w", id, keeper, node, store.ErrVolumeElsewhere)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO refs (node_id, holder_kind, holder_id, target_kind, target_id)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
			node, string(kind), holder, string(store.RefVolume), id); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) HoldRootfs(ctx context.Context, kind store.RefKind, id, rootfs string) error {
	return s.inTx(ctx, fmt.Sprintf("hold %s for %s %s", rootfs, kind, id), func(tx pgx.Tx) error {
		return holdRootfs(ctx, tx, s.node, kind, id, rootfs)
	})
}

// lockRootfs serialises, until tx ends, the transactions that take or
// check references to node's root filesystem rootfs: under READ COMMITTED
// a check would otherwise miss a reference being inserted beside it. Two
// keys whose hashes collide only serialise more than they need.
func lockRootfs(ctx context.Context, tx pgx.Tx, node, rootfs string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, node+"\n"+rootfs)
	return err
}

// holdRootfs takes holder's reference to rootfs, which a template of node
// must hold (else ErrNotFound).
func holdRootfs(ctx context.Context, tx pgx.Tx, node string, kind store.RefKind, id, rootfs string) error {
	if err := lockRootfs(ctx, tx, node, rootfs); err != nil {
		return err
	}
	var held bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM refs WHERE node_id = $1 AND holder_kind = $2
		AND target_kind = $3 AND target_id = $4)`, node, string(store.RefTemplate), string(store.RefRootfs), rootfs).
		Scan(&held); err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("root filesystem %s: %w", rootfs, store.ErrNotFound)
	}
	return insertRef(ctx, tx, node, kind, id, rootfs)
}

func insertRef(ctx context.Context, tx pgx.Tx, node string, kind store.RefKind, id, rootfs string) error {
	_, err := tx.Exec(ctx, `INSERT INTO refs (node_id, holder_kind, holder_id, target_kind, target_id)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, node, string(kind), id, string(store.RefRootfs), rootfs)
	return err
}

// releaseRefs drops the references holder holds, in tx. Holder IDs are
// unique across nodes, so a store of no node (a gateway's) drops them too.
func releaseRefs(ctx context.Context, tx pgx.Tx, kind store.RefKind, id string) error {
	_, err := tx.Exec(ctx, `DELETE FROM refs WHERE holder_kind = $1 AND holder_id = $2`, string(kind), id)
	return err
}

func (s *Store) ReleaseRefs(ctx context.Context, kind store.RefKind, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM refs WHERE holder_kind = $1 AND ($2 = '' OR holder_id = $2)
		AND ($3 = '' OR node_id = $3)`, string(kind), id, s.node)
	if err != nil {
		return dbError("release references of %s %s: %w", kind, id, err)
	}
	return nil
}

func (s *Store) ListRefs(ctx context.Context) ([]store.Ref, error) {
	rows, err := s.pool.Query(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
		WHERE ($1 = '' OR node_id = $1) ORDER BY target_kind, target_id, holder_kind, holder_id`, s.node)
	if err != nil {
		return nil, dbError("list references: %w", err)
	}
	refs, err := collectRefs(rows)
	if err != nil {
		return nil, dbError("list references: %w", err)
	}
	return refs, nil
}

func collectRefs(rows pgx.Rows) ([]store.Ref, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Ref, error) {
		var r store.Ref
		var hk, tk string
		err := row.Scan(&hk, &r.HolderID, &tk, &r.TargetID)
		r.HolderKind, r.TargetKind = store.RefKind(hk), store.RefKind(tk)
		return r, err
	})
}

func (s *Store) DeleteTemplateUnreferenced(ctx context.Context, id string) ([]store.Ref, error) {
	var users []store.Ref
	err := s.inTx(ctx, "delete template "+id, func(tx pgx.Tx) error {
		var rootfs, imageDir, node string
		err := tx.QueryRow(ctx, `SELECT rootfs_path, image_dir, node_id FROM templates
			WHERE id = $1 AND ($2 = '' OR node_id = $2)`, id, s.node).Scan(&rootfs, &imageDir, &node)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		if imageDir == "" {
			if err := lockRootfs(ctx, tx, node, rootfs); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
				WHERE node_id = $1 AND target_kind = $2 AND target_id = $3 AND NOT (holder_kind = $4 AND holder_id = $5)
				ORDER BY holder_kind, holder_id`, node, string(store.RefRootfs), rootfs, string(store.RefTemplate), id)
			if err != nil {
				return err
			}
			if users, err = collectRefs(rows); err != nil {
				return err
			}
			if len(users) > 0 {
				return store.ErrConflict
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM templates WHERE id = $1`, id); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefTemplate, id)
	})
	return users, err
}

// inTx runs fn in a transaction, committed when fn returns nil; errors
// are wrapped with op.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, s.pool, fn); err != nil {
		return dbError("%s: %w", op, err)
	}
	return nil
}
