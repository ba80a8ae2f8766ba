package envd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
)

// defaultKeepalive applies when a stream has no Keepalive-Ping-Interval.
const defaultKeepalive = 90 * time.Second

// processService implements process.Process.
type processService struct {
	processconnect.UnimplementedProcessHandler
	srv *Server

	mu    sync.Mutex
	byPID map[uint32]*process
}

func newProcessService(srv *Server) *processService {
	return &processService{srv: srv, byPID: map[uint32]*process{}}
}

func (ps *processService) log() *slog.Logger { return ps.srv.log }

// Start runs a process and streams its events. The process deadline is the
// call's Connect-Timeout-Ms; a disconnecting client does not kill it.
func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	user, err := ps.srv.userFromBasicAuth(req.Header())
	if err != nil {
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	p, err := ps.srv.spawn(req.Msg, user)
	if err != nil {
		// The sandbox's log says why (never the arguments or environment:
		// they may hold secrets; nor the error's text, which repeats the
		// command, when the system's reason says it all).
		reason := err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			reason = errno.Error()
		}
		ps.log().Warn("process start failed", "cmd", req.Msg.GetProcess().GetCmd(), "user", user.Name, "err", reason)
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	// Subscribe before any output can be read so Start sees all of it.
	sub, _ := p.subscribe()
	defer p.unsubscribe(sub)
	ps.track(p, ctx)
	ps.log().Info("process started", "pid", p.pid, "cmd", req.Msg.GetProcess().GetCmd(), "user", user.Name)

	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := send(start); err != nil {
		return err
	}
	return streamEvents(ctx, sub, keepaliveInterval(req.Header().Get("Keepalive-Ping-Interval")), send)
}

// Connect attaches to a running process. Earlier output is not replayed.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, err := p.subscribe()
	if err != nil {
		return connect.NewError(connect.CodeNotFound, err)
	}
	defer p.unsubscribe(sub)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := send(start); err != nil {
		return err
	}
	return streamEvents(ctx, sub, keepaliveInterval(req.Header().Get("Keepalive-Ping-Interval")), send)
}

// track registers p, arms its deadline kill, and reaps it in the background.
func (ps *processService) track(p *process, ctx context.Context) {
	ps.mu.Lock()
	ps.byPID[p.pid] = p
	ps.mu.Unlock()

	var kill *time.Timer
	if deadline, ok := ctx.Deadline(); ok {
		kill = time.AfterFunc(time.Until(deadline), func() {
			ps.log().Info("process deadline reached, killing", "pid", p.pid)
			_ = p.signal(syscall.SIGKILL)
		})
	}
	var readers sync.WaitGroup
	wraps := []func([]byte) *pb.ProcessEvent_DataEvent{stdoutEvent, stderrEvent}
	if p.pty != nil {
		wraps = []func([]byte) *pb.ProcessEvent_DataEvent{ptyEvent}
	}
	for i, f := range p.outs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			p.readOutput(f, wraps[i])
		}()
	}
	go func() {
		waitErr := ps.srv.children.Wait(p.cmd)
		if kill != nil {
			kill.Stop()
		}
		close(p.exited)
		for _, f := range p.outs {
			_ = f.SetReadDeadline(time.Now().Add(drainIdle))
		}
		readers.Wait()
		for _, f := range p.outs {
			f.Close()
		}
		end := endEventFor(p.cmd.ProcessState, waitErr)
		ps.mu.Lock()
		delete(ps.byPID, p.pid)
		ps.mu.Unlock()
		ps.log().Info("process ended", "pid", p.pid, "status", end.GetStatus())
		p.finish(end)
	}()
}

// streamEvents forwards a subscriber's events with keepalives until the end
// event. When the call's deadline passes first it ends the stream with
// Connect's deadline_exceeded, as E2B's envd does: the SDKs raise their
// timeout error on that code, never on an end event. (For Start the
// process is being killed at that same deadline; see track.)
func streamEvents(ctx context.Context, sub *subscriber, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	ticker := time.NewTicker(keepalive)
	defer ticker.Stop()
	for {
		select {
		case ev := <-sub.events:
			if err := callEnded(ctx); err != nil {
				// The deadline passed as the event came (for Start, the
				// deadline's kill ends the process): the deadline answers,
				// never an end event after it.
				return err
			}
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-ticker.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return callEnded(ctx)
		}
	}
}

// callEnded is a stream's error once its call has ended, nil before:
// Connect's deadline_exceeded once its deadline has passed, read from the
// clock (the context's own timer may not have fired yet on a busy
// machine, while the deadline's kill has ended the process).
func callEnded(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (ok && !time.Now().Before(deadline)) {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call's deadline passed"))
	}
	return ctx.Err()
}

func keepaliveInterval(header string) time.Duration {
	secs, err := strconv.Atoi(header)
	if err != nil || secs <= 0 {
		return defaultKeepalive
	}
	return time.Duration(secs) * time.Second
}

// find resolves a selector (pid or tag) to a running process.
func (ps *processService) find(sel *pb.ProcessSelector) (*process, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := ps.byPID[s.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range ps.byPID {
			if p.info.GetTag() == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is empty"))
}

func (ps *processService) List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := &pb.ListResponse{}
	for _, p := range ps.byPID {
		out.Processes = append(out.Processes, p.info)
	}
	return connect.NewResponse(out), nil
}

func (ps *processService) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := writeInput(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// writeInput sends stdin or PTY bytes to p.
func writeInput(p *process, in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.pty == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no pty"))
		}
		if _, err := p.pty.Write(v.Pty); err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("write pty: %w", err))
		}
	case *pb.ProcessInput_Stdin:
		if p.pty != nil {
			if _, err := p.pty.Write(v.Stdin); err != nil {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("write pty: %w", err))
			}
			return nil
		}
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("process was started without stdin"))
		}
		if _, err := p.stdin.Write(v.Stdin); err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write stdin: %w", err))
		}
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is empty"))
	}
	return nil
}

func (ps *processService) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close stdin of a pty process; send Ctrl-D instead"))
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process was started without stdin"))
	}
	if err := p.stdin.Close(); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("close stdin: %w", err))
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (ps *processService) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes the process's PTY.
func (ps *processService) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetPty() == nil {
		return connect.NewResponse(&pb.UpdateResponse{}), nil
	}
	if p.pty == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no pty"))
	}
	size := req.Msg.GetPty().GetSize()
	ws := &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}
	if err := pty.Setsize(p.pty, ws); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize pty: %w", err))
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// StreamInput is the client-streaming input path: a start event selects
// the process, data events carry input.
func (ps *processService) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("input before start event"))
			}
			if err := writeInput(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// killAll ends every process; used when envd shuts down.
func (ps *processService) killAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.byPID {
		_ = p.signal(syscall.SIGKILL)
	}
}
