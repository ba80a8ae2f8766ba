// Package client is the one client of envd, the agent inside each sandbox:
// the server calls it directly, the CLI and the benchmark through the
// server's envd proxy (NewProxied). It runs processes (Start, Run), reads
// and writes files and configures envd (Init).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/aenv-dev/aenv/api/envd/process/processconnect"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// Errors of envd's answers, each of a kind (internal/errdefs) that the API
// maps to a status; returned errors wrap them.
var (
	ErrNotFound        = errdefs.New(errdefs.ErrNotFound, "not found")
	ErrInvalidArgument = errdefs.New(errdefs.ErrInvalidArgument, "invalid argument")
	ErrUnauthenticated = errdefs.New(errdefs.ErrUnauthenticated, "unauthenticated")
	ErrPermission      = errdefs.New(errdefs.ErrPermissionDenied, "permission denied")
	ErrNoSpace         = errdefs.New(errdefs.ErrInsufficientStorage, "not enough space")
)

// HeaderSandboxID marks a request for the envd of one sandbox; a server
// (aenv's or E2B's) proxies such requests to that sandbox.
const HeaderSandboxID = "E2b-Sandbox-Id"

// headerAccessToken carries envd's access token.
const headerAccessToken = "X-Access-Token"

// Client talks to one envd.
type Client struct {
	baseURL string
	http    *http.Client
	// sandboxID, when set, routes every request through a server's proxy.
	sandboxID string
	process   processconnect.ProcessClient

	mu    sync.RWMutex
	token string
}

// New returns a client for the envd at baseURL (e.g. http://10.0.0.2:49983).
// accessToken may be empty while envd has none.
func New(baseURL string, httpClient *http.Client, accessToken string) *Client {
	return newClient(baseURL, "", httpClient, accessToken)
}

// NewProxied returns a client for the envd of sandbox sandboxID, reached
// through the server at serverURL. Only envd's access token goes along:
// the server's API key would travel into the sandbox.
func NewProxied(serverURL, sandboxID string, httpClient *http.Client, accessToken string) *Client {
	return newClient(serverURL, sandboxID, httpClient, accessToken)
}

func newClient(baseURL, sandboxID string, httpClient *http.Client, accessToken string) *Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	c := &Client{
		baseURL:   strings.TrimRight(baseURL, "/"),
		http:      httpClient,
		sandboxID: sandboxID,
		token:     accessToken,
	}
	c.process = processconnect.NewProcessClient(doer{c}, c.baseURL)
	return c
}

// doer adds the routing header and the current access token to every
// request, plain HTTP and Connect alike.
type doer struct{ c *Client }

func (d doer) Do(req *http.Request) (*http.Response, error) {
	if d.c.sandboxID != "" {
		req.Header.Set(HeaderSandboxID, d.c.sandboxID)
	}
	if token := d.c.accessToken(); token != "" {
		req.Header.Set(headerAccessToken, token)
	}
	return d.c.http.Do(req)
}

func (c *Client) accessToken() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.token
}

// Health reports whether envd answers GET /health.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.do(ctx, http.MethodGet, "/health", nil, nil, nil)
	if err != nil {
		return fmt.Errorf("envd health: %w", err)
	}
	resp.Body.Close()
	return nil
}

// InitRequest is the body of POST /init.
type InitRequest struct {
	AccessToken string
	// ClearAccessToken removes envd's token (AccessToken is then
	// ignored): envd requires none from then on.
	ClearAccessToken bool
	EnvVars          map[string]string
	DefaultUser      string
	DefaultWorkdir   string
	Nameservers      []string // written to /etc/resolv.conf when set
	KillProcesses    bool     // end every process but envd (resume without memory)
	// Reseed: a new sandbox restored from a template's image; its code
	// interpreter's random generators are seeded anew.
	Reseed bool
}

// Init configures envd, authenticating with the client's current token.
// When req sets a new token, the client uses it from then on.
func (c *Client) Init(ctx context.Context, req InitRequest) error {
	// A token that is absent is kept; an empty one is removed.
	var token *string
	switch {
	case req.ClearAccessToken:
		token = new(string)
	case req.AccessToken != "":
		token = &req.AccessToken
	}
	body := struct {
		AccessToken    *string           `json:"accessToken,omitempty"`
		EnvVars        map[string]string `json:"envVars,omitempty"`
		DefaultUser    string            `json:"defaultUser,omitempty"`
		DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
		Nameservers    []string          `json:"nameservers,omitempty"`
		KillProcesses  bool              `json:"killProcesses,omitempty"`
		Reseed         bool              `json:"reseed,omitempty"`
	}{token, req.EnvVars, req.DefaultUser, req.DefaultWorkdir, req.Nameservers, req.KillProcesses, req.Reseed}
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("envd init: %w", err)
	}
	header := http.Header{"Content-Type": {"application/json"}}
	resp, err := c.do(ctx, http.MethodPost, "/init", nil, header, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("envd init: %w", err)
	}
	resp.Body.Close()
	if token != nil {
		c.mu.Lock()
		c.token = *token
		c.mu.Unlock()
	}
	return nil
}

// WriteFile streams r into path inside the sandbox as user ("" = default).
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, user string) error {
	header := http.Header{"Content-Type": {"application/octet-stream"}}
	resp, err := c.do(ctx, http.MethodPost, "/files", fileQuery(path, user), header, r)
	if err != nil {
		return fmt.Errorf("envd write %s: %w", path, err)
	}
	resp.Body.Close()
	return nil
}

// ReadFile opens path inside the sandbox as user ("" = default) and returns
// its content and size. The caller closes the reader.
func (c *Client) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, int64, error) {
	header := http.Header{"Accept-Encoding": {"identity"}}
	resp, err := c.do(ctx, http.MethodGet, "/files", fileQuery(path, user), header, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("envd read %s: %w", path, err)
	}
	return resp.Body, resp.ContentLength, nil
}

func fileQuery(path, user string) url.Values {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	return q
}

// do sends one plain-HTTP request and turns a non-2xx answer into an error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, header http.Header, body io.Reader) (*http.Response, error) {
	u := c.baseURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := doer{c}.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, statusError(resp)
}

// statusError reads envd's {"code","message"} error body.
func statusError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &body) == nil && body.Message != "" {
		msg = body.Message
	}
	kind := sentinelForStatus(resp.StatusCode)
	if kind == nil {
		return fmt.Errorf("envd answered %s: %s", strconv.Itoa(resp.StatusCode), msg)
	}
	return fmt.Errorf("%w: %s", kind, msg)
}

func sentinelForStatus(status int) error {
	switch status {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusBadRequest:
		return ErrInvalidArgument
	case http.StatusUnauthorized:
		return ErrUnauthenticated
	case http.StatusForbidden:
		return ErrPermission
	case http.StatusInsufficientStorage:
		return ErrNoSpace
	}
	// Any other refusal (a range, an encoding) is the request's fault.
	if status >= 400 && status < 500 {
		return ErrInvalidArgument
	}
	return nil
}
