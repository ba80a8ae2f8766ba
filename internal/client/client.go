// Package client is the one Go client of an aenv server's control plane:
// sandboxes, templates, snapshots, fork, pause and resume, timeouts,
// commands, files and network policy. The CLI, the benchmark and the
// integration tests use it; envd traffic goes through Client.Envd.
//
// It speaks E2B's API with aenv's additions and reads answers leniently
// (servers spell some fields differently), keeping each decoded object's
// raw JSON for callers that print it.
package client

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
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// Config says which server to talk to and how.
type Config struct {
	URL    string // e.g. http://127.0.0.1:8000
	APIKey string
	// HTTP sends the requests; nil is NewHTTPClient(4).
	HTTP *http.Client
	// FinishOnCancel lets each request run to its end even when the
	// caller's context ends, bounded by RequestTimeout: an interrupted
	// pause, resume or checkpoint can leave a sandbox that cannot be
	// deleted, which is worse than waiting.
	FinishOnCancel bool
	// RequestTimeout bounds each request; 0 is no bound (streams such as
	// a template build run as long as they take).
	RequestTimeout time.Duration
}

// Client talks to one aenv server. It is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a client for cfg.
func New(cfg Config) *Client {
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.HTTP == nil {
		cfg.HTTP = NewHTTPClient(4)
	}
	return &Client{cfg: cfg}
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.cfg.URL }

// NewHTTPClient has no overall timeout (streams last as long as they run)
// but bounded connection setup, so a dead address fails fast. It keeps up
// to idlePerHost idle connections: callers with many requests in flight
// need that many, or they measure TCP setup instead of the server.
func NewHTTPClient(idlePerHost int) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConns:        max(idlePerHost, 100),
		MaxIdleConnsPerHost: idlePerHost,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}}
}

// Envd returns a client of the envd in sandbox id, through the server's
// proxy, authenticated with the sandbox's envd access token.
func (c *Client) Envd(id, accessToken string) *envdclient.Client {
	return envdclient.NewProxied(c.cfg.URL, id, c.cfg.HTTP, accessToken)
}

// APIError is an error answer of the server.
type APIError struct {
	Method, Path string
	Status       int
	Message      string // the server's message; may be empty
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("server error: HTTP %d %s", e.Status, http.StatusText(e.Status))
	}
	return e.Message
}

// Unwrap gives the error's kind (internal/errdefs) from its status, so
// that callers test errors.Is(err, errdefs.ErrNotFound) whatever the
// server's words.
func (e *APIError) Unwrap() error { return errdefs.FromHTTPStatus(e.Status) }

// StatusOf is the HTTP status of an API error in err's chain, or 0.
func StatusOf(err error) int {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

// UnreachableError is a server that could not be reached at all.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the aenv server at %s: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ErrorObject is the {"code","message"} error inside answers (a failed
// fork child, a failed build); code is a number or a string depending on
// the server.
type ErrorObject struct {
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
}

// Status returns the HTTP status the code stands for, or 0.
func (e *ErrorObject) Status() int {
	if n, err := strconv.Atoi(string(e.Code)); err == nil {
		return n
	}
	var s string
	if json.Unmarshal(e.Code, &s) == nil {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
		switch s {
		case "not_found":
			return http.StatusNotFound
		case "unauthenticated":
			return http.StatusUnauthorized
		}
	}
	return 0
}

// Err is the error as an *APIError.
func (e *ErrorObject) Err() error {
	return &APIError{Status: e.Status(), Message: e.Message}
}

// Send performs one request with the API key and returns the answer for
// the caller to read and close. An error status becomes an *APIError and
// a failure to connect an *UnreachableError. header may be nil; a
// Content-Length in it sets the length of a streamed body.
func (c *Client) Send(ctx context.Context, method, path string, query url.Values, header http.Header, body io.Reader) (*http.Response, error) {
	ctx, cancel := c.requestContext(ctx)
	resp, err := c.send(ctx, method, path, query, header, body)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// requestContext applies FinishOnCancel and RequestTimeout.
func (c *Client) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.FinishOnCancel {
		ctx = context.WithoutCancel(ctx)
	}
	if c.cfg.RequestTimeout > 0 {
		return context.WithTimeout(ctx, c.cfg.RequestTimeout)
	}
	return context.WithCancel(ctx)
}

// cancelOnClose releases a request's context with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (c *Client) send(ctx context.Context, method, path string, query url.Values, header http.Header, body io.Reader) (*http.Response, error) {
	u := c.cfg.URL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if n, err := strconv.ParseInt(header.Get("Content-Length"), 10, 64); err == nil {
		req.ContentLength = n // a stream's length is known only to the caller
	}
	req.Header.Set("X-API-Key", c.cfg.APIKey)
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, ctx.Err())
		}
		return nil, &UnreachableError{URL: c.cfg.URL, Err: unwrapURLError(err)}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, readAPIError(method, path, resp)
	}
	return resp, nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// readAPIError decodes {"code","message"}, or keeps a plain-text body.
func readAPIError(method, path string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Message string `json:"message"`
	}
	msg := ""
	if json.Unmarshal(data, &body) == nil {
		msg = body.Message
	} else if !strings.Contains(resp.Header.Get("Content-Type"), "html") {
		msg = strings.TrimSpace(string(data))
	}
	return &APIError{Method: method, Path: path, Status: resp.StatusCode, Message: msg}
}

// DoJSON sends in (if not nil) as JSON and decodes the answer into out (if
// not nil; a *json.RawMessage keeps it as it came). It returns the
// answer's header.
func (c *Client) DoJSON(ctx context.Context, method, path string, query url.Values, in, out any) (http.Header, error) {
	header := http.Header{"Accept": {"application/json"}}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		body = bytes.NewReader(data)
		header.Set("Content-Type", "application/json")
	}
	resp, err := c.Send(ctx, method, path, query, header, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Header, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return nil, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return resp.Header, nil
}

// getList gets a JSON array, decoding each element and keeping it raw.
func getList[T any](ctx context.Context, c *Client, path string, query url.Values, keep func(*T, json.RawMessage)) ([]T, http.Header, error) {
	var raws []json.RawMessage
	header, err := c.DoJSON(ctx, http.MethodGet, path, query, nil, &raws)
	if err != nil {
		return nil, nil, err
	}
	out, err := decodeList(raws, keep)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return out, header, nil
}

// decodeList decodes each element of a JSON array, keeping it raw.
func decodeList[T any](raws []json.RawMessage, keep func(*T, json.RawMessage)) ([]T, error) {
	out := make([]T, 0, len(raws))
	for _, raw := range raws {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("decode answer: %w", err)
		}
		keep(&v, raw)
		out = append(out, v)
	}
	return out, nil
}

// sandboxPath is /sandboxes/{id} plus more path segments.
func sandboxPath(id string, more ...string) string {
	p := "/sandboxes/" + url.PathEscape(id)
	for _, m := range more {
		p += "/" + m
	}
	return p
}

// ServerMetrics reads the server's Prometheus metrics (GET /metrics) and
// returns the samples that have no labels, by name (aenv_sandboxes_live,
// aenv_warm_pool_ready, ...).
func (c *Client) ServerMetrics(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := c.requestContext(ctx)
	defer cancel()
	resp, err := c.send(ctx, http.MethodGet, "/metrics", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			case m.Untyped != nil:
				out[name] = m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}
