package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
)

// The cluster's records: its nodes, API keys and settings. They are not
// scoped to a node; a node writes its own row, gateways read them all.

// Node is the record of one node of a cluster: where it is, what it may
// hold and what it holds, as of its last heartbeat.
type Node struct {
	ID       string
	Address  string // host:port gateways reach it at
	Draining bool   // takes no new sandboxes
	Version  string
	// Protocol is the cluster protocol the node speaks (see
	// internal/cluster.Protocol).
	Protocol int
	// StartedAt is when the node process started.
	StartedAt time.Time
	// HeartbeatAge is how long ago the node last reported, by the
	// database's clock (so the nodes' clocks need not agree).
	HeartbeatAge time.Duration
	Capacity     NodeCapacity
	Use          NodeUse
	// SharedImages: the node has the cluster's object store, so it can
	// restore any template uploaded there, not only its own.
	SharedImages bool
}

// NodeCapacity is what a node may hold.
type NodeCapacity struct {
	MaxSandboxes int // 0: no count limit
	MemoryMB     int // memory its sandboxes may be given in all
	VCPUs        int
}

// NodeUse is what a node holds.
type NodeUse struct {
	Sandboxes    int // running or paused in memory
	Starting     int // creates and restores in progress
	MemoryUsedMB int // memory given to its live sandboxes
	// Builds are its template builds under way (a few, bounded by the
	// build service), so that gateways list a template while its first
	// build runs.
	Builds []store.BuildProgress
}

// buildsJSON is builds as the nodes row keeps them.
func buildsJSON(builds []store.BuildProgress) ([]byte, error) {
	if builds == nil {
		builds = []store.BuildProgress{}
	}
	return json.Marshal(builds)
}

// dbNow is the database's clock in unix nanoseconds.
const dbNow = `(extract(epoch from clock_timestamp()) * 1000000000)::bigint`

// RegisterNode writes n's row (a node starting, or starting again). A
// drained node stays drained across restarts.
func (s *Store) RegisterNode(ctx context.Context, n Node) error {
	builds, err := buildsJSON(n.Use.Builds)
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.ID, err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO nodes (id, address, version, started_at, heartbeat_at,
		max_sandboxes, memory_mb, vcpus, sandboxes, starting, memory_used_mb, shared_images, protocol, builds)
		VALUES ($1, $2, $3, $4, `+dbNow+`, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb)
		ON CONFLICT (id) DO UPDATE SET address = excluded.address, version = excluded.version,
		protocol = excluded.protocol,
		started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
		max_sandboxes = excluded.max_sandboxes, memory_mb = excluded.memory_mb, vcpus = excluded.vcpus,
		sandboxes = excluded.sandboxes, starting = excluded.starting, memory_used_mb = excluded.memory_used_mb,
		shared_images = excluded.shared_images, builds = excluded.builds`,
		n.ID, n.Address, n.Version, n.StartedAt.UnixNano(), n.Capacity.MaxSandboxes, n.Capacity.MemoryMB,
		n.Capacity.VCPUs, n.Use.Sandboxes, n.Use.Starting, n.Use.MemoryUsedMB, n.SharedImages, n.Protocol, builds)
	if err != nil {
		return dbError("register node %s: %w", n.ID, err)
	}
	return nil
}

// Heartbeat stamps node id's row with the time and its use, and reports
// whether the node is drained. ErrNotFound: the row is gone (removed by an
// operator); the node registers again.
func (s *Store) Heartbeat(ctx context.Context, id string, use NodeUse) (draining bool, err error) {
	builds, err := buildsJSON(use.Builds)
	if err != nil {
		return false, fmt.Errorf("heartbeat of node %s: %w", id, err)
	}
	err = s.pool.QueryRow(ctx, `UPDATE nodes SET heartbeat_at = `+dbNow+`, sandboxes = $2, starting = $3,
		memory_used_mb = $4, builds = $5::jsonb WHERE id = $1 RETURNING draining`,
		id, use.Sandboxes, use.Starting, use.MemoryUsedMB, builds).Scan(&draining)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, dbError("heartbeat of node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return false, dbError("heartbeat of node %s: %w", id, err)
	}
	return draining, nil
}

const nodeColumns = `id, address, draining, version, started_at, ` + dbNow + ` - heartbeat_at,
	max_sandboxes, memory_mb, vcpus, sandboxes, starting, memory_used_mb, shared_images, protocol, builds`

// ListNodes returns every node, by ID.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, dbError("list nodes: %w", err)
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		var n Node
		var started, age int64
		var builds []byte
		if err := rows.Scan(&n.ID, &n.Address, &n.Draining, &n.Version, &started, &age,
			&n.Capacity.MaxSandboxes, &n.Capacity.MemoryMB, &n.Capacity.VCPUs,
			&n.Use.Sandboxes, &n.Use.Starting, &n.Use.MemoryUsedMB, &n.SharedImages, &n.Protocol, &builds); err != nil {
			return nil, dbError("list nodes: %w", err)
		}
		// A row a newer node wrote in a shape this one does not read
		// lists no builds; the rest of it still counts.
		_ = json.Unmarshal(builds, &n.Use.Builds)
		n.StartedAt = time.Unix(0, started).UTC()
		n.HeartbeatAge = time.Duration(age)
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list nodes: %w", err)
	}
	return out, nil
}

// SetDraining drains node id (it takes no new sandboxes) or undrains it.
func (s *Store) SetDraining(ctx context.Context, id string, draining bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET draining = $2 WHERE id = $1`, id, draining)
	if err != nil {
		return dbError("drain node %s: %w", id, err)
	}
	return expectOneRow(tag, "drain node "+id)
}

// RemoveNode deletes node id's row and the records of its sandboxes and
// templates: a node leaving the cluster for good with nothing left. Its
// templates uploaded to the object store stay: they are not on the node,
// and every other node can still use them.
func (s *Store) RemoveNode(ctx context.Context, id string) error {
	if id == "" {
		return dbError("remove node: %w", store.ErrNotFound)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The node's references go with their holders; those of its
		// uploaded templates, which stay, are kept with them, and so are
		// its volumes' references to their layers: volume records stay
		// (a gateway deletes them), and the node may come back with them.
		for _, q := range []string{`DELETE FROM sandboxes WHERE node_id = $1`,
			`DELETE FROM templates WHERE node_id = $1 AND upload_state <> 'uploaded'`,
			`DELETE FROM refs WHERE node_id = $1
				AND NOT (holder_kind = 'template' AND holder_id IN (SELECT id FROM templates))
				AND NOT (holder_kind = 'volume' AND holder_id IN (SELECT id FROM volumes))`,
			`DELETE FROM nodes WHERE id = $1`} {
			if _, err := tx.Exec(ctx, q, id); err != nil {
				return err // wrapped below
			}
		}
		return nil
	})
	if err != nil {
		return dbError("remove node %s: %w", id, err)
	}
	return nil
}

// SandboxNode returns the node holding sandbox id: what a gateway routes
// by.
func (s *Store) SandboxNode(ctx context.Context, id string) (string, error) {
	var node string
	err := s.pool.QueryRow(ctx, `SELECT node_id FROM sandboxes WHERE id = $1`, id).Scan(&node)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", dbError("sandbox %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return "", dbError("sandbox %s: %w", id, err)
	}
	return node, nil
}

// TemplateCopies returns every node's template with this ID or name
// (every node has its own "base"), oldest first.
func (s *Store) TemplateCopies(ctx context.Context, idOrName string) ([]*store.Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+templateColumns+` FROM templates WHERE id = $1 OR name = $1
		ORDER BY created_at, id`, idOrName)
	if err != nil {
		return nil, dbError("template %s: %w", idOrName, err)
	}
	defer rows.Close()
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(s.box, rows)
		if err != nil {
			return nil, dbError("template %s: %w", idOrName, err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("template %s: %w", idOrName, err)
	}
	return out, nil
}

// AddAPIKey lets key in as an admin key of the default team (the
// operator's --api-key, or the one a first gateway made); it is kept as a
// digest. Adding a key already there changes nothing.
func (s *Store) AddAPIKey(ctx context.Context, key string) error {
	// The record shows nothing of the key: neither its first characters
	// nor its digest's, which could help check guesses of a weak key.
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("add API key: %w", err)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (`+keyColumns+`)
		VALUES ($1, $2, 'operator', '', $3, TRUE, $4, 0, 0, 0) ON CONFLICT (key_sha256) DO NOTHING`,
		hex.EncodeToString(id[:]), auth.DefaultTeam, auth.Digest(key), time.Now().UnixNano())
	if err != nil {
		return dbError("add API key: %w", err)
	}
	return nil
}

// CountAPIKeys returns how many API keys the cluster has.
func (s *Store) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n); err != nil {
		return 0, dbError("count API keys: %w", err)
	}
	return n, nil
}

// ErrSecretMismatch: a process was given a cluster secret other than the
// one the cluster already has.
var ErrSecretMismatch = errors.New("--cluster-secret differs from the secret this cluster already keeps in its database")

// ClusterSecret returns the secret gateways call nodes with. The first
// process to ask sets it: to want, or when want is "" to a new random
// one; the others read the same one, and one that wants another gets
// ErrSecretMismatch.
func (s *Store) ClusterSecret(ctx context.Context, want string) (string, error) {
	proposed := want
	if proposed == "" {
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return "", dbError("cluster secret: %w", err)
		}
		proposed = "aenv_cluster_" + hex.EncodeToString(buf)
	}
	// Gateways call nodes with it, so it is kept encrypted, not hashed.
	sealed, err := s.box.seal(colClusterSecret, "", proposed)
	if err != nil {
		return "", dbError("cluster secret: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO cluster_settings (name, value) VALUES ('cluster_secret', $1)
		ON CONFLICT (name) DO NOTHING`, sealed); err != nil {
		return "", dbError("cluster secret: %w", err)
	}
	var secret string
	if err := s.pool.QueryRow(ctx, `SELECT value FROM cluster_settings WHERE name = 'cluster_secret'`).
		Scan(&secret); err != nil {
		return "", dbError("cluster secret: %w", err)
	}
	if secret, err = s.box.open(colClusterSecret, "", secret); err != nil {
		return "", dbError("cluster secret: %w", err)
	}
	if want != "" && secret != want {
		return "", ErrSecretMismatch
	}
	return secret, nil
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.pool.Ping(ctx)
}

// MoveBuildNode makes node run the builds of the template named name.
func (s *Store) MoveBuildNode(ctx context.Context, name, node string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO build_routes (template_name, node_id) VALUES ($1, $2)
		ON CONFLICT (template_name) DO UPDATE SET node_id = excluded.node_id`, name, node)
	if err != nil {
		return dbError("build route of %s: %w", name, err)
	}
	return nil
}

// BuildNode returns the node that runs the builds of the template named
// name.
func (s *Store) BuildNode(ctx context.Context, name string) (string, error) {
	var node string
	err := s.pool.QueryRow(ctx, `SELECT node_id FROM build_routes WHERE template_name = $1`, name).Scan(&node)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", dbError("build of template %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return "", dbError("build of template %s: %w", name, err)
	}
	return node, nil
}

// SandboxToken is a running sandbox's envd access token.
type SandboxToken struct {
	ID, Token string
}

// RunningTokens returns the envd access tokens of every running sandbox:
// a signed file URL names no sandbox, only a signature made with one.
func (s *Store) RunningTokens(ctx context.Context) ([]SandboxToken, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, access_token FROM sandboxes WHERE state = $1`,
		string(store.StateRunning))
	if err != nil {
		return nil, dbError("sandbox tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SandboxToken, error) {
		var t SandboxToken
		if err := r.Scan(&t.ID, &t.Token); err != nil {
			return t, err
		}
		var err error
		t.Token, err = s.box.open(colAccessToken, t.ID, t.Token)
		return t, err
	})
	if err != nil {
		return nil, dbError("sandbox tokens: %w", err)
	}
	return out, nil
}

// AllTemplates lists every node's templates (the object store's garbage
// collector keeps what any of them refers to).
func (s *Store) AllTemplates(ctx context.Context) ([]*store.Template, error) {
	return s.listTemplates(ctx, "")
}

// orphanWhere selects sandbox $1 when another node than $2 holds it paused
// to disk with its image uploaded, and that node has not reported for $3
// nanoseconds: a sandbox node $2 may take over.
const orphanWhere = `id = $1 AND node_id <> $2 AND state = 'paused' AND image_dir <> ''
	AND image_upload = 'uploaded'
	AND node_id IN (SELECT id FROM nodes WHERE heartbeat_at < ` + dbNow + ` - $3)`

// OrphanSandbox returns sandbox id if this node may take it over (see
// orphanWhere); ErrNotFound otherwise.
func (s *Store) OrphanSandbox(ctx context.Context, id string, silentFor time.Duration) (*store.Sandbox, error) {
	sb, err := scanSandbox(s.box, s.pool.QueryRow(ctx, `SELECT `+sandboxSelect+` FROM sandboxes WHERE `+orphanWhere,
		id, s.node, silentFor.Nanoseconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("sandbox %s paused to disk on a silent node: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ClaimSandbox makes sandbox id this node's, its image now at imageDir,
// if it still may (see orphanWhere): of nodes claiming at once, one wins.
func (s *Store) ClaimSandbox(ctx context.Context, id, imageDir string, silentFor time.Duration) (*store.Sandbox, error) {
	sb, err := scanSandbox(s.box, s.pool.QueryRow(ctx, `UPDATE sandboxes SET node_id = $2, image_dir = $4, slot_index = -1
		WHERE `+orphanWhere+` RETURNING `+sandboxSelect, id, s.node, silentFor.Nanoseconds(), imageDir))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, dbError("claim sandbox %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, dbError("claim sandbox %s: %w", id, err)
	}
	return sb, nil
}

// AllSandboxes lists every node's sandboxes (the object store's garbage
// collector keeps the images they refer to).
func (s *Store) AllSandboxes(ctx context.Context) ([]*store.Sandbox, error) {
	return s.listSandboxes(ctx, store.SandboxFilter{}, "")
}
