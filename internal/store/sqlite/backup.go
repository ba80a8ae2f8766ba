package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// openRaw opens the database at path without applying migrations: a
// backup copies it as it is, and a restore rewrites the copy it made.
func openRaw(path string) (*sql.DB, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(10000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// Snapshot writes a consistent copy of the database at path to dest, which
// must not exist, while a server may be writing to it: VACUUM INTO reads
// in one transaction, which under WAL sees one commit and never blocks
// the writer. The copy is compacted and holds no WAL.
func Snapshot(ctx context.Context, path, dest string) error {
	db, err := openRaw(path)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, dest); err != nil {
		return fmt.Errorf("copy the database %s: %w", path, classify(err))
	}
	// The copy holds API tokens and sandbox environments, as its source.
	if err := os.Chmod(dest, 0o600); err != nil {
		return fmt.Errorf("copy the database %s: %w", path, err)
	}
	return nil
}

// Relocate rewrites, in the database at path, every text value that is
// oldDir or a path under it to the same place under newDir: records name
// their files (root filesystems, checkpoint images) by absolute path, and
// a restored data dir may be elsewhere. Every text column of every table
// is rewritten, not a list of known ones, so that a column added later is
// not missed; a value is only changed when it starts with the directory.
func Relocate(ctx context.Context, path, oldDir, newDir string) error {
	if oldDir == newDir {
		return nil
	}
	db, err := openRaw(path)
	if err != nil {
		return err
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("relocate %s: %w", path, err)
	}
	defer tx.Rollback()
	columns, err := textColumns(ctx, tx)
	if err != nil {
		return fmt.Errorf("relocate %s: %w", path, err)
	}
	oldPrefix := strings.TrimSuffix(oldDir, "/") + "/"
	newPrefix := strings.TrimSuffix(newDir, "/") + "/"
	for _, c := range columns {
		table, col := quoteIdent(c.table), quoteIdent(c.column)
		// substr and length count characters, on both sides alike.
		q := `UPDATE ` + table + ` SET ` + col + ` = CASE WHEN ` + col + ` = ?1 THEN ?2
			ELSE ?4 || substr(` + col + `, length(?3) + 1) END
			WHERE ` + col + ` = ?1 OR substr(` + col + `, 1, length(?3)) = ?3`
		if _, err := tx.ExecContext(ctx, q, strings.TrimSuffix(oldDir, "/"), strings.TrimSuffix(newDir, "/"),
			oldPrefix, newPrefix); err != nil {
			return fmt.Errorf("relocate %s.%s: %w", c.table, c.column, classify(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("relocate %s: %w", path, classify(err))
	}
	return nil
}

type tableColumn struct{ table, column string }

// textColumns lists the TEXT columns of the database's own tables.
func textColumns(ctx context.Context, tx *sql.Tx) ([]tableColumn, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		return nil, err
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		tables = append(tables, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []tableColumn
	for _, table := range tables {
		cols, err := tx.QueryContext(ctx, `SELECT name, type FROM pragma_table_info(?)`, table)
		if err != nil {
			return nil, err
		}
		for cols.Next() {
			var name, typ string
			if err := cols.Scan(&name, &typ); err != nil {
				cols.Close()
				return nil, err
			}
			if strings.EqualFold(typ, "TEXT") {
				out = append(out, tableColumn{table, name})
			}
		}
		cols.Close()
		if err := cols.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// quoteIdent quotes a table or column name for SQL.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// TemplateRootfsPaths returns the root filesystem paths the templates of
// the database at path name (a restore checks an archive's external roots
// against them), without applying migrations.
func TemplateRootfsPaths(ctx context.Context, path string) ([]string, error) {
	db, err := openRaw(path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT rootfs_path FROM templates`)
	if err != nil {
		return nil, fmt.Errorf("read templates of %s: %w", path, classify(err))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("read templates of %s: %w", path, err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
