package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/config"
)

// startLimited serves h on loopback behind a connLimiter of max connections.
func startLimited(t *testing.T, max int, h http.Handler) (*httpServer, string) {
	t.Helper()
	hs, err := newHTTPServer("test", "127.0.0.1:0", h, max, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go hs.serve()
	t.Cleanup(func() { hs.srv.Close() })
	return hs, hs.listener.Addr().String()
}

// get sends one request on a fresh connection and reads the answer.
func get(t *testing.T, addr, path string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// idleConns opens n connections: half send one keep-alive request and then
// stay idle, half never send anything.
func idleConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		if i%2 == 0 {
			fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				// An earlier idle connection of ours may be evicted for
				// this one; that is the point, not a failure.
				continue
			}
			resp.Body.Close()
		}
	}
	return conns
}

// TestConnLimiterEvictsIdle: idle connections beyond the limit cannot
// lock out a new client; the oldest idle ones make room.
func TestConnLimiterEvictsIdle(t *testing.T) {
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	hs, addr := startLimited(t, 32, health)
	idleConns(t, addr, 200)
	for i := 0; i < 5; i++ {
		if code, err := get(t, addr, "/health"); err != nil || code != 200 {
			t.Fatalf("request %d after idle flood: %d %v", i, code, err)
		}
	}
	l := hs.listener.(*connLimiter)
	l.mu.Lock()
	active := l.active
	l.mu.Unlock()
	if active > 32 {
		t.Fatalf("%d connections held, limit 32", active)
	}
}

// TestConnLimiterWaitsForBusy: when every connection is in a request, a
// new one waits for a slot instead of evicting work in progress.
func TestConnLimiterWaitsForBusy(t *testing.T) {
	release := make(chan struct{})
	var inFlight sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			inFlight.Done()
			<-release
		}
		w.WriteHeader(200)
	})
	_, addr := startLimited(t, 16, h)
	slow := make(chan error, 16)
	inFlight.Add(16)
	for i := 0; i < 16; i++ {
		go func() {
			code, err := get(t, addr, "/slow")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d", code)
			}
			slow <- err
		}()
	}
	inFlight.Wait()
	fast := make(chan error, 1)
	go func() { _, err := get(t, addr, "/fast"); fast <- err }()
	select {
	case err := <-fast:
		t.Fatalf("a 17th connection was served while 16 were busy (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	for i := 0; i < 16; i++ {
		if err := <-slow; err != nil {
			t.Fatalf("busy request cut: %v", err)
		}
	}
	if err := <-fast; err != nil {
		t.Fatalf("waiting request: %v", err)
	}
}

func TestAutoMaxConns(t *testing.T) {
	n, err := autoMaxConns()
	if err != nil {
		t.Fatal(err)
	}
	if n < 64 {
		t.Fatalf("auto limit %d", n)
	}
}

func TestGeneratedAPIKeyShape(t *testing.T) {
	// The pattern E2B's JavaScript SDK (up to 2.45) checks, at E2B's length.
	shape := regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	logger := slog.New(slog.DiscardHandler)
	key, err := loadAPIKey(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	if !shape.MatchString(key) {
		t.Fatalf("generated key %q is not e2b_ + 40 hex digits", key)
	}
	if again, err := loadAPIKey(cfg, logger); err != nil || again != key {
		t.Fatalf("second start: %q %v, want the kept %q", again, err, key)
	}
	if st, err := os.Stat(filepath.Join(cfg.DataDir, "api-key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}

	// A key file from before (any shape) keeps working; --api-key wins.
	old := config.Default()
	old.DataDir = t.TempDir()
	os.WriteFile(filepath.Join(old.DataDir, "api-key"), []byte("aenv_0123abcd\n"), 0o600)
	if got, _ := loadAPIKey(old, logger); got != "aenv_0123abcd" {
		t.Fatalf("kept key: %q", got)
	}
	old.APIKey = "anything goes"
	if got, _ := loadAPIKey(old, logger); got != "anything goes" {
		t.Fatalf("--api-key: %q", got)
	}
}
