package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
)

// ProcessSpec describes one process to start.
type ProcessSpec struct {
	Cmd  string
	Args []string
	Envs map[string]string
	Cwd  string // "" = the user's home (or envd's default workdir)
	User string // "" = envd's default user
	// Timeout is how long envd lets the process run before killing it;
	// 0 is no limit. A deadline on the caller's context comes first.
	Timeout time.Duration
	// PTY runs the process in a pseudo-terminal of this size; nil gives it
	// pipes. Terminal output arrives as stdout.
	PTY *PTYSize
	// Stdin keeps the process's stdin open for SendInput (pipes only).
	Stdin bool
	// KillOnCancel kills the process when the caller's context ends first.
	// Without it the process runs on: envd keeps the processes of clients
	// that went away, as E2B's does.
	KillOnCancel bool
}

// PTYSize is a terminal's size in characters.
type PTYSize struct{ Cols, Rows uint32 }

// Output is where a process's streams go; a nil writer discards.
type Output struct {
	Stdout, Stderr io.Writer
}

// Exit is how a process ended, as envd reports it.
type Exit struct {
	Code   int    // the exit code; -1 when a signal ended the process
	Exited bool   // false when a signal ended it
	Status string // e.g. "exit status 1", "signal: killed"
}

// signalExitCodes gives the shell's 128+N for the signals envd names in
// its "signal: ..." status.
var signalExitCodes = map[string]int{
	"hangup": 129, "interrupt": 130, "quit": 131, "aborted": 134, "killed": 137,
	"segmentation fault": 139, "broken pipe": 141, "terminated": 143,
}

// ShellCode is the code a shell would report: the exit code, or 128+N for
// a process ended by signal N.
func (e Exit) ShellCode() int {
	if e.Exited {
		return e.Code
	}
	if name, ok := strings.CutPrefix(e.Status, "signal: "); ok {
		if code, ok := signalExitCodes[name]; ok {
			return code
		}
	}
	if e.Code > 0 {
		return e.Code
	}
	return 1
}

// Process is a process started by Start. Wait streams its output until it
// ends; the other methods act on it meanwhile.
type Process struct {
	c      *Client
	stream *connect.ServerStreamForClient[pb.StartResponse]
	tty    bool
	kill   bool // KillOnCancel

	// cancel ends the stream; stopAfter unregisters the cancel-on-ctx hook.
	cancel    context.CancelFunc
	stopAfter func() bool

	mu        sync.Mutex
	pid       uint32
	cancelled bool // the caller's context ended
}

// Start starts a process and returns once envd has reported its PID.
func (c *Client) Start(ctx context.Context, spec ProcessSpec) (*Process, error) {
	creq := connect.NewRequest(startRequest(spec))
	creq.Header().Set("Keepalive-Ping-Interval", "30")
	if spec.User != "" {
		creq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(spec.User+":")))
	}
	if timeout := processTimeout(ctx, spec.Timeout); timeout > 0 {
		creq.Header().Set("Connect-Timeout-Ms", strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	// connect-go turns a context deadline into its own Connect-Timeout-Ms
	// header; ours is set above, so the stream gets a context with
	// cancellation but without the deadline.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Process{c: c, tty: spec.PTY != nil, kill: spec.KillOnCancel, cancel: cancel}
	p.stopAfter = context.AfterFunc(ctx, p.onCancel)

	stream, err := c.process.Start(streamCtx, creq)
	if err != nil {
		p.close()
		return nil, fmt.Errorf("start process: %w", connectError(err))
	}
	p.stream = stream
	if !stream.Receive() {
		err := stream.Err()
		if err == nil {
			err = errors.New("stream closed")
		}
		p.close()
		return nil, fmt.Errorf("start process: %w", connectError(err))
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		p.close()
		return nil, errors.New("start process: envd sent no start event")
	}
	p.mu.Lock()
	p.pid = pid
	cancelled := p.cancelled
	p.mu.Unlock()
	if cancelled && p.kill {
		p.killNow()
	}
	return p, nil
}

func startRequest(spec ProcessSpec) *pb.StartRequest {
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: spec.Cmd, Args: spec.Args, Envs: spec.Envs}}
	if spec.Cwd != "" {
		req.Process.Cwd = &spec.Cwd
	}
	if spec.PTY != nil {
		cols, rows := spec.PTY.Cols, spec.PTY.Rows
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		req.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: cols, Rows: rows}}
	} else if spec.Stdin {
		stdin := true
		req.Stdin = &stdin
	}
	return req
}

// processTimeout is the deadline envd enforces: the spec's timeout, or
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

// onCancel runs when the caller's context ends: it kills the process if
// asked to (before the stream goes, so the kill is not lost with it), then
// ends the stream.
func (p *Process) onCancel() {
	p.mu.Lock()
	p.cancelled = true
	pid := p.pid
	p.mu.Unlock()
	if pid != 0 && p.kill {
		p.killNow()
	}
	p.cancel()
}

func (p *Process) close() {
	p.stopAfter()
	if p.stream != nil {
		p.stream.Close()
	}
	p.cancel()
}

// PID is the process's ID inside the sandbox.
func (p *Process) PID() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Wait copies the process's output to out until it ends and returns how
// it ended. When the caller's context ends first, Wait returns an error
// wrapping connect's Canceled code; the caller's ctx.Err() tells why.
func (p *Process) Wait(out Output) (Exit, error) {
	defer p.close()
	var end *pb.ProcessEvent_EndEvent
	for p.stream.Receive() {
		ev := p.stream.Msg().GetEvent()
		if e := ev.GetEnd(); e != nil {
			end = e
		}
		if data := ev.GetData(); data != nil {
			if err := writeData(data, out); err != nil {
				return Exit{}, fmt.Errorf("write output: %w", err)
			}
		}
	}
	if err := p.stream.Err(); err != nil {
		return Exit{}, fmt.Errorf("process output: %w", connectError(err))
	}
	if end == nil {
		return Exit{}, errors.New("process output: the stream ended without the process's exit status")
	}
	return Exit{Code: int(end.GetExitCode()), Exited: end.GetExited(), Status: end.GetStatus()}, nil
}

func writeData(data *pb.ProcessEvent_DataEvent, out Output) error {
	var w io.Writer
	var b []byte
	switch d := data.GetOutput().(type) {
	case *pb.ProcessEvent_DataEvent_Stdout:
		w, b = out.Stdout, d.Stdout
	case *pb.ProcessEvent_DataEvent_Pty:
		w, b = out.Stdout, d.Pty
	case *pb.ProcessEvent_DataEvent_Stderr:
		w, b = out.Stderr, d.Stderr
	}
	if w == nil || len(b) == 0 {
		return nil
	}
	_, err := w.Write(b)
	return err
}

func (p *Process) selector() *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: p.PID()}}
}

// SendInput writes data to the process's stdin, or its terminal.
func (p *Process) SendInput(ctx context.Context, data []byte) error {
	in := &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: data}}
	if p.tty {
		in.Input = &pb.ProcessInput_Pty{Pty: data}
	}
	_, err := p.c.process.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: p.selector(), Input: in}))
	if err != nil {
		return fmt.Errorf("send input: %w", connectError(err))
	}
	return nil
}

// CloseStdin closes the process's stdin (pipes only): it reads EOF.
func (p *Process) CloseStdin(ctx context.Context) error {
	_, err := p.c.process.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: p.selector()}))
	if err != nil {
		return fmt.Errorf("close stdin: %w", connectError(err))
	}
	return nil
}

// Resize sets the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, size PTYSize) error {
	_, err := p.c.process.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: p.selector(),
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: size.Cols, Rows: size.Rows}}}))
	if err != nil {
		return fmt.Errorf("resize terminal: %w", connectError(err))
	}
	return nil
}

// Kill sends SIGKILL.
func (p *Process) Kill(ctx context.Context) error {
	_, err := p.c.process.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: p.selector(), Signal: pb.Signal_SIGNAL_SIGKILL}))
	if err != nil {
		return fmt.Errorf("kill process: %w", connectError(err))
	}
	return nil
}

// killNow kills with its own short deadline: it runs once the caller's
// context has ended.
func (p *Process) killNow() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.Kill(ctx)
}

// CopyInput forwards r to the process until r ends or ctx does; at the
// end of r it closes a piped stdin, so the process reads EOF. It returns
// the first error.
func (p *Process) CopyInput(ctx context.Context, r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := p.SendInput(ctx, append([]byte(nil), buf[:n]...)); serr != nil {
				return serr
			}
		}
		if err != nil {
			if !p.tty && ctx.Err() == nil {
				return p.CloseStdin(ctx)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read input: %w", err)
		}
	}
}

// FollowResizes applies each size from sizes to the terminal until ctx
// ends.
func (p *Process) FollowResizes(ctx context.Context, sizes <-chan PTYSize) {
	for {
		select {
		case <-ctx.Done():
			return
		case size := <-sizes:
			_ = p.Resize(ctx, size)
		}
	}
}
