package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/secret"
)

// TestInterceptSetsHeaders drives an intercepted host on loopback: the
// "real" host has a certificate of a CA of the test's, which the gateway
// is told to trust; the sandbox trusts the gateway's CA.
func TestInterceptSetsHeaders(t *testing.T) {
	hostCA, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var seenMu sync.Mutex
	var seen []string
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenMu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s auth=%q static=%q xff=%q query=%q", r.Host, r.URL.Path, r.Header.Get("Authorization"),
			r.Header.Get("X-Static"), r.Header.Get("X-Forwarded-For"), r.URL.RawQuery))
		seenMu.Unlock()
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "ok %s body=%s", r.URL.Path, body)
	}), TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return hostCA.leaf(h.ServerName) }}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.ServeTLS(ln, "", "")
	t.Cleanup(func() { up.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	takeSeen := func() []string {
		seenMu.Lock()
		defer seenMu.Unlock()
		out := seen
		seen = nil
		return out
	}

	gwCA, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(hostCA.CertPEM())
	var secretsMu sync.Mutex
	values := map[string]string{"lab/key": "s3cret"}
	g := testGateway(t, "127.0.0.1 api.test plain.test bad.test other.test\n", func() netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(port))
	})
	g.cfg.CA, g.cfg.UpstreamRoots = gwCA, roots
	g.cfg.Secrets = func(_ context.Context, team, name string) (string, error) {
		secretsMu.Lock()
		defer secretsMu.Unlock()
		v, ok := values[team+"/"+name]
		if !ok {
			return "", fmt.Errorf("%w %q", secret.ErrUnknown, name)
		}
		return v, nil
	}
	pol := mustPolicy(t, []string{"api.test", "plain.test", "bad.test"}, []string{"0.0.0.0/0"})
	pol.Team = "lab"
	pol.Rules, err = network.ParseRules(map[string][]map[string]string{
		"api.test": {{"Authorization": "Bearer ${e2b.secrets.key}"}, {"x-static": "v"}},
		"bad.test": {{"Authorization": "Bearer ${e2b.secrets.nope}"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), pol, false)
	_, proxyPort := g.Ports()

	// The sandbox: it trusts the gateway's CA (as sandbox.trustEgressCA
	// makes it), and every connection goes to the gateway.
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM(gwCA.CertPEM())
	client := func(roots *x509.CertPool) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", proxyPort))
			},
			TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	}
	do := func(c *http.Client, method, url, host, auth, body string) (string, error) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if host != "" {
			req.Host = host
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}
	inside := client(sandboxRoots)
	base := fmt.Sprintf("https://api.test:%d", port)

	// The rule's headers replace the sandbox's own; requests on one
	// connection each get them; bodies pass.
	for i, path := range []string{"/a", "/b"} {
		got, err := do(inside, "POST", base+path, "", "Bearer the-sandbox's-own", "payload")
		if err != nil || got != "200 ok "+path+" body=payload" {
			t.Fatalf("request %d: %q %v", i, got, err)
		}
	}
	want := fmt.Sprintf(`api.test:%d /a auth="Bearer s3cret" static="v" xff="" query=""`, port)
	if s := takeSeen(); len(s) != 2 || s[0] != want {
		t.Fatalf("the host saw %q, want %q first", s, want)
	}

	// The sandbox's own hop headers cannot remove the rule's, and the
	// request otherwise goes up as it was sent (its forwarding headers,
	// its query unparsed).
	req, _ := http.NewRequest("GET", base+"/h?a=1;b=2", nil)
	req.Header.Set("Connection", "Authorization")
	req.Header.Set("X-Forwarded-For", "10.9.8.7")
	if resp, err := inside.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if s := takeSeen(); len(s) != 1 || !strings.Contains(s[0], `auth="Bearer s3cret"`) || !strings.Contains(s[0], `xff="10.9.8.7"`) ||
		!strings.Contains(s[0], `query="a=1;b=2"`) {
		t.Fatalf("with Connection: Authorization the host saw %q", s)
	}

	// An update of the secret reaches the next request.
	secretsMu.Lock()
	values["lab/key"] = "rotated"
	secretsMu.Unlock()
	if _, err := do(inside, "GET", base+"/c", "", "", ""); err != nil {
		t.Fatal(err)
	}
	if s := takeSeen(); len(s) != 1 || !strings.Contains(s[0], `auth="Bearer rotated"`) {
		t.Fatalf("after the update the host saw %q", s)
	}

	// Another host over the intercepted connection is refused, never
	// sent with this one's headers.
	if got, err := do(inside, "GET", base+"/d", "other.test", "", ""); err != nil || !strings.HasPrefix(got, "421 aenv egress: the request is for \"other.test\"") {
		t.Fatalf("another Host: %q %v", got, err)
	}
	// A placeholder of an unknown secret fails the request at the
	// gateway: nothing reaches the host.
	got, err := do(inside, "GET", fmt.Sprintf("https://bad.test:%d/e", port), "", "", "")
	if err != nil || !strings.HasPrefix(got, "502 aenv egress: header Authorization of the rule for bad.test: unknown secret \"nope\"") {
		t.Fatalf("an unknown secret: %q %v", got, err)
	}
	if s := takeSeen(); len(s) != 0 {
		t.Fatalf("the host saw %q", s)
	}

	// A host without rules is never intercepted: the sandbox sees the
	// host's own certificate (its CA, not the gateway's), and the
	// request passes untouched.
	if _, err := do(inside, "GET", fmt.Sprintf("https://plain.test:%d/f", port), "", "", ""); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("plain.test with the gateway's CA: %v, want a certificate error (not intercepted)", err)
	}
	hostRoots := x509.NewCertPool()
	hostRoots.AppendCertsFromPEM(hostCA.CertPEM())
	if got, err := do(client(hostRoots), "GET", fmt.Sprintf("https://plain.test:%d/f", port), "", "Bearer mine", ""); err != nil || !strings.HasPrefix(got, "200") {
		t.Fatalf("plain.test: %q %v", got, err)
	}
	if s := takeSeen(); len(s) != 1 || !strings.Contains(s[0], `auth="Bearer mine"`) {
		t.Fatalf("plain.test: the host saw %q", s)
	}

	// A rule removed stops the secret on a connection already open: its
	// next request is refused, and a new connection passes untouched.
	noRules := pol
	noRules.Rules = nil
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), noRules, false)
	got, err = do(inside, "GET", base+"/g", "", "", "")
	if err != nil || !strings.HasPrefix(got, "403 aenv egress: the sandbox's rules for api.test changed") {
		t.Fatalf("a request on an open connection after the rule went: %q %v", got, err)
	}
	if s := takeSeen(); len(s) != 0 {
		t.Fatalf("after the rule went the host saw %q", s)
	}
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), pol, false)

	// The log says which connections were intercepted, and how many
	// requests went on (the sandbox's client may spread them over
	// connections).
	waitUntil(t, func() bool {
		var requests int64
		for _, e := range g.Events(1) {
			if e.Transform == "api.test" && e.Host == "api.test" {
				requests += e.Requests
			}
		}
		return requests == 4
	})
}
