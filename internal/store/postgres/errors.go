package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aenv-dev/aenv/internal/store"
)

// dbError is fmt.Errorf that also marks errors of an unreachable database
// with store.ErrUnavailable, so that callers answer "try again" (503)
// rather than "internal error", and those of a full disk with
// store.ErrFull (507).
func dbError(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	if !errors.Is(err, store.ErrUnavailable) && unavailable(err) {
		return fmt.Errorf("%w (%w)", err, store.ErrUnavailable)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateDiskFull && !errors.Is(err, store.ErrFull) {
		return fmt.Errorf("%w (%w)", err, store.ErrFull)
	}
	return err
}

// sqlstateDiskFull is PostgreSQL's disk_full condition.
const sqlstateDiskFull = "53100"

// unavailable reports whether err says the database could not be reached or
// the connection broke, as opposed to a refusal of the statement itself.
// It goes by error types, never by message text.
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return serverUnavailable(pgErr.Code)
	case errors.As(err, &connectErr):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The caller's own deadline or cancellation (a slow query, a row
		// lock waited on), not the database's absence: context errors
		// satisfy net.Error too, so this comes before that case.
		return false
	case errors.As(err, &netErr):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

// serverUnavailable reports whether a SQLSTATE the server sent says it is
// going away or cannot serve now: class 08 (connection exception), 57P01-03
// (admin or crash shutdown, cannot connect now), 53300 (too many connections).
func serverUnavailable(code string) bool {
	switch code {
	case "57P01", "57P02", "57P03", "53300":
		return true
	}
	return strings.HasPrefix(code, "08")
}
