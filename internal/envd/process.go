package envd

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/aenv-dev/aenv/api/envd/process"
)

// drainIdle is how long output readers keep reading after the process has
// exited. A background grandchild may hold the pipe open forever, so EOF is
// not a reliable end; an idle pipe after exit is.
const drainIdle = 50 * time.Millisecond

// errProcessEnded is returned when subscribing to a process that has ended.
var errProcessEnded = errors.New("process has ended")

// process is one command started through Start. Its output fans out to every
// subscribed stream; a process outlives the streams watching it.
type process struct {
	pid    uint32
	info   *pb.ProcessInfo
	cmd    *exec.Cmd
	stdin  io.WriteCloser // nil unless the request asked for stdin
	pty    *os.File       // nil unless started with a PTY
	outs   []*os.File     // read ends of stdout/stderr, or the PTY master
	exited chan struct{}  // closed once the process has been waited for

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	ended bool
}

// subscriber is one stream watching a process. gone is closed when the
// stream goes away, so publishing never blocks on a dead client.
type subscriber struct {
	events chan *pb.ProcessEvent
	gone   chan struct{}
	once   sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{events: make(chan *pb.ProcessEvent, 16), gone: make(chan struct{})}
}

func (s *subscriber) close() { s.once.Do(func() { close(s.gone) }) }

func (p *process) subscribe() (*subscriber, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, errProcessEnded
	}
	sub := newSubscriber()
	p.subs[sub] = struct{}{}
	return sub, nil
}

func (p *process) unsubscribe(sub *subscriber) {
	sub.close()
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
}

// publish hands ev to every current subscriber. It blocks on slow
// subscribers, which back-pressures the process through its pipe rather
// than dropping output.
func (p *process) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// finish publishes the end event; no subscriber can join after it.
func (p *process) finish(end *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
}

// signal sends sig to the process group: processes run in their own group
// (or session, for a PTY), so this also reaches what the shell started.
func (p *process) signal(sig syscall.Signal) error {
	err := syscall.Kill(-int(p.pid), sig)
	if errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(int(p.pid), sig)
	}
	return err
}

// readOutput copies one output stream into data events until EOF, or until
// the process has exited and the stream stays idle for drainIdle.
func (p *process) readOutput(f *os.File, wrap func([]byte) *pb.ProcessEvent_DataEvent) {
	buf := make([]byte, 32*1024)
	for {
		began := time.Now()
		n, err := f.Read(buf)
		if n > 0 {
			data := make([]byte, n)
			copy(data, buf[:n])
			p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: wrap(data)}})
			select {
			case <-p.exited:
				_ = f.SetReadDeadline(time.Now().Add(drainIdle))
			default:
			}
		}
		if err != nil {
			// The deadline may pass before this goroutine ran at all (a busy
			// sandbox); output written before the exit is still in the pipe
			// then, and must not be lost. A terminal's output reaches its
			// master asynchronously (the kernel's flip buffer), where
			// pending bytes do not show yet: the stream ends only once this
			// reader itself has waited drainIdle for more.
			if errors.Is(err, os.ErrDeadlineExceeded) && (pendingBytes(f) > 0 || time.Since(began) < drainIdle) {
				_ = f.SetReadDeadline(time.Now().Add(drainIdle))
				continue
			}
			return
		}
	}
}

// pendingBytes is how many bytes are buffered for reading in f (FIONREAD,
// spelled TIOCINQ on Linux),
// 0 if unknown.
func pendingBytes(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil {
			n = v
		}
	})
	return n
}

// endEventFor describes how the process ended the way upstream envd does:
// `exit status N` or `signal: killed`, with error set unless it exited 0.
func endEventFor(state *os.ProcessState, waitErr error) *pb.ProcessEvent_EndEvent {
	if state == nil {
		msg := "unknown"
		if waitErr != nil {
			msg = waitErr.Error()
		}
		return &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: msg, Error: &msg}
	}
	status := state.String()
	end := &pb.ProcessEvent_EndEvent{
		ExitCode: int32(state.ExitCode()),
		Exited:   state.Exited(),
		Status:   status,
	}
	if !state.Success() {
		end.Error = &status
	}
	return end
}

func stdoutEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func stderrEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
}

func ptyEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
}
