package sqlite

import (
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/aenv-dev/aenv/internal/store"
)

// sqliteCode is the primary result code of a SQLite error (the low byte of
// its extended code), or 0 when err is not SQLite's.
func sqliteCode(err error) int {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return 0
	}
	return e.Code() & 0xff
}

// isUniqueViolation reports whether err is a UNIQUE or PRIMARY KEY
// constraint failing, by SQLite's extended result code.
func isUniqueViolation(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return true
	}
	return false
}

// classify adds the store's kind to a SQLite error whose cause a caller
// can act on: a full disk is store.ErrFull (507, not 500).
func classify(err error) error {
	if err != nil && sqliteCode(err) == sqlite3.SQLITE_FULL && !errors.Is(err, store.ErrFull) {
		return fmt.Errorf("%w (%w)", err, store.ErrFull)
	}
	return err
}
