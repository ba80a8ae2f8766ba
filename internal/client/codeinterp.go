package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// E2B's code interpreter, served on port 49999 of the sandboxes of the
// code-interpreter template (internal/codeinterp): POST /execute runs code
// in a context (a Python process that keeps its state) and streams JSON
// lines; /contexts creates, lists, restarts and removes contexts. The
// requests go through the server's proxy as E2B's SDK sends them: the
// sandbox and port in headers, the sandbox's envd access token in
// X-Access-Token, no API key.

// CodeInterpreterPort is where the code interpreter listens in a sandbox
// (codeinterp.Port).
const CodeInterpreterPort = 49999

// headerSandboxPort names the sandbox port a proxied request is for.
const headerSandboxPort = "E2b-Sandbox-Port"

// Errors of the proxy in front of a sandbox's code interpreter.
var (
	// ErrSandboxNotRunning: the sandbox is unknown, or no longer runs.
	ErrSandboxNotRunning = errdefs.New(errdefs.ErrNotFound, "sandbox not found or not running")
	// ErrNoCodeInterpreter: the sandbox runs, but nothing listens on the
	// code interpreter's port (it was not made from the code-interpreter
	// template, or one built on it).
	ErrNoCodeInterpreter = errdefs.New(errdefs.ErrNotFound, "the sandbox does not serve the code interpreter")
)

// CodeInterpreter talks to the code interpreter of one sandbox. Make it
// with Client.CodeInterpreter; it is safe for concurrent use (executions
// in one context run one at a time, in order).
type CodeInterpreter struct {
	c           *Client
	sandboxID   string
	accessToken string
}

// CodeInterpreter returns a client of the code interpreter in sandbox id,
// through the server's proxy, authenticated with the sandbox's envd
// access token (Sandbox.EnvdAccessToken; "" for a sandbox created with
// secure false).
func (c *Client) CodeInterpreter(id, accessToken string) *CodeInterpreter {
	return &CodeInterpreter{c: c, sandboxID: id, accessToken: accessToken}
}

// RunCodeRequest is the body of POST /execute. ContextID and Language
// are exclusive; neither runs the code in the default Python context.
type RunCodeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	Env       map[string]string `json:"env_vars,omitempty"` // this execution's only
}

// The types of CodeEvent.
const (
	CodeEventStdout = "stdout"
	CodeEventStderr = "stderr"
	CodeEventResult = "result"
	CodeEventError  = "error"
	CodeEventCount  = "number_of_executions"
	CodeEventEnd    = "end_of_execution"
)

// CodeEvent is one line of an execution's stream.
type CodeEvent struct {
	Type string
	// Text is what the code wrote (stdout, stderr), as it came: not
	// necessarily whole lines.
	Text string
	// Result is set for a result: the value of the cell's last
	// expression (IsMainResult) or anything the code displayed.
	Result *CodeResult
	// Error is set for an error: the exception the code raised.
	Error *CodeError
	// ExecutionCount is set for number_of_executions: how many
	// executions the context has run, this one included.
	ExecutionCount int

	// Raw is the line as the code interpreter sent it.
	Raw json.RawMessage
}

// CodeResult is a result in each of the formats the value offered
// (Jupyter's MIME bundle, with E2B's names). Binary formats (PNG, JPEG,
// PDF) are base64.
type CodeResult struct {
	IsMainResult bool            `json:"is_main_result"`
	Text         string          `json:"text,omitempty"`
	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"`
	JPEG         string          `json:"jpeg,omitempty"`
	PDF          string          `json:"pdf,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	JavaScript   string          `json:"javascript,omitempty"`
	// Extra holds the formats without a name of their own, by MIME type.
	Extra map[string]json.RawMessage `json:"-"`
}

// codeResultKeys are the formats CodeResult names, and "type".
var codeResultKeys = map[string]bool{"type": true, "is_main_result": true, "text": true, "html": true,
	"markdown": true, "svg": true, "png": true, "jpeg": true, "pdf": true, "latex": true, "json": true,
	"javascript": true}

// UnmarshalJSON reads a result line, keeping unnamed formats in Extra.
func (r *CodeResult) UnmarshalJSON(data []byte) error {
	type plain CodeResult
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return err
	}
	for k, v := range all {
		if !codeResultKeys[k] {
			if p.Extra == nil {
				p.Extra = map[string]json.RawMessage{}
			}
			p.Extra[k] = v
		}
	}
	*r = CodeResult(p)
	return nil
}

// Formats names the formats the result has ("text", "html", "png", ...,
// and Extra's MIME types), in a fixed order.
func (r *CodeResult) Formats() []string {
	var out []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"text", r.Text != ""}, {"html", r.HTML != ""}, {"markdown", r.Markdown != ""}, {"svg", r.SVG != ""},
		{"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"pdf", r.PDF != ""}, {"latex", r.LaTeX != ""},
		{"json", len(r.JSON) > 0}, {"javascript", r.JavaScript != ""},
	} {
		if f.set {
			out = append(out, f.name)
		}
	}
	extra := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		extra = append(extra, k)
	}
	slices.Sort(extra)
	return append(out, extra...)
}

// CodeError is an exception the code raised (or DeadKernelError, for a
// kernel that died: its state is lost).
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *CodeError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Execution is what an execution produced, as E2B's SDK gathers it.
type Execution struct {
	Stdout, Stderr []string // the pieces of output, in order
	Results        []CodeResult
	// Error is the exception the code raised; nil when it ran through.
	Error *CodeError
	// ExecutionCount is how many executions the context has run.
	ExecutionCount int
}

// Text is the text of the main result (the value of the cell's last
// expression), "" without one.
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// RunCode runs req's code and streams its events to onEvent (if not nil)
// as they come, returning them gathered once the execution ends. An
// exception in the code is no error: it is in Execution.Error. When ctx
// ends the request is cut and the code interrupted (KeyboardInterrupt; the
// context keeps its state).
func (ci *CodeInterpreter) RunCode(ctx context.Context, req RunCodeRequest, onEvent func(CodeEvent)) (Execution, error) {
	if strings.TrimSpace(req.Code) == "" {
		return Execution{}, fmt.Errorf("run code: %w", errdefs.New(errdefs.ErrInvalidArgument, "no code given"))
	}
	if req.ContextID != "" && req.Language != "" {
		return Execution{}, fmt.Errorf("run code: %w", errdefs.New(errdefs.ErrInvalidArgument, "give a context or a language, not both"))
	}
	// Not FinishOnCancel: an ended context is how a caller interrupts.
	if ci.c.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ci.c.cfg.RequestTimeout)
		defer cancel()
	}
	resp, err := ci.send(ctx, http.MethodPost, "/execute", req)
	if err != nil {
		return Execution{}, err
	}
	defer resp.Body.Close()
	var out Execution
	dec := json.NewDecoder(resp.Body)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("run code: %w", ctx.Err())
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return out, fmt.Errorf("run code in sandbox %s: the stream ended before the execution did (was the sandbox stopped?)", ci.sandboxID)
			}
			return out, fmt.Errorf("run code in sandbox %s: read output: %w", ci.sandboxID, err)
		}
		ev, err := decodeCodeEvent(raw)
		if err != nil {
			return out, fmt.Errorf("run code in sandbox %s: %w", ci.sandboxID, err)
		}
		switch ev.Type {
		case CodeEventStdout:
			out.Stdout = append(out.Stdout, ev.Text)
		case CodeEventStderr:
			out.Stderr = append(out.Stderr, ev.Text)
		case CodeEventResult:
			out.Results = append(out.Results, *ev.Result)
		case CodeEventError:
			out.Error = ev.Error
		case CodeEventCount:
			out.ExecutionCount = ev.ExecutionCount
		}
		if onEvent != nil {
			onEvent(ev)
		}
		if ev.Type == CodeEventEnd {
			return out, nil
		}
	}
}

// decodeCodeEvent reads one line of /execute; lines of types it does not
// know pass with Type and Raw only.
func decodeCodeEvent(raw json.RawMessage) (CodeEvent, error) {
	var head struct {
		Type           string `json:"type"`
		Text           string `json:"text"`
		ExecutionCount int    `json:"execution_count"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return CodeEvent{}, fmt.Errorf("decode output line: %w", err)
	}
	ev := CodeEvent{Type: head.Type, Raw: raw}
	switch head.Type {
	case CodeEventStdout, CodeEventStderr:
		ev.Text = head.Text
	case CodeEventResult:
		ev.Result = &CodeResult{}
		if err := json.Unmarshal(raw, ev.Result); err != nil {
			return CodeEvent{}, fmt.Errorf("decode result: %w", err)
		}
	case CodeEventError:
		ev.Error = &CodeError{}
		if err := json.Unmarshal(raw, ev.Error); err != nil {
			return CodeEvent{}, fmt.Errorf("decode error: %w", err)
		}
	case CodeEventCount:
		ev.ExecutionCount = head.ExecutionCount
	case "":
		return CodeEvent{}, fmt.Errorf("output line without a type: %.200s", raw)
	}
	return ev, nil
}

// CodeContext is a context: a Python process keeping its state between
// executions.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	Raw json.RawMessage `json:"-"`
}

// CreateContext starts a context; language "" is Python, cwd "" the
// sandbox user's home.
func (ci *CodeInterpreter) CreateContext(ctx context.Context, language, cwd string) (CodeContext, error) {
	body := map[string]string{}
	if language != "" {
		body["language"] = language
	}
	if cwd != "" {
		body["cwd"] = cwd
	}
	var raw json.RawMessage
	if err := ci.doJSON(ctx, http.MethodPost, "/contexts", body, &raw); err != nil {
		return CodeContext{}, err
	}
	var out CodeContext
	if err := json.Unmarshal(raw, &out); err != nil || out.ID == "" {
		return CodeContext{}, fmt.Errorf("create context: the answer is not a context: %.200s", raw)
	}
	out.Raw = raw
	return out, nil
}

// ListContexts lists the contexts, the default one included once used.
func (ci *CodeInterpreter) ListContexts(ctx context.Context) ([]CodeContext, error) {
	var raws []json.RawMessage
	if err := ci.doJSON(ctx, http.MethodGet, "/contexts", nil, &raws); err != nil {
		return nil, err
	}
	out, err := decodeList(raws, func(cc *CodeContext, raw json.RawMessage) { cc.Raw = raw })
	if err != nil {
		return nil, fmt.Errorf("list contexts: %w", err)
	}
	return out, nil
}

// RestartContext starts the context's process again: its state is lost,
// and an execution running in it ends.
func (ci *CodeInterpreter) RestartContext(ctx context.Context, id string) error {
	return ci.doJSON(ctx, http.MethodPost, "/contexts/"+url.PathEscape(id)+"/restart", nil, nil)
}

// RemoveContext stops the context's process and forgets the context.
func (ci *CodeInterpreter) RemoveContext(ctx context.Context, id string) error {
	return ci.doJSON(ctx, http.MethodDelete, "/contexts/"+url.PathEscape(id), nil, nil)
}

// doJSON is a request of the context API: bounded as Client.DoJSON's.
func (ci *CodeInterpreter) doJSON(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := ci.c.requestContext(ctx)
	defer cancel()
	resp, err := ci.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s in sandbox %s: decode answer: %w", method, path, ci.sandboxID, err)
	}
	return nil
}

// send sends one request to the code interpreter, through the proxy,
// without the API key (it is not the sandbox's to see).
func (ci *CodeInterpreter) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, ci.c.cfg.URL+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(envdclient.HeaderSandboxID, ci.sandboxID)
	req.Header.Set(headerSandboxPort, strconv.Itoa(CodeInterpreterPort))
	if ci.accessToken != "" {
		req.Header.Set("X-Access-Token", ci.accessToken)
	}
	resp, err := ci.c.cfg.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, ctx.Err())
		}
		return nil, &UnreachableError{URL: ci.c.cfg.URL, Err: unwrapURLError(err)}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, ci.answerError(method, path, resp)
	}
	return resp, nil
}

// answerError reads an error answer: the proxy's (no such sandbox, no
// code interpreter in it, no traffic token) in words of this API, the code
// interpreter's own as an *APIError.
func (ci *CodeInterpreter) answerError(method, path string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Message string `json:"message"`
		Port    *int   `json:"port"`
	}
	_ = json.Unmarshal(data, &body)
	id := ci.sandboxID
	switch resp.StatusCode {
	case http.StatusBadGateway:
		if body.Port != nil {
			return fmt.Errorf("sandbox %s: %w: nothing listens on port %d (create the sandbox from the code-interpreter template)",
				id, ErrNoCodeInterpreter, CodeInterpreterPort)
		}
		return fmt.Errorf("sandbox %s: %w", id, ErrSandboxNotRunning)
	case http.StatusUnauthorized:
		return fmt.Errorf("the code interpreter of sandbox %s refused its access token (%s): %w", id,
			cmp.Or(body.Message, "HTTP 401"), errdefs.ErrUnauthenticated)
	case http.StatusForbidden:
		return fmt.Errorf("sandbox %s: %s: %w", id, cmp.Or(body.Message, "HTTP 403"), errdefs.ErrPermissionDenied)
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	return readAPIError(method, path, resp)
}
