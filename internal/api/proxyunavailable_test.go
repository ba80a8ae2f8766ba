package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/node"
)

// silentNode is a node whose one sandbox runs but does not answer.
type silentNode struct {
	node.Node // the rest is not called
}

func (silentNode) Reach(ctx context.Context, id string, port int) (*node.Target, error) {
	return nil, fmt.Errorf("%w: sandbox %s is not answering", node.ErrUnavailable, id)
}

func (silentNode) Transport() http.RoundTripper { return http.DefaultTransport }

// TestProxySilentSandbox: a new call through the proxy to a sandbox that
// runs but does not answer is answered 503 saying so, by both routes to
// its ports, never E2B's 502 "not found" (which SDKs take as its end).
func TestProxySilentSandbox(t *testing.T) {
	const id = "i0123456789abcdefghi"
	s := New(Config{APIKey: testKey, Domain: "example.test", MaxJSONBytes: 1 << 20},
		silentNode{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), http.NotFoundHandler())
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string]string
	}{
		{name: "envd by header", host: "anything", headers: map[string]string{HeaderSandboxID: id}},
		{name: "port route", host: "8080-" + id + ".example.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "not answering") {
				t.Fatalf("status %d: %s; want 503 saying it is not answering", w.Code, w.Body)
			}
		})
	}
}
