// Package codeinterp is the code interpreter E2B's Code Interpreter SDK
// talks to on port 49999 of a sandbox: POST /execute runs code in a
// context (a persistent Python process, see kernel.py) and streams its
// output, results and errors as JSON lines; /contexts creates, lists,
// restarts and removes contexts. envd serves it in sandboxes whose root
// filesystem has MarkerFile.
package codeinterp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Port is where E2B's SDK reaches the code interpreter.
const Port = 49999

// MarkerFile, present in a root filesystem, asks envd to serve the code
// interpreter in its sandboxes.
const MarkerFile = "/etc/aenv/code-interpreter"

// Defaults of Config's bounds.
const (
	DefaultMaxOutputBytes = 64 << 20
	DefaultInterruptGrace = 10 * time.Second
)

// maxRequestBytes bounds an /execute or /contexts body (the code).
const maxRequestBytes = 16 << 20

// Config configures a Service.
type Config struct {
	Logger *slog.Logger
	// Python is the interpreter kernels run with; "" means python3.
	Python string
	// Prepare sets a kernel's user, env vars and working directory; cwd is
	// the context's ("" for the default). Required.
	Prepare func(cmd *exec.Cmd, cwd string) error
	// Env returns the sandbox's env vars as they are now (nil: none
	// beyond the kernel's own). A kernel started before they changed (in a
	// snapshot the sandbox was restored from) is given them at its next
	// execution, for good.
	Env func() map[string]string
	// Token returns the access token /execute must carry in X-Access-Token
	// ("" or nil: none), as E2B's SDK sends envd's.
	Token func() string
	// MaxOutputBytes bounds what one execution streams back (output and
	// results); beyond it output is dropped with a note. 0: the default.
	MaxOutputBytes int
	// InterruptGrace is how long an interrupted cell may take to stop
	// before its kernel is killed (state lost). 0: the default.
	InterruptGrace time.Duration
	// Children starts kernels and waits for them: envd's, so that envd as
	// the sandbox's init leaves their exit statuses to their Wait. nil:
	// exec.Cmd's own Start and Wait.
	Children Children
}

// Children starts processes and waits for them (envd.Reaper).
type Children interface {
	Start(cmd *exec.Cmd, start func() error) error
	Wait(cmd *exec.Cmd) error
}

// plainChildren is exec.Cmd's own Start and Wait.
type plainChildren struct{}

func (plainChildren) Start(_ *exec.Cmd, start func() error) error { return start() }
func (plainChildren) Wait(cmd *exec.Cmd) error                    { return cmd.Wait() }

// Service serves the code interpreter. Its zero value is not usable; call
// New.
type Service struct {
	cfg    Config
	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language → its default context's ID, once made
	// reseeds counts the Reseed calls; a kernel seeded before the last
	// one is told to seed again (see kernel.seeded).
	reseeds atomic.Uint64
}

// codeContext is one context: a kernel that keeps its state between
// executions, run one execution at a time.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	requestedCwd string
	sem          chan struct{} // held by the execution (or start) in progress

	mu sync.Mutex // guards k and Cwd
	k  *kernel
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.InterruptGrace <= 0 {
		cfg.InterruptGrace = DefaultInterruptGrace
	}
	if cfg.Children == nil {
		cfg.Children = plainChildren{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{cfg: cfg, ctx: ctx, cancel: cancel, contexts: map[string]*codeContext{},
		defaults: map[string]string{}}
}

// Close kills every kernel.
func (s *Service) Close() {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.contexts {
		c.stop()
	}
}

// Warm starts the default context's kernel in the background if it is not
// running, so that the first execution finds it ready.
func (s *Service) Warm() {
	c := s.defaultContext(langPython)
	go func() {
		if err := c.acquire(s.ctx); err != nil {
			return
		}
		defer c.release()
		if _, err := s.kernelOf(s.ctx, c); err != nil {
			s.cfg.Logger.Warn("code interpreter: start default kernel", "err", err)
		}
	}()
}

// Reseed makes every kernel running now seed its random generators anew
// at its next execution: the sandbox was restored, as a new one, from a
// template's image that other sandboxes are restored from too (the code
// interpreter's warm snapshot), which holds their state.
func (s *Service) Reseed() {
	s.reseeds.Add(1)
}

// Handler serves the code interpreter's HTTP API.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("OK"))
	})
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("POST /contexts", s.handleCreate)
	mux.HandleFunc("GET /contexts", s.handleList)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleRemove)
	mux.HandleFunc("POST /contexts/{id}/restart", s.handleRestart)
	return mux
}

// Languages a context may have.
const (
	langPython = "python"
	langBash   = "bash"
)

// contextLanguage returns the language a request's language names ("" is
// Python), and false for one the service does not run.
func contextLanguage(lang string) (string, bool) {
	switch lang {
	case "", "python", "python3":
		return langPython, true
	case "bash":
		return langBash, true
	}
	return "", false
}

// unsupportedLanguage is the answer to a language the service does not run.
func unsupportedLanguage(w http.ResponseWriter, lang string) {
	writeError(w, http.StatusBadRequest, fmt.Sprintf("language %q is not supported (python and bash are)", lang))
}

func newContextID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (s *Service) newContext(lang, cwd string) *codeContext {
	return &codeContext{ID: newContextID(), Language: lang, Cwd: cwd, requestedCwd: cwd,
		sem: make(chan struct{}, 1)}
}

// defaultContext returns the default context of a language, making it if
// needed: a runCode that names a language and no context runs there.
func (s *Service) defaultContext(lang string) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.contexts[s.defaults[lang]]; ok {
		return c
	}
	c := s.newContext(lang, "")
	s.contexts[c.ID] = c
	s.defaults[lang] = c.ID
	return c
}

func (s *Service) lookup(id string) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contexts[id]
}

func (c *codeContext) acquire(ctx context.Context) error {
	select {
	case c.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *codeContext) release() { <-c.sem }

// stop kills the context's kernel, if any; the next use starts another.
func (c *codeContext) stop() {
	c.mu.Lock()
	k := c.k
	c.k = nil
	c.mu.Unlock()
	if k != nil {
		k.kill()
	}
}

// kernelOf returns c's running kernel, starting one if it has none or its
// kernel died. The caller holds c's semaphore.
func (s *Service) kernelOf(ctx context.Context, c *codeContext) (*kernel, error) {
	c.mu.Lock()
	k := c.k
	c.mu.Unlock()
	if k != nil && k.alive() {
		return k, nil
	}
	var dir string
	source := pythonDriver
	if c.Language == langBash {
		source = bashDriver
	}
	seeded := s.reseeds.Load() // a kernel started now seeds itself afresh
	k, err := startKernel(ctx, s.cfg.Children, s.cfg.Python, source, func(cmd *exec.Cmd) error {
		if err := s.cfg.Prepare(cmd, c.requestedCwd); err != nil {
			return err
		}
		dir = cmd.Dir
		return nil
	})
	if err != nil {
		return nil, err
	}
	k.seeded = seeded
	c.mu.Lock()
	c.k = k
	if dir != "" {
		c.Cwd = dir
	}
	c.mu.Unlock()
	return k, nil
}

func (c *codeContext) view() codeContext {
	c.mu.Lock()
	defer c.mu.Unlock()
	return codeContext{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

// writeError answers with E2B's error shape; the SDK turns 404 into its
// NotFoundError with the body as message.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Service) handleExecute(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token != nil {
		if want := s.cfg.Token(); want != "" && r.Header.Get("X-Access-Token") != want {
			writeError(w, http.StatusUnauthorized, "invalid access token")
			return
		}
	}
	var req executeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeError(w, http.StatusBadRequest, "give context_id or language, not both")
		return
	}
	var c *codeContext
	switch {
	case req.ContextID != "":
		if c = s.lookup(req.ContextID); c == nil {
			writeError(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", req.ContextID))
			return
		}
	default:
		lang, ok := contextLanguage(req.Language)
		if !ok {
			unsupportedLanguage(w, req.Language)
			return
		}
		c = s.defaultContext(lang)
	}
	ctx := r.Context()
	if err := c.acquire(ctx); err != nil {
		return // the client left while an earlier execution ran
	}
	defer c.release()
	k, err := s.kernelOf(ctx, c)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		// The SDK's timeoutMs starts when the headers arrive: they must
		// not wait for the cell's first output.
		flusher.Flush()
	}
	emit := func(line []byte) error {
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	s.run(ctx, c, k, req, emit)
}

// run executes req in k, streaming its events to emit until the kernel
// says done. When ctx ends (the client left: the SDK's timeoutMs) or emit
// fails, the cell is interrupted and the rest of its events drained, so
// that the context is ready for the next execution with its state kept; a
// cell that does not stop within InterruptGrace costs the kernel.
func (s *Service) run(ctx context.Context, c *codeContext, k *kernel, req executeRequest, emit func([]byte) error) {
	ex := &execution{lines: make(chan []byte, 64), stop: make(chan struct{})}
	var base map[string]string
	if s.cfg.Env != nil {
		base = s.cfg.Env()
	}
	if err := k.begin(ex, req.Code, req.EnvVars, base, s.reseeds.Load()); err != nil {
		c.stop()
		s.emitDead(emit, err)
		return
	}
	defer k.end(ex)
	done := ctx.Done()
	var killed <-chan time.Time
	clientGone := false
	grace := time.NewTimer(s.cfg.InterruptGrace)
	grace.Stop()
	defer grace.Stop()
	interrupt := func() {
		if killed == nil {
			k.interrupt()
			grace.Reset(s.cfg.InterruptGrace)
			killed = grace.C
		}
	}
	sent, truncated := 0, false
	for {
		select {
		case line := <-ex.lines:
			var ev event
			_ = json.Unmarshal(line, &ev)
			if ev.Type == "done" {
				if !clientGone {
					count, _ := json.Marshal(map[string]any{"type": "number_of_executions", "execution_count": ev.ExecutionCount})
					_ = emit(count)
					_ = emit([]byte(`{"type":"end_of_execution"}`))
				}
				return
			}
			if clientGone {
				continue
			}
			if ev.Type != "error" {
				if sent+len(line) > s.cfg.MaxOutputBytes {
					if !truncated {
						truncated = true
						note, _ := json.Marshal(map[string]string{"type": "stderr",
							"text": fmt.Sprintf("[output beyond %d MiB dropped]\n", s.cfg.MaxOutputBytes>>20)})
						_ = emit(note)
					}
					continue
				}
				sent += len(line)
			}
			if err := emit(line); err != nil {
				clientGone = true
				interrupt()
			}
		case <-done:
			done = nil
			clientGone = true
			interrupt()
		case <-killed:
			s.cfg.Logger.Warn("code interpreter: interrupted cell did not stop; killing its kernel", "context", c.ID)
			c.stop()
			return
		case <-k.exited:
			c.stop()
			if !clientGone {
				s.emitDead(emit, k.exitErr())
			}
			return
		}
	}
}

// emitDead reports a kernel that died during an execution; the next
// execution in the context starts a new one.
func (s *Service) emitDead(emit func([]byte) error, cause error) {
	msg := "the kernel died"
	if cause != nil {
		msg += " (" + cause.Error() + ")"
	}
	msg += "; its state is lost and the next execution starts a new kernel"
	line, _ := json.Marshal(map[string]string{"type": "error", "name": "DeadKernelError", "value": msg, "traceback": ""})
	_ = emit(line)
	_ = emit([]byte(`{"type":"end_of_execution"}`))
}

// createRequest is the body of POST /contexts.
type createRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Service) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBytes)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	lang, ok := contextLanguage(req.Language)
	if !ok {
		unsupportedLanguage(w, req.Language)
		return
	}
	c := s.newContext(lang, req.Cwd)
	c.sem <- struct{}{} // nobody else knows c yet
	defer c.release()
	if _, err := s.kernelOf(r.Context(), c); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	v := c.view()
	writeJSON(w, &v)
}

func (s *Service) handleList(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	list := make([]codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		list = append(list, c.view())
	}
	s.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	writeJSON(w, list)
}

func (s *Service) handleRemove(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c, ok := s.contexts[id]
	delete(s.contexts, id)
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	c.stop()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) handleRestart(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.lookup(id)
	if c == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	// Killed first: a restart is how a stuck cell is ended, and the
	// execution running it ends when its kernel does.
	c.stop()
	if err := c.acquire(r.Context()); err != nil {
		return
	}
	defer c.release()
	if _, err := s.kernelOf(r.Context(), c); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
