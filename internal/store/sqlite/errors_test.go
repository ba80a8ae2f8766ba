package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// SQLite's errors are classified by result code, never by text: a
// duplicate key is found so, and a full database becomes store.ErrFull.
func TestErrorsClassifiedByCode(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "aenv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	_, err = s.db.ExecContext(ctx, `CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO t (k) VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO t (k) VALUES ('a')`)
	if !isUniqueViolation(err) {
		t.Errorf("duplicate key: %v not recognised", err)
	}
	if isUniqueViolation(errors.New("UNIQUE constraint failed: t.k")) {
		t.Error("text alone taken for a constraint violation")
	}

	// Cap the database's size at what it has, then grow it: SQLITE_FULL.
	var pages int
	if err := s.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
	err = s.inTx(ctx, "fill", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (k, v) VALUES ('big', ?)`, make([]byte, 1<<20))
		return err
	})
	if !errors.Is(err, store.ErrFull) {
		t.Fatalf("write past the database's size: %v, want store.ErrFull", err)
	}
	if errdefs.HTTPStatus(err) != http.StatusInsufficientStorage {
		t.Errorf("status %d, want 507", errdefs.HTTPStatus(err))
	}
}
