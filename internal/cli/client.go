package cli

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
)

// Client talks to an aenv server's HTTP API. It holds no global state: each
// command builds one from its resolved flags.
type Client struct {
	baseURL string
	apiKey  string
	http    *http.Client
}

// newHTTPClient has no overall timeout (exec and pull stream for as long as
// they run) but bounded connection setup, so a dead address fails fast.
func newHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0,
		MaxIdleConnsPerHost:   4,
		ForceAttemptHTTP2:     true,
	}}
}

func newClient(cfg clientConfig, hc *http.Client) *Client {
	return &Client{baseURL: strings.TrimRight(cfg.URL, "/"), apiKey: cfg.APIKey, http: hc}
}

// APIError is an error answer of the server.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string {
	switch {
	case e.Status == http.StatusUnauthorized:
		return "the server rejected the API key (HTTP 401): run `aenv auth`, or set AENV_API_KEY or --api-key"
	case e.Message == "":
		return fmt.Sprintf("server error: HTTP %d %s", e.Status, http.StatusText(e.Status))
	}
	return e.Message
}

// send performs one request; an error status becomes an *APIError and a
// failure to connect an unreachableError. The caller closes the body.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, header http.Header, body io.Reader) (*http.Response, error) {
	u := c.baseURL + path
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
	req.Header.Set("X-API-Key", c.apiKey)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unreachableError{fmt.Errorf("cannot reach the aenv server at %s (is `aenv server` running? set the address with `aenv auth`, --url or AENV_URL): %w", c.baseURL, unwrapURLError(err))}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, readAPIError(resp)
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

// readAPIError decodes {"code","message"}; code may be a number or a string.
func readAPIError(resp *http.Response) error {
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
	return &APIError{Status: resp.StatusCode, Message: msg}
}

// doJSON sends in (if not nil) as JSON and decodes the answer into out (if
// not nil; a *json.RawMessage keeps it as is).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out any) (http.Header, error) {
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
	resp, err := c.send(ctx, method, path, query, header, body)
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

// escape quotes an ID or name for use as one path segment.
func escape(s string) string { return url.PathEscape(s) }
