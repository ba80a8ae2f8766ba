package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/node"
)

// echoNode is a node with one running sandbox whose every port is an
// HTTP server answering the headers it got, as JSON.
type echoNode struct {
	node.Node // the rest is not called
	addr      string
}

func (n *echoNode) Reach(ctx context.Context, id string, port int) (*node.Target, error) {
	return &node.Target{Addr: n.addr, Ctx: ctx, Release: func() {}}, nil
}

func (n *echoNode) Transport() http.RoundTripper { return http.DefaultTransport }

const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

func echoServer(t *testing.T) *Server {
	t.Helper()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	}))
	t.Cleanup(echo.Close)
	return New(Config{APIKey: testKey, Domain: "example.test", MaxJSONBytes: 1 << 20},
		&echoNode{addr: strings.TrimPrefix(echo.URL, "http://")}, slog.New(slog.DiscardHandler),
		prometheus.NewRegistry(), http.NotFoundHandler())
}

// TestProxyStripsCredentials: no credential of aenv's reaches a sandbox's
// code, by either route to its ports, while what envd and the sandbox's
// own services need passes. Before, the port routes forwarded X-API-Key
// (on a node of a cluster, the cluster secret a gateway put there).
func TestProxyStripsCredentials(t *testing.T) {
	const id = "i0123456789abcdefghi"
	s := echoServer(t)
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string]string
		gone    []string
		kept    []string
	}{
		{name: "port route with the key", host: "8080-" + id + ".example.test",
			headers: map[string]string{"X-API-Key": testKey, "Cookie": "app=1", "X-App": "x"},
			gone:    []string{"X-Api-Key"}, kept: []string{"Cookie", "X-App"}},
		{name: "port route with the key as a bearer token", host: "8080-" + id + ".example.test",
			headers: map[string]string{"Authorization": "Bearer " + testKey}, gone: []string{"Authorization"}},
		{name: "port route with the app's own key", host: "8080-" + id + ".example.test",
			headers: map[string]string{"X-API-Key": "app-key"}, kept: []string{"X-Api-Key"}},
		{name: "port route with the app's own bearer token", host: "8080-" + id + ".example.test",
			headers: map[string]string{"Authorization": "Bearer app-token"}, kept: []string{"Authorization"}},
		{name: "header route to a port", host: "anything",
			headers: map[string]string{HeaderSandboxID: id, HeaderSandboxPort: "8080", "X-API-Key": testKey},
			gone:    []string{"X-Api-Key"}},
		{name: "envd keeps its token and user", host: "anything",
			headers: map[string]string{HeaderSandboxID: id, "X-API-Key": testKey, "X-Access-Token": "envd-token",
				"Authorization": "Basic cm9vdDo="},
			gone: []string{"X-Api-Key"}, kept: []string{"X-Access-Token", "Authorization", HeaderSandboxID}},
		{name: "envd gets no bearer token", host: "anything",
			headers: map[string]string{HeaderSandboxID: id, "Authorization": "Bearer whatever"},
			gone:    []string{"Authorization"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			var got http.Header
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatalf("echo: %v: %s", err, w.Body)
			}
			for _, h := range tc.gone {
				if v := got.Get(h); v != "" {
					t.Errorf("the sandbox got %s: %q", h, v)
				}
			}
			for _, h := range tc.kept {
				if got.Get(h) != r.Header.Get(h) {
					t.Errorf("the sandbox got %s %q, want %q", h, got.Get(h), r.Header.Get(h))
				}
			}
		})
	}
}

// TestRequireKeyLimitsFailures: an address sending wrong keys gets 429
// after a burst; the right key still passes from it, and other addresses
// are not affected. An over-long key is refused like a wrong one.
func TestRequireKeyLimitsFailures(t *testing.T) {
	s := echoServer(t)
	do := func(addr, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/nothing-here", nil)
		r.RemoteAddr = addr + ":1"
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	if w := do("192.0.2.1", testKey+strings.Repeat("x", 1<<20)); w.Code != http.StatusUnauthorized {
		t.Errorf("the key with 1 MiB after it: status %d, want 401", w.Code)
	}
	limited := false
	for i := range 200 {
		w := do("192.0.2.1", fmt.Sprintf("guess-%d", i))
		if w.Code == http.StatusTooManyRequests {
			limited = true
			if w.Header().Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			break
		}
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: status %d", i, w.Code)
		}
	}
	if !limited {
		t.Fatal("200 wrong keys from one address were all answered 401; want 429 after a burst")
	}
	if w := do("192.0.2.1", testKey); w.Code != http.StatusNotFound {
		t.Errorf("the right key from a limited address: status %d, want through (404)", w.Code)
	}
	if w := do("192.0.2.2", "guess"); w.Code != http.StatusUnauthorized {
		t.Errorf("another address: status %d, want 401", w.Code)
	}
}

// TestAuthLimiterBounded: the limiter remembers at most authAddrs
// addresses, however many fail; IPv6 clients count by their /64.
func TestAuthLimiterBounded(t *testing.T) {
	l := NewAuthLimiter()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for i := range 3 * authAddrs {
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:1", i>>16, (i>>8)&255, i&255)
		l.Failed(r)
	}
	if n := l.limiters.Len(); n > authAddrs {
		t.Errorf("%d addresses remembered, want at most %d", n, authAddrs)
	}
	for i := range authFailBurst {
		r.RemoteAddr = fmt.Sprintf("[2001:db8::%x]:1", i+1)
		l.Failed(r)
	}
	r.RemoteAddr = "[2001:db8::ffff]:1"
	if _, blocked := l.Blocked(r); !blocked {
		t.Error("a /64 that used its burst from many addresses is not limited")
	}
}

// TestAuthLimiterRate: an address may fail authFailBurst times at once,
// then once per authFailEvery; Blocked says when the next failure is
// allowed; other addresses keep their own burst.
func TestAuthLimiterRate(t *testing.T) {
	l := NewAuthLimiter()
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	for i := range authFailBurst {
		if retry, blocked := l.Blocked(r); blocked {
			t.Fatalf("blocked (retry in %v) after %d failures, want a burst of %d", retry, i, authFailBurst)
		}
		l.Failed(r)
	}
	for _, step := range []struct {
		advance     time.Duration
		wantBlocked bool
		wantRetry   time.Duration
	}{
		{0, true, authFailEvery},
		{authFailEvery / 4, true, authFailEvery * 3 / 4},
		{authFailEvery / 4, true, authFailEvery / 2},
		{authFailEvery / 2, false, 0},
	} {
		now = now.Add(step.advance)
		retry, blocked := l.Blocked(r)
		if blocked != step.wantBlocked || retry != step.wantRetry {
			t.Fatalf("at +%v: Blocked = %v, %v; want %v, %v", now.Sub(time.Unix(1000, 0)), retry, blocked,
				step.wantRetry, step.wantBlocked)
		}
	}
	l.Failed(r) // uses the one token refilled
	if retry, blocked := l.Blocked(r); !blocked || retry != authFailEvery {
		t.Errorf("after the refilled failure: Blocked = %v, %v; want %v, true", retry, blocked, authFailEvery)
	}
	now = now.Add(authFailBurst * authFailEvery * 10) // refills to the burst, no more
	for i := range authFailBurst {
		if _, blocked := l.Blocked(r); blocked {
			t.Fatalf("blocked after %d failures following a long pause, want a full burst", i)
		}
		l.Failed(r)
	}
	if _, blocked := l.Blocked(r); !blocked {
		t.Error("not blocked after a burst following a long pause; the burst grew past its bound")
	}
	r.RemoteAddr = "192.0.2.2:1"
	if _, blocked := l.Blocked(r); blocked {
		t.Error("another address is blocked")
	}
}
