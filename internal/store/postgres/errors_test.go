package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aenv-dev/aenv/internal/store"
)

func TestDBErrorMarksUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "unix", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"closed mid-answer", io.ErrUnexpectedEOF, true},
		{"conn closed", pgconn.ErrConnClosed, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax error", &pgconn.PgError{Code: "42601"}, false},
		{"not found", store.ErrNotFound, false},
		{"canceled by the caller", context.Canceled, false},
		{"the caller's deadline", context.DeadlineExceeded, false},
		{"a connect that timed out", &pgconn.ConnectError{}, true},
		{"a read that timed out", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"other", errors.New("boom"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := dbError("get sandbox sb1: %w", tt.err)
			if got := errors.Is(err, store.ErrUnavailable); got != tt.want {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, tt.want)
			}
			if !errors.Is(err, tt.err) {
				t.Errorf("%v lost its cause %v", err, tt.err)
			}
			// Marking twice (a wrapped error wrapped again) names it once.
			if again := dbError("outer: %w", err); tt.want && again.Error() != "outer: "+err.Error() {
				t.Errorf("wrapped again: %q", again)
			}
		})
	}
}

// PostgreSQL's disk_full is the store's ErrFull (507), by SQLSTATE.
func TestDBErrorMarksDiskFull(t *testing.T) {
	full := dbError("put template t1: %w", &pgconn.PgError{Code: "53100", Message: "could not extend file"})
	if !errors.Is(full, store.ErrFull) || errors.Is(full, store.ErrUnavailable) {
		t.Errorf("disk_full: %v: want ErrFull only", full)
	}
	if again := dbError("outer: %w", full); again.Error() != "outer: "+full.Error() {
		t.Errorf("wrapped again: %q", again)
	}
	if other := dbError("x: %w", &pgconn.PgError{Code: "23505"}); errors.Is(other, store.ErrFull) {
		t.Errorf("unique violation taken for a full disk: %v", other)
	}
}
