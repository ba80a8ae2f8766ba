package client

import (
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
)

// defaultMaxOutput caps each of stdout and stderr when RunRequest says 0.
const defaultMaxOutput = 64 << 20

// timeoutSlack absorbs the gap between our clock and envd's when deciding
// whether a killed process hit its deadline.
const timeoutSlack = 100 * time.Millisecond

// RunRequest describes one command run to completion.
type RunRequest struct {
	Command        string // run as /bin/bash -l -c Command
	Cwd            string
	Envs           map[string]string
	User           string        // "" = envd's default user
	Timeout        time.Duration // 0 = none; at expiry envd kills the process
	MaxOutputBytes int           // per stream; 0 = 64 MiB. Beyond it output is dropped.
	// Stdout and Stderr, when set, receive that stream as it arrives
	// instead of the result keeping it (MaxOutputBytes then does not
	// apply to it): a writer that blocks paces the command, and one that
	// fails ends the run with its error.
	Stdout, Stderr io.Writer
}

// RunResult is how a command ended and what it printed.
type RunResult struct {
	ExitCode  int // -1 when killed by a signal
	Stdout    []byte
	Stderr    []byte
	TimedOut  bool
	Truncated bool
}

// Run starts req.Command through envd's process.Start and waits for it. A
// non-zero exit (127 for a missing command) is a result, not an error.
func (c *Client) Run(ctx context.Context, req RunRequest) (RunResult, error) {
	maxOut := req.MaxOutputBytes
	if maxOut <= 0 {
		maxOut = defaultMaxOutput
	}
	began := time.Now()
	p, err := c.Start(ctx, ProcessSpec{Cmd: "/bin/bash", Args: []string{"-l", "-c", req.Command},
		Envs: req.Envs, Cwd: req.Cwd, User: req.User, Timeout: req.Timeout})
	if err != nil {
		return runFailed(ctx, req, RunResult{}, err)
	}
	var truncated bool
	stdout := &cappedBuffer{max: maxOut, truncated: &truncated}
	stderr := &cappedBuffer{max: maxOut, truncated: &truncated}
	out := Output{Stdout: stdout, Stderr: stderr}
	if req.Stdout != nil {
		out.Stdout = req.Stdout
	}
	if req.Stderr != nil {
		out.Stderr = req.Stderr
	}
	exit, err := p.Wait(out)
	res := RunResult{Stdout: stdout.buf, Stderr: stderr.buf, Truncated: truncated}
	if err != nil {
		return runFailed(ctx, req, res, err)
	}
	res.ExitCode = exit.Code
	res.TimedOut = !exit.Exited && req.Timeout > 0 && time.Since(began) >= req.Timeout-timeoutSlack
	return res, nil
}

// runFailed tells a command that hit its own timeout (a result) from a
// caller that gave up and from a failure (errors).
func runFailed(ctx context.Context, req RunRequest, res RunResult, err error) (RunResult, error) {
	switch {
	case connect.CodeOf(err) == connect.CodeDeadlineExceeded && req.Timeout > 0 && ctx.Err() == nil:
		res.ExitCode, res.TimedOut = -1, true
		return res, nil
	case ctx.Err() != nil:
		return res, fmt.Errorf("envd run: %w", ctx.Err())
	}
	return res, fmt.Errorf("envd run: %w", err)
}

// cappedBuffer keeps up to max bytes and drops the rest, noting it.
type cappedBuffer struct {
	max       int
	buf       []byte
	truncated *bool
}

func (b *cappedBuffer) Write(data []byte) (int, error) {
	n := len(data)
	room := b.max - len(b.buf)
	if len(data) > room {
		*b.truncated = true
		data = data[:max(room, 0)]
	}
	b.buf = append(b.buf, data...)
	return n, nil
}

// connectError wraps a Connect error in the matching sentinel.
func connectError(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case connect.CodeInvalidArgument:
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	case connect.CodeUnauthenticated:
		return fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	return err
}
