package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
)

// runProcess starts spec in the sandbox, forwards stdin (with -i or a
// terminal) and resizes, streams the output as it comes and returns the
// shell's exit code. When ctx ends first the process is killed and the
// code is 130, as for a shell's Ctrl-C.
func runProcess(ctx context.Context, envd *envdclient.Client, spec envdclient.ProcessSpec, stdin io.Reader,
	out envdclient.Output, resizes <-chan envdclient.PTYSize) (int, error) {
	spec.KillOnCancel = true
	proc, err := envd.Start(ctx, spec)
	if err != nil {
		if ctx.Err() != nil {
			return 130, nil
		}
		return 0, envdError(err)
	}
	pumpCtx, stopPumps := context.WithCancel(ctx)
	defer stopPumps()
	if (spec.PTY != nil || spec.Stdin) && stdin != nil {
		go func() { _ = proc.CopyInput(pumpCtx, stdin) }()
	}
	if spec.PTY != nil && resizes != nil {
		go proc.FollowResizes(pumpCtx, resizes)
	}
	exit, err := proc.Wait(out)
	if interrupted(ctx) || ctxDeadlineSeenFirst(ctx, err, spec) {
		return 130, nil
	}
	if err != nil {
		// At the process's deadline envd kills it and ends the stream
		// with deadline_exceeded (as E2B's does), without an exit status:
		// report the SIGKILL it was, as a shell would (128+9).
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded && spec.Timeout > 0 {
			return 137, nil
		}
		return 0, envdError(err)
	}
	return exit.ShellCode(), nil
}

// interrupted reports whether ctx has ended. Its deadline counts as soon
// as it passes: Connect sends the deadline along, so the sandbox may end
// the process (and the stream) a moment before the local timer fires.
func interrupted(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ctxDeadlineSeenFirst reports whether err is ctx's deadline, ended by
// the sandbox a moment before the local timer: Connect sends the time left
// in whole milliseconds, rounded down, so the sandbox's copy of the
// deadline can fire first. Without a process timeout of its own
// (spec.Timeout), deadline_exceeded can be no other deadline's.
func ctxDeadlineSeenFirst(ctx context.Context, err error, spec envdclient.ProcessSpec) bool {
	_, ok := ctx.Deadline()
	return ok && spec.Timeout == 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded
}

// envdError gives an envd failure this CLI's exit codes.
func envdError(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return authError{fmt.Errorf("the sandbox refused its access token: %w", err)}
	case connect.CodeNotFound:
		return &client.APIError{Status: http.StatusNotFound, Message: err.Error()}
	case connect.CodeUnavailable:
		return fmt.Errorf("the sandbox is not reachable (paused or gone?): %w", err)
	case connect.CodeCanceled:
		return fmt.Errorf("%w: %w", context.Canceled, err)
	}
	return err
}
