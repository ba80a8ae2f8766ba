// Package sqlite is the embedded Store: one SQLite file in the data dir,
// through the pure-Go modernc.org/sqlite driver (no cgo).
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/store"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a store.Store backed by SQLite.
type Store struct {
	db *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and applies the
// embedded migrations.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := makePrivate(path); err != nil {
		return nil, err
	}
	// synchronous=FULL: a commit is on disk before the API acknowledges.
	// The path is escaped: in a file: URI a '#' or '?' in a directory name
	// would cut it short and put the database somewhere else.
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)" +
		"&_pragma=busy_timeout(10000)&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection serialises writers, which SQLite does anyway, and
	// avoids SQLITE_BUSY between our own connections.
	db.SetMaxOpenConns(1)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// makePrivate creates the database file readable by its owner only, and
// takes group and other access from one (and its WAL files) made readable
// by an older version. The file holds API tokens and sandbox environments,
// so its mode must not depend on the data dir's. SQLite gives the -wal and
// -shm files it creates the database file's mode.
func makePrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	err = f.Chmod(0o600)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open %s: %w", path, err)
		}
	}
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sort.Strings(names)
	for _, name := range names {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE name = ?`, name).Scan(&n); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if n > 0 {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (name) VALUES (?)`, name); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate %s: %w", name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const sandboxColumns = `id, template_id, alias, state, vcpu, memory_mb, metadata_json, env_json,
	access_token, slot_index, auto_pause, started_at, end_at, ended_reason, updated_at, image_dir, timeout_secs,
	network_json, traffic_token, reboot_on_resume, auto_pause_drop_memory, auto_resume`

// sandboxSelect is what a read returns: the written columns and the
// upload state and digest, which only SetSandboxUpload writes.
const sandboxSelect = sandboxColumns + `, image_upload, image_digest, unresponsive, team_id, volume_mounts_json`

// sandboxInsert writes a new record: the written columns, the team and
// the volume mounts, which no update changes.
const sandboxInsert = `INSERT INTO sandboxes (` + sandboxColumns + `, team_id, volume_mounts_json)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	err = s.inTx(ctx, "create sandbox "+sb.ID, func(tx *sql.Tx) error {
		if err := checkTeamLimit(ctx, tx, sb); err != nil {
			return err
		}
		return insertSandbox(ctx, tx, sb, args)
	})
	return err
}

// insertSandbox writes sb's new record, whose written columns are args,
// with its references to the volumes it mounts.
func insertSandbox(ctx context.Context, tx *sql.Tx, sb *store.Sandbox, args []any) error {
	mounts, err := store.MarshalVolumeMounts(sb.VolumeMounts)
	if err != nil {
		return err
	}
	if err := holdVolumes(ctx, tx, store.RefSandbox, sb.ID, sb.VolumeMounts); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, sandboxInsert, append(args, sb.TeamID, mounts)...)
	if err != nil && isUniqueViolation(err) {
		return store.ErrConflict
	}
	return err
}

// holdVolumes takes the references of holder (kind, id) to the volumes
// of mounts, which must exist (else ErrNotFound: deleted since the create
// looked them up).
func holdVolumes(ctx context.Context, tx *sql.Tx, kind store.RefKind, id string, mounts []store.VolumeMount) error {
	for _, m := range mounts {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE id = ?`, m.VolumeID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("volume %s: %w", m.VolumeID, store.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO refs (holder_kind, holder_id, target_kind, target_id)
			VALUES (?, ?, ?, ?)`, string(kind), id, string(store.RefVolume), m.VolumeID); err != nil {
			return err
		}
	}
	return nil
}

// checkTeamLimit refuses sb when one more sandbox of its team, of its
// memory and vCPUs, would pass one of the team's limits. The store has one
// connection, so transactions, and with them counts and inserts, run one
// at a time.
//
// A sandbox of a team with no record is refused (ErrNotFound): its team was
// deleted while the create was on its way. Transactions here run one at a
// time, so a team's delete, which counts its sandboxes and volumes
// (DeleteTeam), and a create never pass each other.
func checkTeamLimit(ctx context.Context, tx *sql.Tx, sb *store.Sandbox) error {
	if sb.TeamID == "" {
		return nil
	}
	t, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = ?`, sb.TeamID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.TeamGone(sb.TeamID)
	}
	if err != nil || !t.Limited() {
		return err
	}
	used, err := teamUse(ctx, tx, sb.TeamID)
	if err != nil {
		return err
	}
	if err := t.Admit(used, sb.MemoryMB, sb.VCPU, time.Now()); err != nil {
		return fmt.Errorf("%v: %w", err, store.ErrLimit)
	}
	if t.CreatesPerSecond > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE teams SET bucket_tokens = ?, bucket_at = ? WHERE id = ?`,
			t.Bucket.Tokens, store.UnixNanos(t.Bucket.At), t.ID); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) CreateSandboxHolding(ctx context.Context, sb *store.Sandbox, rootfs string) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "create sandbox "+sb.ID, func(tx *sql.Tx) error {
		if err := checkTeamLimit(ctx, tx, sb); err != nil {
			return err
		}
		if err := holdRootfs(ctx, tx, store.RefSandbox, sb.ID, rootfs); err != nil {
			return err
		}
		return insertSandbox(ctx, tx, sb, args)
	})
}

func (s *Store) HoldRootfs(ctx context.Context, kind store.RefKind, id, rootfs string) error {
	return s.inTx(ctx, fmt.Sprintf("hold %s for %s %s", rootfs, kind, id), func(tx *sql.Tx) error {
		return holdRootfs(ctx, tx, kind, id, rootfs)
	})
}

// holdRootfs takes holder's reference to rootfs, which a template must
// hold (else ErrNotFound).
func holdRootfs(ctx context.Context, tx *sql.Tx, kind store.RefKind, id, rootfs string) error {
	// One index entry read, however many sandboxes hold the same rootfs.
	var held bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM refs WHERE target_kind = ? AND target_id = ?
		AND holder_kind = ?)`, string(store.RefRootfs), rootfs, string(store.RefTemplate)).Scan(&held); err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("root filesystem %s: %w", rootfs, store.ErrNotFound)
	}
	_, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO refs (holder_kind, holder_id, target_kind, target_id)
		VALUES (?, ?, ?, ?)`, string(kind), id, string(store.RefRootfs), rootfs)
	return err
}

func (s *Store) ReleaseRefs(ctx context.Context, kind store.RefKind, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND (? = '' OR holder_id = ?)`,
		string(kind), id, id)
	if err != nil {
		return fmt.Errorf("release references of %s %s: %w", kind, id, classify(err))
	}
	return nil
}

// releaseRefs drops the references holder holds, in tx.
func releaseRefs(ctx context.Context, tx *sql.Tx, kind store.RefKind, id string) error {
	_, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND holder_id = ?`, string(kind), id)
	return err
}

func (s *Store) ListRefs(ctx context.Context) ([]store.Ref, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
		ORDER BY target_kind, target_id, holder_kind, holder_id`)
	if err != nil {
		return nil, fmt.Errorf("list references: %w", err)
	}
	defer rows.Close()
	return scanRefs(rows)
}

func scanRefs(rows *sql.Rows) ([]store.Ref, error) {
	var out []store.Ref
	for rows.Next() {
		var r store.Ref
		var hk, tk string
		if err := rows.Scan(&hk, &r.HolderID, &tk, &r.TargetID); err != nil {
			return nil, fmt.Errorf("list references: %w", err)
		}
		r.HolderKind, r.TargetKind = store.RefKind(hk), store.RefKind(tk)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list references: %w", err)
	}
	return out, nil
}

func (s *Store) DeleteTemplateUnreferenced(ctx context.Context, id string) ([]store.Ref, error) {
	var users []store.Ref
	err := s.inTx(ctx, "delete template "+id, func(tx *sql.Tx) error {
		var rootfs, imageDir string
		err := tx.QueryRowContext(ctx, `SELECT rootfs_path, image_dir FROM templates WHERE id = ?`, id).
			Scan(&rootfs, &imageDir)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		if imageDir == "" {
			rows, err := tx.QueryContext(ctx, `SELECT holder_kind, holder_id, target_kind, target_id FROM refs
				WHERE target_kind = ? AND target_id = ? AND NOT (holder_kind = ? AND holder_id = ?)
				ORDER BY holder_kind, holder_id`, string(store.RefRootfs), rootfs, string(store.RefTemplate), id)
			if err != nil {
				return err
			}
			users, err = scanRefs(rows)
			rows.Close()
			if err != nil {
				return err
			}
			if len(users) > 0 {
				return store.ErrConflict
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id = ?`, id); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefTemplate, id)
	})
	return users, err
}

// requireTeam refuses, with ErrNotFound, a record of a team that has none
// ("" is no team).
func requireTeam(ctx context.Context, tx *sql.Tx, team string) error {
	if team == "" {
		return nil
	}
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM teams WHERE id = ?`, team).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return store.TeamGone(team)
	}
	return err
}

// inTx runs fn in a transaction, committed when fn returns nil; errors
// are wrapped with op.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", op, classify(err))
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return fmt.Errorf("%s: %w", op, classify(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: %w", op, classify(err))
	}
	return nil
}

func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "update sandbox "+sb.ID, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET template_id = ?, alias = ?, state = ?, vcpu = ?,
			memory_mb = ?, metadata_json = ?, env_json = ?, access_token = ?, slot_index = ?, auto_pause = ?,
			started_at = ?, end_at = ?, ended_reason = ?, updated_at = ?, image_dir = ?, timeout_secs = ?,
			network_json = ?, traffic_token = ?, reboot_on_resume = ?, auto_pause_drop_memory = ?, auto_resume = ?,
			image_upload = CASE WHEN ? = '' THEN '' ELSE image_upload END,
			image_digest = CASE WHEN ? = '' THEN '' ELSE image_digest END,
			unresponsive = CASE WHEN ? = 'running' THEN unresponsive ELSE '' END
			WHERE id = ?`,
			append(args[1:], sb.ImageDir, sb.ImageDir, string(sb.State), sb.ID)...)
		if err != nil {
			return err
		}
		if err := expectOneRow(res, "update"); err != nil {
			return err
		}
		// A dead sandbox needs nothing any more.
		if sb.State == store.StateDead {
			return releaseRefs(ctx, tx, store.RefSandbox, sb.ID)
		}
		return nil
	})
}

func (s *Store) SetSandboxUpload(ctx context.Context, id string, state store.UploadState, digest string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET image_upload = ?, image_digest = ?
		WHERE id = ? AND image_dir <> ''`, string(state), digest, id)
	if err != nil {
		return fmt.Errorf("record image upload of sandbox %s: %w", id, classify(err))
	}
	return expectOneRow(res, "record image upload of sandbox "+id)
}

func (s *Store) SetSandboxUnresponsive(ctx context.Context, id, reason string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET unresponsive = ? WHERE id = ?`, reason, id)
	if err != nil {
		return fmt.Errorf("record sandbox %s unresponsive: %w", id, classify(err))
	}
	return expectOneRow(res, "record sandbox "+id+" unresponsive")
}

func (s *Store) GetSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sandboxSelect+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	query, args := sandboxListQuery(f)
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*store.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// sandboxListQuery is the query of ListSandboxes for f, and its arguments.
func sandboxListQuery(f store.SandboxFilter) (string, []any) {
	query := `SELECT ` + sandboxSelect + ` FROM sandboxes`
	var where []string
	var args []any
	if len(f.States) > 0 {
		// A page of several states reads the list's index in order and
		// stops at its limit: the unary + keeps SQLite from choosing the
		// state index instead, which would read and sort every sandbox in
		// those states. One state reads its own part of the state index.
		col := "state"
		if (f.Limit > 0 && len(f.States) > 1) || f.IDs != nil {
			// A read by IDs goes by the primary key, whatever else filters.
			col = "+state"
		}
		where = append(where, col+" IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.Template != "" {
		where = append(where, "(template_id = ? OR alias = ?)")
		args = append(args, f.Template, f.Template)
	}
	if f.TeamID != "" {
		col := "team_id"
		if f.IDs != nil {
			col = "+team_id"
		}
		where = append(where, col+" = ?")
		args = append(args, f.TeamID)
	}
	if f.IDs != nil {
		where = append(where, "id IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.IDs)), ",")+")")
		if len(f.IDs) == 0 {
			where[len(where)-1] = "0" // none asked: none kept
		}
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	// Each pair through json_each: any key works, however it is spelled
	// (a JSON path would need the key quoted).
	for k, v := range f.Metadata {
		where = append(where, `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata_json)
			WHERE json_each.key = ? AND json_each.type = 'text' AND json_each.value = ?)`)
		args = append(args, k, v)
	}
	if !f.StartedFrom.IsZero() {
		where = append(where, "started_at >= ?")
		args = append(args, f.StartedFrom.UnixNano())
	}
	// The cursor's time bounds the index scan; the ID orders within it.
	if c := f.After; c != nil {
		if f.Oldest {
			where = append(where, "started_at >= ? AND (started_at > ? OR id < ?)")
		} else {
			where = append(where, "started_at <= ? AND (started_at < ? OR id > ?)")
		}
		args = append(args, c.At.UnixNano(), c.At.UnixNano(), c.ID)
	}
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Oldest {
		query += " ORDER BY started_at, id DESC"
	} else {
		query += " ORDER BY started_at DESC, id"
	}
	if f.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, f.Limit)
	}
	return query, args
}

func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete sandbox "+id, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if err := expectOneRow(res, "delete"); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefSandbox, id)
	})
}

const templateColumns = `id, name, rootfs_path, default_user, default_workdir, env_json, vcpu, memory_mb, created_at,
	kind, image_dir, source_sandbox, envd_token, env_vars_json, rootfs_id, upload_state, upload_error,
	image_digest, rootfs_digest, team_id, volume_mounts_json, image_bytes, image_new_bytes, image_parent`

func (s *Store) PutTemplate(ctx context.Context, t *store.Template) error {
	env, err := json.Marshal(nonNil(t.Env))
	if err != nil {
		return fmt.Errorf("put template %s: %w", t.ID, err)
	}
	envVars, err := json.Marshal(nonNil(t.EnvVars))
	if err != nil {
		return fmt.Errorf("put template %s: %w", t.ID, err)
	}
	kind := t.Kind
	if kind == "" {
		kind = store.KindRootfs
	}
	err = s.inTx(ctx, "put template "+t.ID, func(tx *sql.Tx) error {
		if err := checkSnapshotLimit(ctx, tx, t, kind, ""); err != nil {
			return err
		}
		return putTemplateHolding(ctx, tx, t, kind, string(env), string(envVars))
	})
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("put template %s (%s): %w", t.ID, t.Name, store.ErrConflict)
		}
		return err
	}
	return nil
}

// putTemplateHolding writes t's record and its reference to its root
// filesystem (its own, or for a checkpoint the one of the template it was
// taken from), replacing the reference it held, in tx.
func putTemplateHolding(ctx context.Context, tx *sql.Tx, t *store.Template, kind store.TemplateKind,
	env, envVars string) error {
	if err := putTemplate(ctx, tx, t, kind, env, envVars); err != nil {
		return err
	}
	if err := releaseRefs(ctx, tx, store.RefTemplate, t.ID); err != nil {
		return err
	}
	if err := holdVolumes(ctx, tx, store.RefTemplate, t.ID, t.VolumeMounts); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO refs (holder_kind, holder_id, target_kind, target_id)
		VALUES (?, ?, ?, ?)`, string(store.RefTemplate), t.ID, string(store.RefRootfs), t.RootfsPath)
	return err
}

// checkSnapshotLimit refuses, with ErrLimit, a new snapshot or template of
// a sandbox that would take its team past its MaxSnapshots or
// MaxSnapshotMB. An update of a record already kept is not a new one, nor
// is the record replacing the one named replaces ("" for none), which
// takes its place (if it is no larger). Transactions run one at a time
// (one connection), so two records never pass the count together.
func checkSnapshotLimit(ctx context.Context, tx *sql.Tx, t *store.Template, kind store.TemplateKind, replaces string) error {
	if t.TeamID == "" || !store.CountsAsSnapshot(kind) {
		return nil
	}
	return snapshotRoom(ctx, tx, t.TeamID, t.ID, replaces, t.ImageStats.Bytes)
}

// SnapshotRoom says, with ErrLimit, that team keeps as many snapshots (or
// bytes of them) as its limits allow: an early refusal, made before a
// checkpoint.
func (s *Store) SnapshotRoom(ctx context.Context, team string) error {
	if team == "" {
		return nil
	}
	err := snapshotRoom(ctx, s.db, team, "", "", 0)
	if err != nil && !errors.Is(err, store.ErrLimit) {
		err = fmt.Errorf("snapshots of team %s: %w", team, classify(err))
	}
	return err
}

// snapshotRoom judges team's MaxSnapshots and MaxSnapshotMB by what it
// keeps, read in q: room for the record id ("" for one not named yet) of
// bytes (0: not known yet) unless it exists, or replaces the team's record
// named replaces ("" for none), one for one and no larger. A team without
// the limits costs one read.
func snapshotRoom(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, team, id, replaces string, bytes int64) error {
	lim, err := scanTeam(q.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = ?`, team))
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !lim.SnapshotLimited()) {
		return nil
	}
	if err != nil {
		return err
	}
	if id != "" {
		var exists bool
		if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM templates WHERE id = ?)`, id).Scan(&exists); err != nil || exists {
			return err
		}
	}
	var held, replaced int
	var heldBytes, replacedBytes int64
	if err := q.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(name = ?), 0), coalesce(sum(image_bytes), 0),
		coalesce(sum(CASE WHEN name = ? THEN image_bytes ELSE 0 END), 0) FROM templates
		WHERE team_id = ? AND kind IN (?, ?)`, replaces, replaces, team, string(store.KindSnapshot),
		string(store.KindSandboxTemplate)).Scan(&held, &replaced, &heldBytes, &replacedBytes); err != nil {
		return err
	}
	if replaces != "" && replaced > 0 {
		err = lim.SnapshotReplacementRoom(heldBytes, replacedBytes, bytes)
	} else {
		err = lim.SnapshotRoom(held, heldBytes, bytes)
	}
	if err != nil {
		return fmt.Errorf("%v: %w", err, store.ErrLimit)
	}
	return nil
}

func putTemplate(ctx context.Context, tx *sql.Tx, t *store.Template, kind store.TemplateKind, env, envVars string) error {
	mounts, err := store.MarshalVolumeMounts(t.VolumeMounts)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO templates (`+templateColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, rootfs_path = excluded.rootfs_path,
		default_user = excluded.default_user, default_workdir = excluded.default_workdir,
		env_json = excluded.env_json, vcpu = excluded.vcpu, memory_mb = excluded.memory_mb,
		kind = excluded.kind, image_dir = excluded.image_dir, source_sandbox = excluded.source_sandbox,
		envd_token = excluded.envd_token, env_vars_json = excluded.env_vars_json,
		rootfs_id = excluded.rootfs_id, upload_state = excluded.upload_state, upload_error = excluded.upload_error,
		image_digest = excluded.image_digest, rootfs_digest = excluded.rootfs_digest, team_id = excluded.team_id,
		volume_mounts_json = excluded.volume_mounts_json, image_bytes = excluded.image_bytes,
		image_new_bytes = excluded.image_new_bytes, image_parent = excluded.image_parent`,
		t.ID, t.Name, t.RootfsPath, t.DefaultUser, t.DefaultWorkdir, env, t.VCPU, t.MemoryMB,
		t.CreatedAt.UnixNano(), string(kind), t.ImageDir, t.SourceSandbox, t.EnvdToken, envVars,
		t.RootfsID, string(t.Upload), t.UploadError, t.ImageDigest, t.RootfsDigest, t.TeamID, mounts,
		t.ImageStats.Bytes, t.ImageStats.NewBytes, t.ImageStats.Parent)
	return err
}

func (s *Store) ReplaceTemplate(ctx context.Context, t *store.Template) (*store.Template, error) {
	env, err := json.Marshal(nonNil(t.Env))
	if err != nil {
		return nil, fmt.Errorf("put template %s: %w", t.ID, err)
	}
	envVars, err := json.Marshal(nonNil(t.EnvVars))
	if err != nil {
		return nil, fmt.Errorf("put template %s: %w", t.ID, err)
	}
	kind := t.Kind
	if kind == "" {
		kind = store.KindRootfs
	}
	var old *store.Template
	err = s.inTx(ctx, "replace template "+t.Name, func(tx *sql.Tx) error {
		if err := checkSnapshotLimit(ctx, tx, t, kind, t.Name); err != nil {
			return err
		}
		prev, err := scanTemplate(tx.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE name = ? AND id <> ?`, t.Name, t.ID))
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case !store.Replaceable(prev, t.TeamID, ""):
			return store.ErrConflict
		default:
			if _, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id = ?`, prev.ID); err != nil {
				return err
			}
			if err := releaseRefs(ctx, tx, store.RefTemplate, prev.ID); err != nil {
				return err
			}
			old = prev
		}
		return putTemplateHolding(ctx, tx, t, kind, string(env), string(envVars))
	})
	if err != nil {
		if isUniqueViolation(err) && !errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("replace template %s: %w", t.Name, store.ErrConflict)
		}
		return nil, err
	}
	return old, nil
}

func (s *Store) SetTemplateUpload(ctx context.Context, id string, state store.UploadState, msg string,
	digests store.UploadDigests) error {
	// The image's size, recorded when it was taken, stays until an upload
	// finds it (a pending or failed one knows none).
	res, err := s.db.ExecContext(ctx, `UPDATE templates SET upload_state = ?, upload_error = ?, image_digest = ?,
		rootfs_digest = ?, image_bytes = CASE WHEN ? > 0 THEN ? ELSE image_bytes END, image_new_bytes = ?,
		image_parent = ? WHERE id = ?`,
		string(state), msg, digests.Image, digests.Rootfs, digests.Stats.Bytes, digests.Stats.Bytes, digests.Stats.NewBytes,
		digests.Stats.Parent, id)
	if err != nil {
		return fmt.Errorf("record upload of template %s: %w", id, classify(err))
	}
	return expectOneRow(res, "record upload of template "+id)
}

func (s *Store) GetTemplate(ctx context.Context, idOrName string) (*store.Template, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates WHERE id = ? OR name = ?
		ORDER BY id = ? DESC LIMIT 1`, idOrName, idOrName, idOrName)
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("template %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get template %s: %w", idOrName, err)
	}
	return t, nil
}

// TemplateNamed finds the template named name: a single server's names
// are one namespace.
func (s *Store) TemplateNamed(ctx context.Context, name string) (*store.Template, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates WHERE name = ?`, name)
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("template named %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("template named %s: %w", name, err)
	}
	return t, nil
}

func (s *Store) ListTemplates(ctx context.Context) ([]*store.Template, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+templateColumns+` FROM templates ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	defer rows.Close()
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return out, nil
}

func (s *Store) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error) {
	where := []string{"kind = ?"}
	args := []any{string(store.KindSnapshot)}
	if f.TeamID != "" {
		where = append(where, "team_id IN ('', ?)")
		args = append(args, f.TeamID)
	}
	if f.SourceSandbox != "" {
		where = append(where, "source_sandbox = ?")
		args = append(args, f.SourceSandbox)
	}
	if f.Name != "" {
		where = append(where, "name = ?")
		args = append(args, f.Name)
	}
	if c := f.After; c != nil {
		where = append(where, "created_at <= ? AND (created_at < ? OR id < ?)")
		args = append(args, c.At.UnixNano(), c.At.UnixNano(), c.ID)
	}
	query := `SELECT ` + templateColumns + ` FROM templates WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

func (s *Store) DeleteTemplate(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete template "+id, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if err := expectOneRow(res, "delete"); err != nil {
			return err
		}
		return releaseRefs(ctx, tx, store.RefTemplate, id)
	})
}

type scanner interface{ Scan(dest ...any) error }

func scanSandbox(r scanner) (*store.Sandbox, error) {
	var sb store.Sandbox
	var state, metadata, env, network, upload, mounts string
	var autoPause, reboot, dropMemory, autoResume int
	var started, end, updated int64
	err := r.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &state, &sb.VCPU, &sb.MemoryMB, &metadata, &env,
		&sb.AccessToken, &sb.SlotIndex, &autoPause, &started, &end, &sb.EndedReason, &updated, &sb.ImageDir,
		&sb.TimeoutSecs, &network, &sb.TrafficToken, &reboot, &dropMemory, &autoResume, &upload, &sb.ImageDigest,
		&sb.Unresponsive, &sb.TeamID, &mounts)
	if err != nil {
		return nil, err
	}
	if sb.VolumeMounts, err = store.UnmarshalVolumeMounts([]byte(mounts)); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	sb.State = store.SandboxState(state)
	sb.ImageUpload = store.UploadState(upload)
	sb.AutoPause = autoPause != 0
	sb.RebootOnResume = reboot != 0
	sb.AutoPauseDropMemory = dropMemory != 0
	sb.AutoResume = autoResume != 0
	sb.StartedAt = time.Unix(0, started).UTC()
	sb.EndAt = time.Unix(0, end).UTC()
	sb.UpdatedAt = time.Unix(0, updated).UTC()
	if err := json.Unmarshal([]byte(metadata), &sb.Metadata); err != nil {
		return nil, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.EnvVars); err != nil {
		return nil, fmt.Errorf("sandbox %s env: %w", sb.ID, err)
	}
	if network != "" {
		sb.Network = &store.NetworkPolicy{}
		if err := json.Unmarshal([]byte(network), sb.Network); err != nil {
			return nil, fmt.Errorf("sandbox %s network: %w", sb.ID, err)
		}
	}
	return &sb, nil
}

func sandboxArgs(sb *store.Sandbox) ([]any, error) {
	metadata, err := json.Marshal(nonNil(sb.Metadata))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	env, err := json.Marshal(nonNil(sb.EnvVars))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s env: %w", sb.ID, err)
	}
	autoPause, reboot := boolInt(sb.AutoPause), boolInt(sb.RebootOnResume)
	network := ""
	if sb.Network != nil {
		b, err := json.Marshal(sb.Network)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s network: %w", sb.ID, err)
		}
		network = string(b)
	}
	return []any{sb.ID, sb.TemplateID, sb.Alias, string(sb.State), sb.VCPU, sb.MemoryMB, string(metadata),
		string(env), sb.AccessToken, sb.SlotIndex, autoPause, sb.StartedAt.UnixNano(), sb.EndAt.UnixNano(),
		sb.EndedReason, sb.UpdatedAt.UnixNano(), sb.ImageDir, sb.TimeoutSecs, network, sb.TrafficToken, reboot,
		boolInt(sb.AutoPauseDropMemory), boolInt(sb.AutoResume)}, nil
}

// boolInt is SQLite's spelling of a boolean.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func scanTemplate(r scanner) (*store.Template, error) {
	var t store.Template
	var env, kind, envVars, upload, mounts string
	var created int64
	if err := r.Scan(&t.ID, &t.Name, &t.RootfsPath, &t.DefaultUser, &t.DefaultWorkdir, &env, &t.VCPU,
		&t.MemoryMB, &created, &kind, &t.ImageDir, &t.SourceSandbox, &t.EnvdToken, &envVars,
		&t.RootfsID, &upload, &t.UploadError, &t.ImageDigest, &t.RootfsDigest, &t.TeamID, &mounts,
		&t.ImageStats.Bytes, &t.ImageStats.NewBytes, &t.ImageStats.Parent); err != nil {
		return nil, err
	}
	var err error
	if t.VolumeMounts, err = store.UnmarshalVolumeMounts([]byte(mounts)); err != nil {
		return nil, fmt.Errorf("template %s: %w", t.ID, err)
	}
	t.CreatedAt = time.Unix(0, created).UTC()
	t.Kind = store.TemplateKind(kind)
	t.Upload = store.UploadState(upload)
	if err := json.Unmarshal([]byte(env), &t.Env); err != nil {
		return nil, fmt.Errorf("template %s env: %w", t.ID, err)
	}
	if err := json.Unmarshal([]byte(envVars), &t.EnvVars); err != nil {
		return nil, fmt.Errorf("template %s env vars: %w", t.ID, err)
	}
	return &t, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func expectOneRow(res sql.Result, op string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, store.ErrNotFound)
	}
	return nil
}
