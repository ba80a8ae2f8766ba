package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey names the advisory lock that serialises migrations
// between processes opening the same database at once ("aenv" in ASCII).
const migrationLockKey int64 = 0x61656e76

// migration is one versioned schema change, from migrations/NNNN_name.sql.
type migration struct {
	version int64
	name    string
	body    string
}

var migrationName = regexp.MustCompile(`^([0-9]+)_[a-z0-9_]+\.sql$`)

// loadMigrations returns the embedded migrations in version order.
func loadMigrations() ([]migration, error) {
	paths, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	var out []migration
	seen := map[int64]string{}
	for _, p := range paths {
		name := path.Base(p)
		m := migrationName.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("migration %s: name is not NNNN_name.sql", name)
		}
		version, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		if other, dup := seen[version]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, name, version)
		}
		seen[version] = name
		body, err := migrationFiles.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		out = append(out, migration{version: version, name: name, body: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrate applies the migrations the database lacks, all in one
// transaction: PostgreSQL's DDL is transactional, so the schema is either
// left as it was or brought fully up to date. The transaction first takes
// an advisory lock, so that of several processes opening the database at
// once one migrates and the others wait, then find nothing left to do; the
// server releases the lock when the transaction ends or its connection
// drops. (A future migration that cannot run in a transaction, such as
// CREATE INDEX CONCURRENTLY, would need a step of its own.)
func (s *Store) migrate(ctx context.Context) error {
	steps, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	// A no-op once committed. Should it fail, pgx closes the connection and
	// the server undoes the transaction.
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, tx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range steps {
		if applied[m.version] {
			continue
		}
		// Without arguments Exec uses the simple protocol, which runs a
		// file of several statements.
		if _, err := tx.Exec(ctx, m.body); err != nil {
			return fmt.Errorf("migrate %s: %w", m.name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`,
			m.version, m.name); err != nil {
			return fmt.Errorf("migrate %s: record: %w", m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

func appliedVersions(ctx context.Context, tx pgx.Tx) (map[int64]bool, error) {
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	applied := make(map[int64]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}
