// Package wiretest checks that a server's answers have the shapes the
// OpenAPI document (api/openapi/aenv.yaml) gives them, for tests that
// drive a real server over HTTP.
package wiretest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/aenv-dev/aenv/api/openapi"
)

var (
	loadOnce sync.Once
	loaded   *openapi3.T
	loadErr  error
)

// Document is the parsed, validated OpenAPI document.
func Document(t testing.TB) *openapi3.T {
	t.Helper()
	loadOnce.Do(func() {
		loader := openapi3.NewLoader()
		loaded, loadErr = loader.LoadFromData(openapi.Document)
		if loadErr == nil {
			loadErr = loaded.Validate(context.Background())
		}
	})
	if loadErr != nil {
		t.Fatalf("OpenAPI document: %v", loadErr)
	}
	return loaded
}

// Transport wraps base (nil: http.DefaultTransport) so that every answer
// to a request the document describes is checked against it: status,
// headers and body. A mismatch fails t; the answer is passed on as it
// came. Requests the document does not describe (envd's, build uploads)
// pass unchecked.
func Transport(t testing.TB, base http.RoundTripper) http.RoundTripper {
	doc := Document(t)
	// The router matches paths only: the document's server URL is not the
	// test server's.
	docForRouting := *doc
	docForRouting.Servers = nil
	router, err := gorillamux.NewRouter(&docForRouting)
	if err != nil {
		t.Fatalf("OpenAPI router: %v", err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &checking{t: t, base: base, router: router}
}

type checking struct {
	t      testing.TB
	base   http.RoundTripper
	router routers.Router
}

func (c *checking) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if err := c.check(req, resp); err != nil {
		c.t.Errorf("%s %s answered %d outside the OpenAPI document: %v", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	return resp, nil
}

// check validates resp, leaving its body readable.
func (c *checking) check(req *http.Request, resp *http.Response) error {
	if sandboxTraffic(req) {
		return nil // envd's or a sandbox's own, whatever the path
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		return nil // not described
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusNoContent &&
		ct != "" && ct != "application/json" {
		// Streamed answers (image templates' progress) are NDJSON, and
		// proxied ones are the sandbox's: not described.
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: resp.StatusCode,
		Header: resp.Header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			MultiError:            true,
		},
	}
	input.SetBodyBytes(body)
	return openapi3filter.ValidateResponse(req.Context(), input)
}

// sandboxTraffic tells requests the server passes to a sandbox (envd, or
// an exposed port): they carry E2B's sandbox header, or a Host of the form
// <port>-<sandboxID>.<domain>. Their paths may be the control plane's too
// (envd has its own GET /health), but the answers are not its.
func sandboxTraffic(req *http.Request) bool {
	if req.Header.Get("E2b-Sandbox-Id") != "" {
		return true
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	label, _, _ := strings.Cut(host, ".")
	port, id, ok := strings.Cut(label, "-")
	if !ok || len(id) != 20 {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}
