package cli

import (
	"context"
	"errors"
	"strings"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// Exit codes of client commands, beside ExitOK, ExitError and ExitUsage.
// `aenv exec` exits with the remote command's own code instead.
const (
	ExitNotFound    = 3
	ExitAuth        = 4
	ExitUnreachable = 5
)

// usageError marks a mistake in the command line.
type usageError struct{ error }

// authError is a missing or rejected API key.
type authError struct{ error }

// exitStatus carries a remote command's exit code out of Run; it prints
// nothing.
type exitStatus struct{ code int }

func (e exitStatus) Error() string { return "exit status " }

// exitCodeOf maps an error from the command tree to the process exit code.
func exitCodeOf(err error) int {
	var ue usageError
	var ae authError
	var unreachable *client.UnreachableError
	var status exitStatus
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &status):
		return status.code
	case errors.As(err, &ue), isCobraUsageError(err):
		return ExitUsage
	case errors.As(err, &ae):
		return ExitAuth
	case errors.As(err, &unreachable):
		return ExitUnreachable
	case errors.Is(err, errdefs.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, errdefs.ErrUnauthenticated), errors.Is(err, errdefs.ErrPermissionDenied):
		return ExitAuth
	}
	return ExitError
}

// isCobraUsageError recognises the errors cobra itself returns for
// command lines it cannot route (they carry no type).
func isCobraUsageError(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") || strings.HasPrefix(msg, "invalid argument")
}

// reported is an error already printed; Run prints nothing more but exits
// with its code.
type reported struct{ error }

func (r reported) Unwrap() error { return r.error }

// printable reports whether err should be shown to the user.
func printable(err error) bool {
	var status exitStatus
	var done reported
	return !errors.As(err, &status) && !errors.As(err, &done) && !errors.Is(err, context.Canceled)
}
