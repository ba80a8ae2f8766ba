package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
)

// envd requests go to the server, which proxies every request marked with
// the sandbox's ID to that sandbox's envd. The API key is not sent: it
// would travel into the sandbox; envd's own access token authenticates.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerAccessToken = "X-Access-Token"
)

// headerDoer adds fixed headers to every request of a Connect client.
type headerDoer struct {
	http   *http.Client
	header http.Header
}

func (d headerDoer) Do(req *http.Request) (*http.Response, error) {
	for k, v := range d.header {
		req.Header[k] = v
	}
	return d.http.Do(req)
}

// processClient talks to the envd of sandbox id through the server.
func (c *Client) processClient(id, accessToken string) processconnect.ProcessClient {
	h := http.Header{}
	h.Set(headerSandboxID, id)
	if accessToken != "" {
		h.Set(headerAccessToken, accessToken)
	}
	return processconnect.NewProcessClient(headerDoer{http: c.http, header: h}, c.baseURL)
}

// processSpec is one process to run in a sandbox.
type processSpec struct {
	cmd        string
	args       []string
	envs       map[string]string
	cwd        string
	user       string
	tty        bool // a pseudo-terminal; input and output are its bytes
	stdin      bool // forward our stdin (pipe mode)
	cols, rows uint32
	timeout    time.Duration // 0: none
}

// processIO is where a remote process's streams go.
type processIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// resizes delivers new terminal sizes (tty only); nil when there is no
	// terminal to watch.
	resizes <-chan [2]uint32
}

// runProcess starts spec in the sandbox, streams its output as it comes and
// returns its exit code. When ctx ends first the process is killed and the
// code is 130, as for a shell's Ctrl-C.
func runProcess(ctx context.Context, pc processconnect.ProcessClient, spec processSpec, pio processIO) (int, error) {
	creq := connect.NewRequest(startRequest(spec))
	creq.Header().Set("Keepalive-Ping-Interval", "30")
	if spec.user != "" {
		creq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(spec.user+":")))
	}
	if spec.timeout > 0 {
		creq.Header().Set("Connect-Timeout-Ms", strconv.FormatInt(spec.timeout.Milliseconds(), 10))
	}
	streamCtx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStream()
	stream, err := pc.Start(streamCtx, creq)
	if err != nil {
		return 0, envdError("start process", err)
	}
	defer stream.Close()
	if !stream.Receive() {
		return 0, envdError("start process", streamErr(stream.Err()))
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		return 0, errors.New("start process: envd sent no start event")
	}
	proc := remoteProc{client: pc, pid: pid, tty: spec.tty}
	pumpCtx, stopPumps := context.WithCancel(ctx)
	defer stopPumps()
	if spec.tty || spec.stdin {
		go proc.pumpInput(pumpCtx, pio.stdin)
	}
	if spec.tty && pio.resizes != nil {
		go proc.followResizes(pumpCtx, pio.resizes)
	}
	stopKill := context.AfterFunc(ctx, func() { proc.kill(); cancelStream() })
	defer stopKill()

	end, err := receiveOutput(stream, pio)
	if ctx.Err() != nil {
		return 130, nil
	}
	if err != nil {
		return 0, err
	}
	return exitCodeOfEnd(end), nil
}

func startRequest(spec processSpec) *pb.StartRequest {
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: spec.cmd, Args: spec.args, Envs: spec.envs}}
	if spec.cwd != "" {
		req.Process.Cwd = &spec.cwd
	}
	if spec.tty {
		cols, rows := spec.cols, spec.rows
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		req.Pty = &pb.PTY{Size: &pb.PTY_Size{Cols: cols, Rows: rows}}
	} else {
		stdin := spec.stdin
		req.Stdin = &stdin
	}
	return req
}

// receiveOutput copies data events to our streams until the end event.
func receiveOutput(stream *connect.ServerStreamForClient[pb.StartResponse], pio processIO) (*pb.ProcessEvent_EndEvent, error) {
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if e := ev.GetEnd(); e != nil {
			end = e
		}
		data := ev.GetData()
		if data == nil {
			continue
		}
		var err error
		switch out := data.GetOutput().(type) {
		case *pb.ProcessEvent_DataEvent_Stdout:
			_, err = pio.stdout.Write(out.Stdout)
		case *pb.ProcessEvent_DataEvent_Pty:
			_, err = pio.stdout.Write(out.Pty)
		case *pb.ProcessEvent_DataEvent_Stderr:
			_, err = pio.stderr.Write(out.Stderr)
		}
		if err != nil {
			return nil, fmt.Errorf("write output: %w", err)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, envdError("process output", streamErr(err))
	}
	if end == nil {
		return nil, errors.New("process output: the stream ended without the process's exit status")
	}
	return end, nil
}

func streamErr(err error) error {
	if err == nil {
		return errors.New("stream closed")
	}
	return err
}

// signalExitCodes gives the shell's 128+N for the signals envd names in
// its "signal: ..." status.
var signalExitCodes = map[string]int{
	"hangup": 129, "interrupt": 130, "quit": 131, "aborted": 134, "killed": 137,
	"segmentation fault": 139, "broken pipe": 141, "terminated": 143,
}

func exitCodeOfEnd(end *pb.ProcessEvent_EndEvent) int {
	if end.GetExited() {
		return int(end.GetExitCode())
	}
	if name, ok := strings.CutPrefix(end.GetStatus(), "signal: "); ok {
		if code, ok := signalExitCodes[name]; ok {
			return code
		}
	}
	if code := int(end.GetExitCode()); code > 0 {
		return code
	}
	return 1
}

// envdError turns a Connect error into one with this CLI's exit codes.
func envdError(op string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return authError{fmt.Errorf("%s: the sandbox refused its access token: %w", op, err)}
	case connect.CodeNotFound:
		return &APIError{Status: http.StatusNotFound, Message: fmt.Sprintf("%s: %v", op, err)}
	case connect.CodeUnavailable:
		return fmt.Errorf("%s: the sandbox is not reachable (paused or gone?): %w", op, err)
	case connect.CodeCanceled:
		return fmt.Errorf("%s: %w", op, context.Canceled)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// remoteProc is a started process, for input, resizes and signals.
type remoteProc struct {
	client processconnect.ProcessClient
	pid    uint32
	tty    bool
}

func (p remoteProc) selector() *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: p.pid}}
}

// pumpInput forwards r to the process until EOF or ctx ends; at EOF in
// pipe mode it closes the process's stdin.
func (p remoteProc) pumpInput(ctx context.Context, r io.Reader) {
	if r == nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			in := &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}
			if p.tty {
				in.Input = &pb.ProcessInput_Pty{Pty: append([]byte(nil), buf[:n]...)}
			}
			if _, serr := p.client.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: p.selector(), Input: in})); serr != nil {
				return
			}
		}
		if err != nil {
			if !p.tty && ctx.Err() == nil {
				_, _ = p.client.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: p.selector()}))
			}
			return
		}
	}
}

func (p remoteProc) followResizes(ctx context.Context, sizes <-chan [2]uint32) {
	for {
		select {
		case <-ctx.Done():
			return
		case size := <-sizes:
			_, _ = p.client.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: p.selector(),
				Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: size[0], Rows: size[1]}}}))
		}
	}
}

// kill sends SIGKILL, with its own short deadline: it runs after the
// caller's context has ended.
func (p remoteProc) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = p.client.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: p.selector(), Signal: pb.Signal_SIGNAL_SIGKILL}))
}
