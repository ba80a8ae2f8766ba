package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/tlscert"
)

// TestTLSListenerSharesConnectionLimit: the HTTPS listener draws on the
// plain listener's connection budget, and its idle connections (a
// finished handshake, or none yet) are evicted for new clients like plain
// ones, so that neither listener can be locked out by idle TLS clients.
func TestTLSListenerSharesConnectionLimit(t *testing.T) {
	const max = 16
	src, err := tlscert.New(tlscert.Config{Domain: "aenv.test", CADir: t.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	servers, err := apiListeners("test", "127.0.0.1:0", "127.0.0.1:0", src, ok, max, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, hs := range servers {
		go hs.serve()
		t.Cleanup(func() { hs.srv.Close() })
	}
	plainAddr, tlsAddr := servers[0].listener.Addr().String(), servers[1].listener.Addr().String()
	caPEM, err := tlscert.ReadCACert(filepath.Dir(src.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)

	// Idle TLS clients, three times the limit: half finish their handshake
	// and stay, half never send a byte.
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < 3*max; i++ {
		raw, err := net.DialTimeout("tcp", tlsAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, raw)
		if i%2 == 0 {
			c := tls.Client(raw, &tls.Config{ServerName: "api.aenv.test", RootCAs: roots})
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.Handshake() // an earlier one of ours may be evicted for it: the point
		}
	}
	get := func(url string, hc *http.Client) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s after an idle TLS flood: %v", url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	secure := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: "api.aenv.test", RootCAs: roots}}}
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < 3; i++ {
		get("https://"+tlsAddr+"/health", secure)
		get("http://"+plainAddr+"/health", plain)
	}
	l := servers[0].listener.(*connLimiter)
	l.mu.Lock()
	active := l.active
	l.mu.Unlock()
	if active > max {
		t.Fatalf("%d connections held over both listeners, limit %d", active, max)
	}
}

// TestSandboxHostsAllowLiveSandboxesOnly: the ACME host policy orders a
// certificate for a sandbox host only while that sandbox exists, and for
// none before the sandboxes can be asked about.
func TestSandboxHostsAllowLiveSandboxesOnly(t *testing.T) {
	const domain = "aenv.test"
	live, gone := "abcdefghij0123456789", "zzzzzzzzzz0123456789"
	h := newSandboxHosts(domain)
	ctx := context.Background()
	if h.allow(ctx, "8080-"+live+"."+domain) {
		t.Error("a sandbox host was allowed before the lookup was set")
	}
	h.set(func(_ context.Context, id string) (bool, error) { return id == live, nil })
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"8080-" + live + "." + domain, true},
		{"49983-" + live + "." + domain, true},
		{"8080-" + gone + "." + domain, false},
		{"8080-" + live + ".other.test", false},
		{"api." + domain, false},
	} {
		if got := h.allow(ctx, tc.host); got != tc.want {
			t.Errorf("allow(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

// TestSandboxHostsRememberMisses: handshakes naming a made-up sandbox
// cost one lookup per name, not one per handshake; a failed lookup is
// not taken for a miss, and live sandboxes are asked about every time.
func TestSandboxHostsRememberMisses(t *testing.T) {
	const domain = "aenv.test"
	live, unknown, flaky := "abcdefghij0123456789", "zzzzzzzzzz0123456789", "yyyyyyyyyy0123456789"
	h := newSandboxHosts(domain)
	lookups := map[string]int{}
	down := true
	h.set(func(_ context.Context, id string) (bool, error) {
		lookups[id]++
		if id == flaky && down {
			return false, errors.New("database down")
		}
		return id == live || id == flaky, nil
	})
	ctx := context.Background()
	for range 5 {
		h.allow(ctx, "8080-"+unknown+"."+domain)
		h.allow(ctx, "8080-"+live+"."+domain)
		h.allow(ctx, "8080-"+flaky+"."+domain)
	}
	if lookups[unknown] != 1 || lookups[live] != 5 || lookups[flaky] != 5 {
		t.Fatalf("lookups %v: want 1 for the unknown sandbox, 5 for the live one and for the failing lookups", lookups)
	}
	down = false // the database is back: the sandbox it could not see is allowed
	if !h.allow(ctx, "8080-"+flaky+"."+domain) {
		t.Fatal("a sandbox whose lookups had failed was refused once they worked")
	}
}
