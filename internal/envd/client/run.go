package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
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
	start := &pb.StartRequest{Process: &pb.ProcessConfig{
		Cmd:  "/bin/bash",
		Args: []string{"-l", "-c", req.Command},
		Envs: req.Envs,
	}}
	if req.Cwd != "" {
		start.Process.Cwd = &req.Cwd
	}
	creq := connect.NewRequest(start)
	if token := c.accessToken(); token != "" {
		creq.Header().Set("X-Access-Token", token)
	}
	if req.User != "" {
		creq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(req.User+":")))
	}
	creq.Header().Set("Keepalive-Ping-Interval", "30")
	if timeout := processTimeout(ctx, req.Timeout); timeout > 0 {
		creq.Header().Set("Connect-Timeout-Ms", strconv.FormatInt(timeout.Milliseconds(), 10))
	}

	// connect-go turns a context deadline into its own Connect-Timeout-Ms
	// header; ours is set above, so hand it a context with cancellation
	// but without the deadline.
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopAfter := context.AfterFunc(ctx, cancel)
	defer stopAfter()

	began := time.Now()
	stream, err := c.process.Start(callCtx, creq)
	if err != nil {
		return RunResult{}, fmt.Errorf("envd run: %w", connectError(err))
	}
	defer stream.Close()
	out := &collector{max: maxOut}
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if data := ev.GetData(); data != nil {
			out.add(data)
		}
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	res := RunResult{Stdout: out.stdout, Stderr: out.stderr, Truncated: out.truncated}
	if err := stream.Err(); err != nil {
		if connect.CodeOf(err) == connect.CodeDeadlineExceeded && req.Timeout > 0 && ctx.Err() == nil {
			res.ExitCode, res.TimedOut = -1, true
			return res, nil
		}
		if ctx.Err() != nil {
			return res, fmt.Errorf("envd run: %w", ctx.Err())
		}
		return res, fmt.Errorf("envd run: %w", connectError(err))
	}
	if end == nil {
		return res, errors.New("envd run: process ended without a result")
	}
	res.ExitCode = int(end.GetExitCode())
	res.TimedOut = !end.GetExited() && req.Timeout > 0 && time.Since(began) >= req.Timeout-timeoutSlack
	return res, nil
}

// processTimeout is the deadline envd enforces: the request's timeout, or
// what is left of the caller's deadline when that comes first.
func processTimeout(ctx context.Context, timeout time.Duration) time.Duration {
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if left <= 0 {
			left = time.Millisecond
		}
		if timeout <= 0 || left < timeout {
			return left
		}
	}
	return timeout
}

// collector accumulates output up to max bytes per stream.
type collector struct {
	max            int
	stdout, stderr []byte
	truncated      bool
}

func (c *collector) add(data *pb.ProcessEvent_DataEvent) {
	switch out := data.GetOutput().(type) {
	case *pb.ProcessEvent_DataEvent_Stdout:
		c.stdout = c.appendCapped(c.stdout, out.Stdout)
	case *pb.ProcessEvent_DataEvent_Stderr:
		c.stderr = c.appendCapped(c.stderr, out.Stderr)
	case *pb.ProcessEvent_DataEvent_Pty:
		c.stdout = c.appendCapped(c.stdout, out.Pty)
	}
}

func (c *collector) appendCapped(buf, data []byte) []byte {
	room := c.max - len(buf)
	if len(data) > room {
		c.truncated = true
		data = data[:max(room, 0)]
	}
	return append(buf, data...)
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
