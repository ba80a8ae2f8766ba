package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"testing"
	"time"
)

// fakeEnvdPort is where fakeenvd listens, as envd does.
const fakeEnvdPort = 49983

// envdState mirrors fakeenvd's GET /state reply.
type envdState struct {
	Nonce    string `json:"nonce"`
	Counter  int64  `json:"counter"`
	CPUs     int    `json:"cpus"`
	Hostname string `json:"hostname"`
}

// guest talks to fakeenvd inside one sandbox.
type guest struct {
	addr   netip.Addr
	client *http.Client
}

// guestCallBound bounds one call to fakeenvd: generous, because filling or
// summing 256 MiB inside gVisor takes seconds on a loaded 2-core machine.
// Checks that a sandbox does not answer use their own short deadlines.
const guestCallBound = 60 * time.Second

func newGuest(addr netip.Addr) *guest {
	return &guest{addr: addr, client: &http.Client{Timeout: guestCallBound}}
}

func (g *guest) url(path string, query url.Values) string {
	u := url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", g.addr, fakeEnvdPort), Path: path, RawQuery: query.Encode()}
	return u.String()
}

func (g *guest) do(ctx context.Context, method, path string, query url.Values) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, g.url(path, query), nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (g *guest) state(ctx context.Context) (envdState, error) {
	var st envdState
	code, body, err := g.do(ctx, http.MethodGet, "/state", nil)
	if err != nil {
		return st, err
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("GET /state: status %d: %s", code, body)
	}
	return st, json.Unmarshal(body, &st)
}

// mustState fetches /state or fails the test.
func (g *guest) mustState(t testing.TB) envdState {
	t.Helper()
	st, err := g.state(t.Context())
	if err != nil {
		t.Fatalf("fakeenvd at %s: %v", g.addr, err)
	}
	return st
}

// waitReady polls /state until fakeenvd answers and returns how long it took.
func (g *guest) waitReady(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var lastErr error
	for time.Since(start) < timeout {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		_, lastErr = g.state(ctx)
		cancel()
		if lastErr == nil {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fakeenvd at %s not ready after %v: %v", g.addr, timeout, lastErr)
	return 0
}

func (g *guest) writeFile(t testing.TB, path, data string) {
	t.Helper()
	code, body, err := g.do(t.Context(), http.MethodPost, "/file", url.Values{"path": {path}, "data": {data}})
	if err != nil || code != http.StatusOK {
		t.Fatalf("write %s at %s: %d %v %s", path, g.addr, code, err, body)
	}
}

// readFile returns the file's content and whether it exists.
func (g *guest) readFile(t testing.TB, path string) (string, bool) {
	t.Helper()
	code, body, err := g.do(t.Context(), http.MethodGet, "/file", url.Values{"path": {path}})
	switch {
	case err != nil:
		t.Fatalf("read %s at %s: %v", path, g.addr, err)
	case code == http.StatusNotFound:
		return "", false
	case code != http.StatusOK:
		t.Fatalf("read %s at %s: status %d: %s", path, g.addr, code, body)
	}
	return string(body), true
}

// answers says whether fakeenvd replies within a short time; for checks
// that a sandbox is gone or stopped.
func (g *guest) answers(t testing.TB) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := g.state(ctx)
	return err == nil
}

// alloc makes fakeenvd fill mb MiB of memory and returns its checksum.
func (g *guest) alloc(t testing.TB, mb int) string {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, g.url("/alloc", url.Values{"mb": {fmt.Sprint(mb)}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("alloc %d MiB at %s: %v", mb, g.addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("alloc %d MiB at %s: %d %v %s", mb, g.addr, resp.StatusCode, err, body)
	}
	return string(body)
}

// allocSum returns the checksum of the memory alloc filled, recomputed.
func (g *guest) allocSum(t testing.TB) string {
	t.Helper()
	code, body, err := g.do(t.Context(), http.MethodGet, "/alloc", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /alloc at %s: %d %v %s", g.addr, code, err, body)
	}
	return string(body)
}
