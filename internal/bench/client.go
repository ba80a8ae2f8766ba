package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// client speaks the aenv server's control-plane API.
type client struct {
	baseURL string
	apiKey  string
	http    *http.Client
}

// newHTTPClient keeps enough idle connections for the concurrency figures:
// with a small pool, hundreds of parallel requests would measure TCP
// connection setup instead of the server.
func newHTTPClient(maxConns int) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        maxConns,
		MaxIdleConnsPerHost: maxConns,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// apiError is an error status from the server.
type apiError struct {
	method, path string
	status       int
	message      string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.method, e.path, e.status, e.message)
}

// isStatus reports whether err is an API error with the given status.
func isStatus(err error, status int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.status == status
}

// requestTimeout bounds one API request, however long the server takes.
const requestTimeout = 3 * time.Minute

// finishing returns a context for one operation that is NOT cancelled with
// ctx, only by its own timeout. Ctrl-C stops the bench between operations,
// never inside one: an interrupted pause, resume or checkpoint can leave a
// sandbox or container in a state that cannot be deleted, which is worse
// than waiting for the operation to end.
func finishing(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// do sends one request; body may be nil, []byte (sent raw) or a value sent
// as JSON. A non-nil out receives the decoded JSON answer.
func (c *client) do(ctx context.Context, method, path string, body any, out any) error {
	ctx, cancel := finishing(ctx, requestTimeout)
	defer cancel()
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
		contentType = "application/octet-stream"
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("X-API-Key", c.apiKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		var e struct {
			Message string `json:"message"`
		}
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		return &apiError{method: method, path: path, status: resp.StatusCode, message: msg}
	}
	switch o := out.(type) {
	case nil:
		_, err = io.Copy(io.Discard, resp.Body)
	case *[]byte:
		*o, err = io.ReadAll(resp.Body)
	default:
		err = json.NewDecoder(resp.Body).Decode(out)
	}
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	return nil
}

// sandbox is what create and fork return.
type sandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

type createRequest struct {
	TemplateID string `json:"templateID"`
	VCPU       int    `json:"vcpu,omitempty"`
	MemoryMB   int    `json:"memoryMB,omitempty"`
	Timeout    int    `json:"timeout,omitempty"` // seconds
}

func (c *client) create(ctx context.Context, req createRequest) (sandbox, error) {
	var sb sandbox
	if err := c.do(ctx, http.MethodPost, "/sandboxes", req, &sb); err != nil {
		return sb, err
	}
	if sb.SandboxID == "" {
		return sb, errors.New("create sandbox: the answer has no sandboxID")
	}
	return sb, nil
}

func (c *client) deleteSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
}

type execResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// execute runs command through the seed's /execute and fails on a
// non-zero exit.
func (c *client) execute(ctx context.Context, id, command string) (execResult, error) {
	var res execResult
	body := map[string]any{"command": command, "timeout": 120}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/execute", body, &res); err != nil {
		return res, err
	}
	if res.ExitCode != 0 {
		return res, fmt.Errorf("execute %q: exit %d: %s", command, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return res, nil
}

func (c *client) putFile(ctx context.Context, id, path string, data []byte) error {
	return c.do(ctx, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/files?path="+url.QueryEscape(path), data, nil)
}

func (c *client) getFile(ctx context.Context, id, path string) ([]byte, error) {
	var data []byte
	err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/files?path="+url.QueryEscape(path), nil, &data)
	return data, err
}

// writeText uses the seed's JSON file write.
func (c *client) writeText(ctx context.Context, id, path, content string) error {
	body := map[string]string{"path": path, "content": content}
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/files/write", body, nil)
}

// readText uses the seed's JSON file read.
func (c *client) readText(ctx context.Context, id, path string) (string, error) {
	var out struct {
		Content string `json:"content"`
	}
	err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/files/read?path="+url.QueryEscape(path), nil, &out)
	return out.Content, err
}

func (c *client) pause(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil)
}

func (c *client) resume(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/resume", nil, nil)
}

// snapshot takes a named snapshot of a running sandbox and returns its ID.
func (c *client) snapshot(ctx context.Context, id, name string) (string, error) {
	var out struct {
		SnapshotID string `json:"snapshotID"`
	}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", map[string]string{"name": name}, &out); err != nil {
		return "", err
	}
	if out.SnapshotID == "" {
		return "", errors.New("snapshot: the answer has no snapshotID")
	}
	return out.SnapshotID, nil
}

// createTemplate makes a template of a sandbox (the seed's POST /templates).
func (c *client) createTemplate(ctx context.Context, sandboxID, name string) (string, error) {
	var out struct {
		TemplateID string `json:"templateID"`
	}
	body := map[string]string{"sandboxID": sandboxID, "name": name}
	if err := c.do(ctx, http.MethodPost, "/templates", body, &out); err != nil {
		return "", err
	}
	if out.TemplateID == "" {
		return "", errors.New("create template: the answer has no templateID")
	}
	return out.TemplateID, nil
}

// deleteTemplate removes a template or snapshot.
func (c *client) deleteTemplate(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil)
}

// fork makes count children of a sandbox. A child that failed comes back
// as an error; the others are usable.
func (c *client) fork(ctx context.Context, id string, count int) ([]sandbox, []error, error) {
	var out []struct {
		Sandbox *sandbox `json:"sandbox"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", map[string]int{"count": count}, &out); err != nil {
		return nil, nil, err
	}
	var children []sandbox
	var errs []error
	for _, item := range out {
		switch {
		case item.Sandbox != nil && item.Sandbox.SandboxID != "":
			children = append(children, *item.Sandbox)
		case item.Error != nil:
			errs = append(errs, fmt.Errorf("fork child: %s", item.Error.Message))
		default:
			errs = append(errs, errors.New("fork child: neither sandbox nor error"))
		}
	}
	return children, errs, nil
}

// memUsed is the sandbox's current memory use from its metrics.
func (c *client) memUsed(ctx context.Context, id string) (int64, error) {
	var out []struct {
		MemUsed int64 `json:"memUsed"`
	}
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/metrics", nil, &out); err != nil {
		return 0, err
	}
	if len(out) == 0 {
		return 0, fmt.Errorf("metrics of %s: no sample (not running?)", id)
	}
	return out[len(out)-1].MemUsed, nil
}

// listSandboxIDs returns the IDs of every sandbox the server has.
func (c *client) listSandboxIDs(ctx context.Context) ([]string, error) {
	var out []sandbox
	if err := c.do(ctx, http.MethodGet, "/v2/sandboxes?limit=100", nil, &out); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(out))
	for _, sb := range out {
		ids = append(ids, sb.SandboxID)
	}
	return ids, nil
}

// templateEntry is one entry of GET /templates (templates and snapshots).
type templateEntry struct {
	TemplateID string `json:"templateID"`
	Name       string `json:"name"`
	Kind       string `json:"kind"`
}

func (c *client) listTemplates(ctx context.Context) ([]templateEntry, error) {
	var out []templateEntry
	err := c.do(ctx, http.MethodGet, "/templates", nil, &out)
	return out, err
}
