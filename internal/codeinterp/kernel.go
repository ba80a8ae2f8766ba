package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// The Python programs kernels run: pythonDriver for Python contexts (see
// kernel.py), bashDriver for bash ones (kernel_bash.py). Both speak the
// same protocol with the service.
var (
	//go:embed kernel.py
	pythonDriver string
	//go:embed kernel_bash.py
	bashDriver string
)

// maxEventBytes bounds one event line from a kernel (a large image is one
// line); a longer line is dropped whole, with a note on stderr.
const maxEventBytes = 64 << 20

// event is the part of a kernel's event line the service looks at.
type event struct {
	Type           string `json:"type"`
	ExecutionCount int    `json:"execution_count"`
}

// execution receives the lines of the one execution a kernel runs.
type execution struct {
	lines chan []byte
	stop  chan struct{} // closed when the execution stops reading
}

// kernel is one running Python process.
type kernel struct {
	cmd    *exec.Cmd
	reqs   *os.File
	ready  chan struct{} // closed at the "ready" event
	exited chan struct{} // closed once the process is reaped
	once   sync.Once

	mu      sync.Mutex
	current *execution
	// idleErr keeps the tail of what the kernel wrote to stderr outside an
	// execution: why it failed to start, if it did.
	idleErr []byte
	waitErr error
	// baseEnv is the sandbox env the kernel was last sent (see begin).
	baseEnv map[string]string
	// seeded is the Service's reseed count its random generators are
	// fresh for (see Service.Reseed).
	seeded uint64
}

// startKernel starts a kernel running driver (the source of a Python
// program) through children; prepare sets its user, env and directory. It
// returns once the kernel is ready to execute.
func startKernel(ctx context.Context, children Children, python, driver string, prepare func(*exec.Cmd) error) (*kernel, error) {
	cmd := exec.Command(python, "-c", driver)
	if err := prepare(cmd); err != nil {
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("kernel pipes: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, fmt.Errorf("kernel pipes: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(reqR, reqW, evR, evW)
		return nil, fmt.Errorf("kernel pipes: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(reqR, reqW, evR, evW, outR, outW)
		return nil, fmt.Errorf("kernel pipes: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = []*os.File{reqR, evW} // fd 3 and fd 4 of kernel.py
	err = children.Start(cmd, cmd.Start)
	// The child has its copies; ours must go so that reads see its end.
	closeAll(reqR, evW, outW, errW)
	if err != nil {
		closeAll(reqW, evR, outR, errR)
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	k := &kernel{cmd: cmd, reqs: reqW, ready: make(chan struct{}), exited: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Add(3)
	go func() { defer readers.Done(); k.readEvents(evR) }()
	go func() { defer readers.Done(); k.readRaw(outR, "stdout") }()
	go func() { defer readers.Done(); k.readRaw(errR, "stderr") }()
	go func() {
		// Wait closes nothing of ours; the readers end at the pipes' EOF,
		// which may come later than the exit when a child process of the
		// kernel keeps them open. Exit is what matters.
		err := children.Wait(cmd)
		k.mu.Lock()
		k.waitErr = err
		k.mu.Unlock()
		close(k.exited)
		k.reqs.Close()
		readers.Wait()
		closeAll(evR, outR, errR)
	}()
	select {
	case <-k.ready:
		return k, nil
	case <-k.exited:
		return nil, fmt.Errorf("kernel exited while starting (%v): %s", k.exitErr(), bytes.TrimSpace(k.stderrTail()))
	case <-ctx.Done():
		k.kill()
		return nil, fmt.Errorf("start kernel: %w", ctx.Err())
	}
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// readEvents reads the kernel's event lines and hands them to the running
// execution.
func (k *kernel) readEvents(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, tooLong, err := readLine(br, maxEventBytes)
		if tooLong {
			note, _ := json.Marshal(map[string]string{"type": "stderr",
				"text": fmt.Sprintf("[output of more than %d MiB dropped]\n", maxEventBytes>>20)})
			k.deliver(note)
		} else if len(line) > 0 {
			var ev event
			if json.Unmarshal(line, &ev) == nil && ev.Type == "ready" {
				k.once.Do(func() { close(k.ready) })
			} else {
				k.deliver(line)
			}
		}
		if err != nil {
			return
		}
	}
}

// readLine reads one line without its newline, up to max bytes; a longer
// line is consumed and reported as tooLong.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > max+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(line, []byte("\n")), tooLong, err
	}
}

// readRaw forwards what the kernel's processes write to a file descriptor
// (not through Python's sys.stdout) as that stream's output.
func (k *kernel) readRaw(r io.Reader, stream string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			line, _ := json.Marshal(map[string]string{"type": stream, "text": string(buf[:n])})
			if !k.deliver(line) && stream == "stderr" {
				k.keepIdleErr(buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

func (k *kernel) keepIdleErr(b []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.idleErr = append(k.idleErr, b...)
	if len(k.idleErr) > 4096 {
		k.idleErr = k.idleErr[len(k.idleErr)-4096:]
	}
}

func (k *kernel) stderrTail() []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]byte(nil), k.idleErr...)
}

func (k *kernel) exitErr() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.waitErr
}

// deliver hands line to the running execution; false when none runs.
func (k *kernel) deliver(line []byte) bool {
	k.mu.Lock()
	ex := k.current
	k.mu.Unlock()
	if ex == nil {
		return false
	}
	select {
	case ex.lines <- line:
		return true
	case <-ex.stop:
		return false
	}
}

// begin makes ex the running execution and sends the kernel its request:
// the code, env for this execution only, base, the sandbox's env vars,
// when they differ from what the kernel was last given (sent each time,
// they would undo the code's own changes to those variables), and whether
// to seed its random generators anew (reseeds, the Service's count, is
// past the kernel's).
func (k *kernel) begin(ex *execution, code string, env, base map[string]string, reseeds uint64) error {
	msg := map[string]any{"code": code, "env": env}
	k.mu.Lock()
	newBase := base != nil && !maps.Equal(base, k.baseEnv)
	reseed := reseeds > k.seeded
	k.mu.Unlock()
	if newBase {
		msg["base_env"] = base
	}
	if reseed {
		msg["reseed"] = true
	}
	req, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.current = ex
	if newBase {
		k.baseEnv = maps.Clone(base)
	}
	k.seeded = max(k.seeded, reseeds)
	k.mu.Unlock()
	if _, err := k.reqs.Write(append(req, '\n')); err != nil {
		k.end(ex)
		return fmt.Errorf("send to kernel: %w", err)
	}
	return nil
}

// end detaches ex: lines that come later are dropped.
func (k *kernel) end(ex *execution) {
	k.mu.Lock()
	if k.current == ex {
		k.current = nil
	}
	k.mu.Unlock()
	close(ex.stop)
}

// interrupt sends SIGINT: the running cell raises KeyboardInterrupt.
func (k *kernel) interrupt() {
	_ = k.cmd.Process.Signal(syscall.SIGINT)
}

// kill ends the kernel and what it started (its process group).
func (k *kernel) kill() {
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
	_ = k.cmd.Process.Kill()
	k.reqs.Close()
}

// alive tells whether the kernel process still runs.
func (k *kernel) alive() bool {
	select {
	case <-k.exited:
		return false
	default:
		return true
	}
}
