// Package postgres is the shared Store: one PostgreSQL database that the
// nodes of a cluster all use, through a pgx connection pool.
//
// It keeps exactly the semantics of the SQLite store (the shared suite in
// storetest holds both to them). The pool replaces connections that a
// server restart or a network failure broke: an operation caught by the
// break returns a wrapped error, and later ones get fresh connections.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// Store is a store.Store backed by PostgreSQL.
//
// A store opened for a node (OpenNode) sees and writes only that node's
// sandbox and template records; one opened with Open sees every node's
// (what a gateway reads) and writes records of no node.
type Store struct {
	pool *pgxpool.Pool
	node string     // "" : not scoped to a node
	box  *secretBox // seals the secrets (see secrets.go)
}

var _ store.Store = (*Store)(nil)

// Open connects to the database named by connString (a libpq keyword/value
// string or a postgres:// URL; pool settings such as pool_max_conns go in
// it too) and applies the embedded migrations. The role must be allowed to
// create tables in the database's default schema.
func Open(ctx context.Context, connString string) (*Store, error) {
	return OpenNode(ctx, connString, "")
}

// OpenNode is Open scoped to the records of one node of a cluster.
func OpenNode(ctx context.Context, connString, nodeID string) (*Store, error) {
	return OpenWith(ctx, connString, nodeID, Options{})
}

// OpenWith is OpenNode (Open for nodeID "") with options. It fails with
// ErrSecretsKey when the database's secrets were encrypted with another
// key than opts.SecretsKey, or with a key and opts has none.
func OpenWith(ctx context.Context, connString, nodeID string, opts Options) (*Store, error) {
	box, err := newSecretBox(opts.SecretsKey)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, dbError("postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, dbError("postgres: %w", err)
	}
	s := &Store{pool: pool, node: nodeID, box: box}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, dbError("postgres: %w", err)
	}
	if err := s.checkSecretsKey(ctx); err != nil {
		pool.Close()
		return nil, dbError("postgres: %w", err)
	}
	return s, nil
}

// Close closes the pool's connections, waiting for those in use.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

const sandboxColumns = `id, template_id, alias, state, vcpu, memory_mb, metadata, env,
	access_token, slot_index, auto_pause, started_at, end_at, ended_reason, updated_at, image_dir, timeout_secs,
	network, traffic_token, reboot_on_resume, auto_pause_drop_memory, auto_resume, node_id`

// sandboxSelect is what a read returns: the written columns and the
// upload state and digest, which only SetSandboxUpload writes.
const sandboxSelect = sandboxColumns + `, image_upload, image_digest, unresponsive, team_id, volume_mounts`

// sandboxInsert writes a new record: the written columns, the team and
// the volume mounts, which no update changes.
const sandboxInsert = `INSERT INTO sandboxes (` + sandboxColumns + `, team_id, volume_mounts)
	VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9, $10, $11, $12, $13, $14, $15, $16, $17,
	$18::jsonb, $19, $20, $21, $22, $23, $24, NULLIF($25, '')::jsonb)`

func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(s.box, sb)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "create sandbox "+sb.ID, func(tx pgx.Tx) error {
		if err := checkTeamLimit(ctx, tx, sb); err != nil {
			return err
		}
		return s.insertSandbox(ctx, tx, sb, args)
	})
}

// insertSandbox writes sb's new record, whose written columns are args,
// with its references to the volumes it mounts.
func (s *Store) insertSandbox(ctx context.Context, tx pgx.Tx, sb *store.Sandbox, args []any) error {
	mounts, err := store.MarshalVolumeMounts(sb.VolumeMounts)
	if err != nil {
		return err
	}
	if err := holdVolumes(ctx, tx, s.node, store.RefSandbox, sb.ID, sb.VolumeMounts); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, sandboxInsert, append(args, s.node, sb.TeamID, mounts)...)
	if err != nil && isUniqueViolation(err) {
		return store.ErrConflict
	}
	return err
}

// checkTeamLimit refuses sb when one more sandbox of its team, of its
// memory and vCPUs, would pass one of the team's limits, cluster-wide. The
// row of a team with limits is locked until tx ends, so the creates of one
// team, on any node, count and insert one at a time; other teams' do not
// wait.
//
// A sandbox of a team with no record is refused (ErrNotFound): its team
// was deleted while the create was on its way. The team's advisory lock,
// held shared here, makes a team's delete, which counts its sandboxes and
// volumes (DeleteTeam), wait for this create to end and count it.
func checkTeamLimit(ctx context.Context, tx pgx.Tx, sb *store.Sandbox) error {
	if sb.TeamID == "" {
		return nil
	}
	// Every create holds the team's advisory lock shared (readTeamLocked):
	// creates never wait for each other, nor for a change of the team's
	// limits; only the team's delete waits for them. The team is read
	// after it, so a delete that held it is seen. A team without limits
	// takes no other lock; a limit set meanwhile applies from the next
	// create.
	const team = `SELECT ` + teamColumns + ` FROM teams WHERE id = $1`
	var t *auth.Team
	err := readTeamLocked(ctx, tx, sb.TeamID, team, func(r pgx.Row) (err error) {
		t, err = scanTeam(r)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return store.TeamGone(sb.TeamID)
	}
	if err != nil || !t.Limited() {
		return err
	}
	t, err = scanTeam(tx.QueryRow(ctx, team+` FOR UPDATE`, sb.TeamID))
	if errors.Is(err, pgx.ErrNoRows) {
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
		if _, err := tx.Exec(ctx, `UPDATE teams SET bucket_tokens = $2, bucket_at = $3 WHERE id = $1`,
			t.ID, t.Bucket.Tokens, store.UnixNanos(t.Bucket.At)); err != nil {
			return err
		}
	}
	return nil
}

// requireTeam refuses, with ErrNotFound, a record of a team that has none
// ("" is no team), and keeps the team from being deleted until tx ends:
// the delete then counts the record. The hold is a shared advisory lock
// (teamLock), not a lock of the team's row: creates of one team, the
// default one for a whole cluster often, write nothing to that row.
func requireTeam(ctx context.Context, tx pgx.Tx, team string) error {
	if team == "" {
		return nil
	}
	var one int
	err := readTeamLocked(ctx, tx, team, `SELECT 1 FROM teams WHERE id = $1`, func(r pgx.Row) error { return r.Scan(&one) })
	if errors.Is(err, pgx.ErrNoRows) {
		return store.TeamGone(team)
	}
	return err
}

// teamLock is the advisory lock key of team: creates of its sandboxes,
// volumes and secrets hold it shared, its delete exclusively. It is taken before the
// team's row, by every transaction that takes both, so that a create of a
// limited team (which then locks the row) and a delete never wait for
// each other.
func teamLock(team string) string { return "team\n" + team }

// readTeamLocked takes team's advisory lock, shared, until tx ends, then
// runs query (its $1 the team) and scans its row, in one round trip: the
// statements of a batch run in order, each with a snapshot of its own, so
// the read sees what a delete that held the lock committed.
func readTeamLocked(ctx context.Context, tx pgx.Tx, team, query string, scan func(pgx.Row) error) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`, teamLock(team))
	b.Queue(query, team)
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		err = scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkSnapshotLimit refuses, with ErrLimit, a new snapshot or template of
// a sandbox that would take its team past its MaxSnapshots or
// MaxSnapshotMB, cluster-wide. An update of a record already kept is not
// a new one, nor is the record replacing the team's one named replaces
// ("" for none; on any node), which takes its place (if it is no larger). The row of a
// team with a limit is locked until tx ends, so that two nodes' records
// never pass the count together; callers take it before any other lock,
// as creates do.
func (s *Store) checkSnapshotLimit(ctx context.Context, tx pgx.Tx, t *store.Template, kind store.TemplateKind,
	replaces string) error {
	if t.TeamID == "" || !store.CountsAsSnapshot(kind) {
		return nil
	}
	return snapshotRoom(ctx, tx, t.TeamID, roomCheck{lock: true, id: t.ID, replaces: replaces,
		bytes: t.ImageStats.Bytes})
}

// SnapshotRoom says, with ErrLimit, that team keeps as many snapshots (or
// bytes of them) as its limits allow, cluster-wide: an early refusal,
// made before a checkpoint.
func (s *Store) SnapshotRoom(ctx context.Context, team string) error {
	if team == "" {
		return nil
	}
	err := snapshotRoom(ctx, s.pool, team, roomCheck{})
	if err != nil && !errors.Is(err, store.ErrLimit) {
		err = dbError("snapshots of team %s: %w", team, err)
	}
	return err
}

// roomCheck is what snapshotRoom is asked: whether to lock the team's row
// (in a transaction), the record to make room for ("" for one not named
// yet; none is needed if it exists) and its bytes (0: not known yet), and
// the team's record named replaces ("" for none): a replacement of the
// team's own, no larger, needs no room.
type roomCheck struct {
	lock         bool
	id, replaces string
	bytes        int64
}

// snapshotRoom judges team's MaxSnapshots and MaxSnapshotMB by what it
// keeps, read in q. A team without the limits costs one read.
func snapshotRoom(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, team string, c roomCheck) error {
	const read = `SELECT ` + teamColumns + ` FROM teams WHERE id = $1`
	lim, err := scanTeam(q.QueryRow(ctx, read, team))
	if err == nil && lim.SnapshotLimited() && c.lock {
		lim, err = scanTeam(q.QueryRow(ctx, read+` FOR UPDATE`, team))
	}
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !lim.SnapshotLimited()) {
		return nil
	}
	if err != nil {
		return err
	}
	if c.id != "" {
		var exists bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM templates WHERE id = $1)`, c.id).Scan(&exists); err != nil || exists {
			return err
		}
	}
	var held, replaced int
	var heldBytes, replacedBytes int64
	// A team's names are the cluster's: the record replaced may be
	// another node's.
	if err := q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE name = $4),
		coalesce(sum(image_bytes), 0)::bigint,
		coalesce(sum(image_bytes) FILTER (WHERE name = $4), 0)::bigint
		FROM templates WHERE team_id = $1 AND kind IN ($2, $3)`, team, string(store.KindSnapshot),
		string(store.KindSandboxTemplate), c.replaces).Scan(&held, &replaced, &heldBytes, &replacedBytes); err != nil {
		return err
	}
	if c.replaces != "" && replaced > 0 {
		err = lim.SnapshotReplacementRoom(heldBytes, replacedBytes, c.bytes)
	} else {
		err = lim.SnapshotRoom(held, heldBytes, c.bytes)
	}
	if err != nil {
		return fmt.Errorf("%v: %w", err, store.ErrLimit)
	}
	return nil
}

func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(s.box, sb)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "update sandbox "+sb.ID, func(tx pgx.Tx) error {
		return updateSandbox(ctx, tx, sb, append(args, s.node))
	})
}

// updateSandbox writes sb's record; a dead sandbox's references are
// dropped with it, as it needs nothing any more.
func updateSandbox(ctx context.Context, tx pgx.Tx, sb *store.Sandbox, args []any) error {
	tag, err := tx.Exec(ctx, `UPDATE sandboxes SET template_id = $2, alias = $3, state = $4, vcpu = $5,
		memory_mb = $6, metadata = $7::jsonb, env = $8::jsonb, access_token = $9, slot_index = $10,
		auto_pause = $11, started_at = $12, end_at = $13, ended_reason = $14, updated_at = $15, image_dir = $16,
		timeout_secs = $17, network = $18::jsonb, traffic_token = $19, reboot_on_resume = $20,
		auto_pause_drop_memory = $21, auto_resume = $22,
		image_upload = CASE WHEN $16 = '' THEN '' ELSE image_upload END,
		image_digest = CASE WHEN $16 = '' THEN '' ELSE image_digest END,
		unresponsive = CASE WHEN $4 = 'running' THEN unresponsive ELSE '' END
		WHERE id = $1 AND ($23 = '' OR node_id = $23)`, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	if sb.State == store.StateDead {
		return releaseRefs(ctx, tx, store.RefSandbox, sb.ID)
	}
	return nil
}

func (s *Store) SetSandboxUnresponsive(ctx context.Context, id, reason string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET unresponsive = $2 WHERE id = $1 AND ($3 = '' OR node_id = $3)`,
		id, reason, s.node)
	if err != nil {
		return dbError("record sandbox %s unresponsive: %w", id, err)
	}
	return expectOneRow(tag, "record sandbox "+id+" unresponsive")
}

func (s *Store) SetSandboxUpload(ctx context.Context, id string, state store.UploadState, digest string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET image_upload = $2, image_digest = $4
		WHERE id = $1 AND image_dir <> '' AND ($3 = '' OR node_id = $3)`, id, string(state), s.node, digest)
	if err != nil {
		return dbError("record image upload of sandbox %s: %w", id, err)
	}
	return expectOneRow(tag, "record image upload of sandbox "+id)
}

func (s *Store) GetSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+sandboxSelect+` FROM sandboxes WHERE id = $1 AND ($2 = '' OR node_id = $2)`,
		id, s.node)
	sb, err := scanSandbox(s.box, row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("sandbox %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	return s.listSandboxes(ctx, f, s.node)
}

// listSandboxes lists node's sandboxes matching f, every node's for "".
func (s *Store) listSandboxes(ctx context.Context, f store.SandboxFilter, node string) ([]*store.Sandbox, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = append(where, "state = ANY("+arg(states)+"::text[])")
	}
	if len(f.Metadata) > 0 {
		// Containment of a flat object of strings: every pair matches.
		md, err := json.Marshal(f.Metadata)
		if err != nil {
			return nil, dbError("list sandboxes: metadata filter: %w", err)
		}
		where = append(where, "metadata @> "+arg(string(md))+"::jsonb")
	}
	if f.Template != "" {
		p := arg(f.Template)
		where = append(where, "(template_id = "+p+" OR alias = "+p+")")
	}
	if node != "" {
		where = append(where, "node_id = "+arg(node))
	}
	if f.TeamID != "" {
		where = append(where, "team_id = "+arg(f.TeamID))
	}
	if f.IDs != nil {
		where = append(where, "id = ANY("+arg(f.IDs)+"::text[])")
	}
	if !f.StartedFrom.IsZero() {
		where = append(where, "started_at >= "+arg(f.StartedFrom.UnixNano()))
	}
	// The cursor's time bounds the index scan; the ID orders within it.
	if c := f.After; c != nil {
		at, id := arg(c.At.UnixNano()), arg(c.ID)
		if f.Oldest {
			where = append(where, "started_at >= "+at+" AND (started_at > "+at+" OR id < "+id+")")
		} else {
			where = append(where, "started_at <= "+at+" AND (started_at < "+at+" OR id > "+id+")")
		}
	}
	query := `SELECT ` + sandboxSelect + ` FROM sandboxes`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Oldest {
		query += " ORDER BY started_at, id DESC"
	} else {
		query += " ORDER BY started_at DESC, id"
	}
	if f.Limit > 0 {
		query += " LIMIT " + arg(f.Limit)
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, dbError("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*store.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(s.box, rows)
		if err != nil {
			return nil, dbError("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list sandboxes: %w", err)
	}
	return out, nil
}

func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete sandbox "+id, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1 AND ($2 = '' OR node_id = $2)`, id, s.node)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrNotFound
		}
		return releaseRefs(ctx, tx, store.RefSandbox, id)
	})
}

const templateColumns = `id, name, rootfs_path, default_user, default_workdir, env, vcpu, memory_mb, created_at,
	kind, image_dir, source_sandbox, envd_token, env_vars, node_id, rootfs_id, upload_state, upload_error,
	image_digest, rootfs_digest, team_id, volume_mounts, image_bytes, image_new_bytes, image_parent`

func (s *Store) PutTemplate(ctx context.Context, t *store.Template) error {
	env, err := json.Marshal(nonNil(t.Env))
	if err != nil {
		return dbError("put template %s: %w", t.ID, err)
	}
	envVars, err := json.Marshal(nonNil(t.EnvVars))
	if err != nil {
		return dbError("put template %s: %w", t.ID, err)
	}
	kind := t.Kind
	if kind == "" {
		kind = store.KindRootfs
	}
	// created_at is kept from the first put, as in the SQLite store.
	err = s.inTx(ctx, "put template "+t.ID, func(tx pgx.Tx) error {
		// The team's row before the root filesystem, in the order a
		// create takes them: two orders could deadlock.
		if err := s.checkSnapshotLimit(ctx, tx, t, kind, ""); err != nil {
			return err
		}
		if err := lockRootfs(ctx, tx, s.node, t.RootfsPath); err != nil {
			return err
		}
		return s.putTemplateHolding(ctx, tx, t, kind, string(env), string(envVars))
	})
	if err != nil {
		if isUniqueViolation(err) {
			return dbError("put template %s (%s): %w", t.ID, t.Name, store.ErrConflict)
		}
		return err
	}
	return nil
}

// putTemplateHolding writes t's record and its reference to its root
// filesystem (its own, or for a checkpoint the one of the template it was
// taken from), replacing the reference it held, in tx.
func (s *Store) putTemplateHolding(ctx context.Context, tx pgx.Tx, t *store.Template, kind store.TemplateKind,
	env, envVars string) error {
	if err := putTemplate(ctx, tx, s.box, t, kind, env, envVars, s.node); err != nil {
		return err
	}
	if err := releaseRefs(ctx, tx, store.RefTemplate, t.ID); err != nil {
		return err
	}
	if err := holdVolumes(ctx, tx, s.node, store.RefTemplate, t.ID, t.VolumeMounts); err != nil {
		return err
	}
	return insertRef(ctx, tx, s.node, store.RefTemplate, t.ID, t.RootfsPath)
}

func putTemplate(ctx context.Context, tx pgx.Tx, box *secretBox, t *store.Template, kind store.TemplateKind,
	env, envVars, node string) error {
	envdToken, err := box.seal(colEnvdToken, t.ID, t.EnvdToken)
	if err != nil {
		return err
	}
	mounts, err := store.MarshalVolumeMounts(t.VolumeMounts)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO templates (`+templateColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12, $13, $14::jsonb, $15, $16, $17, $18,
		$19, $20, $21, NULLIF($22, '')::jsonb, $23, $24, $25)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, rootfs_path = excluded.rootfs_path,
		default_user = excluded.default_user, default_workdir = excluded.default_workdir,
		env = excluded.env, vcpu = excluded.vcpu, memory_mb = excluded.memory_mb,
		kind = excluded.kind, image_dir = excluded.image_dir, source_sandbox = excluded.source_sandbox,
		envd_token = excluded.envd_token, env_vars = excluded.env_vars, rootfs_id = excluded.rootfs_id,
		upload_state = excluded.upload_state, upload_error = excluded.upload_error,
		image_digest = excluded.image_digest, rootfs_digest = excluded.rootfs_digest, team_id = excluded.team_id,
		volume_mounts = excluded.volume_mounts, image_bytes = excluded.image_bytes,
		image_new_bytes = excluded.image_new_bytes, image_parent = excluded.image_parent`,
		t.ID, t.Name, t.RootfsPath, t.DefaultUser, t.DefaultWorkdir, env, t.VCPU, t.MemoryMB,
		t.CreatedAt.UnixNano(), string(kind), t.ImageDir, t.SourceSandbox, envdToken, envVars, node,
		t.RootfsID, string(t.Upload), t.UploadError, t.ImageDigest, t.RootfsDigest, t.TeamID, mounts,
		t.ImageStats.Bytes, t.ImageStats.NewBytes, t.ImageStats.Parent)
	return err
}

func (s *Store) ReplaceTemplate(ctx context.Context, t *store.Template) (*store.Template, error) {
	env, err := json.Marshal(nonNil(t.Env))
	if err != nil {
		return nil, dbError("put template %s: %w", t.ID, err)
	}
	envVars, err := json.Marshal(nonNil(t.EnvVars))
	if err != nil {
		return nil, dbError("put template %s: %w", t.ID, err)
	}
	kind := t.Kind
	if kind == "" {
		kind = store.KindRootfs
	}
	var old *store.Template
	err = s.inTx(ctx, "replace template "+t.Name, func(tx pgx.Tx) error {
		// The team's row first, as in PutTemplate.
		if err := s.checkSnapshotLimit(ctx, tx, t, kind, t.Name); err != nil {
			return err
		}
		// Replaces of one name run one after the other, each seeing what
		// the one before put: a team's name across the cluster, a public
		// one on this node.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
			nameLock(s.node, t)); err != nil {
			return err
		}
		if err := lockRootfs(ctx, tx, s.node, t.RootfsPath); err != nil {
			return err
		}
		prev, err := scanTemplate(s.box, tx.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE name = $1 AND id <> $2 AND (node_id = $3 OR ($4 AND team_id <> ''))
			ORDER BY node_id = $3 DESC LIMIT 1`, t.Name, t.ID, s.node, t.TeamID != ""))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case !store.Replaceable(prev, t.TeamID, s.node):
			return store.ErrConflict
		default:
			if _, err := tx.Exec(ctx, `DELETE FROM templates WHERE id = $1`, prev.ID); err != nil {
				return err
			}
			if err := releaseRefs(ctx, tx, store.RefTemplate, prev.ID); err != nil {
				return err
			}
			old = prev
		}
		return s.putTemplateHolding(ctx, tx, t, kind, string(env), string(envVars))
	})
	if err != nil {
		if isUniqueViolation(err) && !errors.Is(err, store.ErrConflict) {
			return nil, dbError("replace template %s: %w", t.Name, store.ErrConflict)
		}
		return nil, err
	}
	return old, nil
}

// nameLock is the advisory lock that orders replacements of t's name: a
// team's names are the cluster's, a public one (as "base") each node's.
func nameLock(node string, t *store.Template) string {
	if t.TeamID != "" {
		return "template name\n" + t.Name
	}
	return "template name\n" + node + "\n" + t.Name
}

// TemplateNamed finds the record a new one of this node named name would
// conflict with: this node's of that name, else any node's team template
// of it (teams' names are the cluster's).
func (s *Store) TemplateNamed(ctx context.Context, name string) (*store.Template, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
		WHERE name = $1 AND (node_id = $2 OR team_id <> '') ORDER BY node_id = $2 DESC LIMIT 1`, name, s.node)
	t, err := scanTemplate(s.box, row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("template named %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("template named %s: %w", name, err)
	}
	return t, nil
}

func (s *Store) SetTemplateUpload(ctx context.Context, id string, state store.UploadState, msg string,
	digests store.UploadDigests) error {
	// The image's size, recorded when it was taken, stays until an upload
	// finds it (a pending or failed one knows none).
	tag, err := s.pool.Exec(ctx, `UPDATE templates SET upload_state = $2, upload_error = $3, image_digest = $5,
		rootfs_digest = $6, image_bytes = CASE WHEN $7::bigint > 0 THEN $7::bigint ELSE image_bytes END,
		image_new_bytes = $8, image_parent = $9
		WHERE id = $1 AND ($4 = '' OR node_id = $4)`,
		id, string(state), msg, s.node, digests.Image, digests.Rootfs, digests.Stats.Bytes, digests.Stats.NewBytes,
		digests.Stats.Parent)
	if err != nil {
		return dbError("record upload of template %s: %w", id, err)
	}
	return expectOneRow(tag, "record upload of template "+id)
}

// SharedTemplate finds a template of any node, by ID or name, whose files
// are in the object store: one a node without its own copy can fetch. Of
// several with the name, the newest wins.
func (s *Store) SharedTemplate(ctx context.Context, idOrName string) (*store.Template, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
		WHERE (id = $1 OR name = $1) AND upload_state = $2
		ORDER BY id = $1 DESC, created_at DESC, id LIMIT 1`, idOrName, string(store.UploadUploaded))
	t, err := scanTemplate(s.box, row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("shared template %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("shared template %s: %w", idOrName, err)
	}
	return t, nil
}

func (s *Store) GetTemplate(ctx context.Context, idOrName string) (*store.Template, error) {
	// An ID match wins over a name match (another template's name may
	// equal this ID).
	row := s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
		WHERE (id = $1 OR name = $1) AND ($2 = '' OR node_id = $2)
		ORDER BY id = $1 DESC, created_at, id LIMIT 1`, idOrName, s.node)
	t, err := scanTemplate(s.box, row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("template %s: %w", idOrName, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("get template %s: %w", idOrName, err)
	}
	return t, nil
}

func (s *Store) ListTemplates(ctx context.Context) ([]*store.Template, error) {
	return s.listTemplates(ctx, s.node)
}

// listTemplates lists node's templates, every node's for "".
func (s *Store) listTemplates(ctx context.Context, node string) ([]*store.Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+templateColumns+` FROM templates WHERE ($1 = '' OR node_id = $1)
		ORDER BY created_at, id`, node)
	if err != nil {
		return nil, dbError("list templates: %w", err)
	}
	defer rows.Close()
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(s.box, rows)
		if err != nil {
			return nil, dbError("list templates: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list templates: %w", err)
	}
	return out, nil
}

// ListSnapshots pages through the node's snapshots, every node's for a
// store of no node (a gateway's).
func (s *Store) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Template, error) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{"kind = " + arg(string(store.KindSnapshot))}
	if s.node != "" {
		where = append(where, "node_id = "+arg(s.node))
	}
	if f.TeamID != "" {
		where = append(where, "team_id IN ('', "+arg(f.TeamID)+")")
	}
	if f.SourceSandbox != "" {
		where = append(where, "source_sandbox = "+arg(f.SourceSandbox))
	}
	if f.Name != "" {
		where = append(where, "name = "+arg(f.Name))
	}
	if c := f.After; c != nil {
		at, id := arg(c.At.UnixNano()), arg(c.ID)
		where = append(where, "created_at <= "+at+" AND (created_at < "+at+" OR id < "+id+")")
	}
	query := `SELECT ` + templateColumns + ` FROM templates WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		query += " LIMIT " + arg(f.Limit)
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, dbError("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(s.box, rows)
		if err != nil {
			return nil, dbError("list snapshots: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list snapshots: %w", err)
	}
	return out, nil
}

func (s *Store) DeleteTemplate(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete template "+id, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM templates WHERE id = $1 AND ($2 = '' OR node_id = $2)`, id, s.node)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrNotFound
		}
		return releaseRefs(ctx, tx, store.RefTemplate, id)
	})
}

// sandboxArgs are a sandbox's column values in sandboxColumns order. Maps
// are sent as JSON text with explicit casts rather than left to pgx's type
// mapping, so the statements also work through the simple protocol (as
// with a transaction-pooling proxy).
func sandboxArgs(box *secretBox, sb *store.Sandbox) ([]any, error) {
	access, err := box.seal(colAccessToken, sb.ID, sb.AccessToken)
	if err != nil {
		return nil, err
	}
	traffic, err := box.seal(colTrafficToken, sb.ID, sb.TrafficToken)
	if err != nil {
		return nil, err
	}
	metadata, err := json.Marshal(nonNil(sb.Metadata))
	if err != nil {
		return nil, dbError("sandbox %s metadata: %w", sb.ID, err)
	}
	env, err := json.Marshal(nonNil(sb.EnvVars))
	if err != nil {
		return nil, dbError("sandbox %s env: %w", sb.ID, err)
	}
	var network *string // NULL: the default policy
	if sb.Network != nil {
		b, err := json.Marshal(sb.Network)
		if err != nil {
			return nil, dbError("sandbox %s network: %w", sb.ID, err)
		}
		n := string(b)
		network = &n
	}
	return []any{sb.ID, sb.TemplateID, sb.Alias, string(sb.State), sb.VCPU, sb.MemoryMB, string(metadata),
		string(env), access, sb.SlotIndex, sb.AutoPause, sb.StartedAt.UnixNano(), sb.EndAt.UnixNano(),
		sb.EndedReason, sb.UpdatedAt.UnixNano(), sb.ImageDir, sb.TimeoutSecs, network, traffic,
		sb.RebootOnResume, sb.AutoPauseDropMemory, sb.AutoResume}, nil
}

func scanSandbox(box *secretBox, r pgx.Row) (*store.Sandbox, error) {
	var sb store.Sandbox
	var state, upload string
	var metadata, env, network, mounts []byte
	var started, end, updated int64
	err := r.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &state, &sb.VCPU, &sb.MemoryMB, &metadata, &env,
		&sb.AccessToken, &sb.SlotIndex, &sb.AutoPause, &started, &end, &sb.EndedReason, &updated, &sb.ImageDir,
		&sb.TimeoutSecs, &network, &sb.TrafficToken, &sb.RebootOnResume, &sb.AutoPauseDropMemory, &sb.AutoResume,
		&sb.NodeID, &upload, &sb.ImageDigest, &sb.Unresponsive, &sb.TeamID, &mounts)
	if err != nil {
		return nil, err
	}
	if sb.VolumeMounts, err = store.UnmarshalVolumeMounts(mounts); err != nil {
		return nil, dbError("sandbox %s: %w", sb.ID, err)
	}
	if sb.AccessToken, err = box.open(colAccessToken, sb.ID, sb.AccessToken); err != nil {
		return nil, err
	}
	if sb.TrafficToken, err = box.open(colTrafficToken, sb.ID, sb.TrafficToken); err != nil {
		return nil, err
	}
	sb.State = store.SandboxState(state)
	sb.ImageUpload = store.UploadState(upload)
	sb.StartedAt = time.Unix(0, started).UTC()
	sb.EndAt = time.Unix(0, end).UTC()
	sb.UpdatedAt = time.Unix(0, updated).UTC()
	if err := json.Unmarshal(metadata, &sb.Metadata); err != nil {
		return nil, dbError("sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal(env, &sb.EnvVars); err != nil {
		return nil, dbError("sandbox %s env: %w", sb.ID, err)
	}
	if network != nil {
		sb.Network = &store.NetworkPolicy{}
		if err := json.Unmarshal(network, sb.Network); err != nil {
			return nil, dbError("sandbox %s network: %w", sb.ID, err)
		}
	}
	return &sb, nil
}

func scanTemplate(box *secretBox, r pgx.Row) (*store.Template, error) {
	var t store.Template
	var kind, upload string
	var env, envVars, mounts []byte
	var created int64
	if err := r.Scan(&t.ID, &t.Name, &t.RootfsPath, &t.DefaultUser, &t.DefaultWorkdir, &env, &t.VCPU,
		&t.MemoryMB, &created, &kind, &t.ImageDir, &t.SourceSandbox, &t.EnvdToken, &envVars, &t.NodeID,
		&t.RootfsID, &upload, &t.UploadError, &t.ImageDigest, &t.RootfsDigest, &t.TeamID, &mounts,
		&t.ImageStats.Bytes, &t.ImageStats.NewBytes, &t.ImageStats.Parent); err != nil {
		return nil, err
	}
	var err error
	if t.VolumeMounts, err = store.UnmarshalVolumeMounts(mounts); err != nil {
		return nil, dbError("template %s: %w", t.ID, err)
	}
	if t.EnvdToken, err = box.open(colEnvdToken, t.ID, t.EnvdToken); err != nil {
		return nil, err
	}
	t.CreatedAt = time.Unix(0, created).UTC()
	t.Kind = store.TemplateKind(kind)
	t.Upload = store.UploadState(upload)
	if err := json.Unmarshal(env, &t.Env); err != nil {
		return nil, dbError("template %s env: %w", t.ID, err)
	}
	if err := json.Unmarshal(envVars, &t.EnvVars); err != nil {
		return nil, dbError("template %s env vars: %w", t.ID, err)
	}
	return &t, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func expectOneRow(tag pgconn.CommandTag, op string) error {
	if tag.RowsAffected() == 0 {
		return dbError("%s: %w", op, store.ErrNotFound)
	}
	return nil
}

// uniqueViolation is PostgreSQL's SQLSTATE for a duplicate key.
const uniqueViolation = "23505"

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == uniqueViolation
}
