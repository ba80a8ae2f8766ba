package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Attacks on the API and the proxy in front of sandboxes (see
// docs/security.md). Each test first mounts the attack, then checks that
// the server refuses it and still serves legitimate requests.

// anonymous sends a request without the API key.
func anonymous(t *testing.T, method, rawURL, host string, headers ...string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// proxyError is the proxy's JSON error (upstream E2B's shape).
type proxyError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
	Port      int    `json:"port"`
}

func decodeProxyError(t *testing.T, body []byte) proxyError {
	t.Helper()
	var e proxyError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e
}

// TestSecurityPortRoutes: the E2b-Sandbox-Id/-Port header route follows the
// same rule as the <port>-<id>.<domain> Host route, closed ports get E2B's
// answer, and /metrics names no sandbox without the key.
func TestSecurityPortRoutes(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	public := s.create(nil).SandboxID
	var priv struct {
		SandboxID          string `json:"sandboxID"`
		TrafficAccessToken string `json:"trafficAccessToken"`
	}
	s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"network": map[string]any{"allowPublicTraffic": false}}), 201, "create private").json(t, &priv)
	if priv.TrafficAccessToken == "" {
		t.Fatal("private sandbox has no traffic token")
	}
	for _, id := range []string{public, priv.SandboxID} {
		s.exec(id, client.ExecuteRequest{Command: "mkdir -p /tmp/www && echo page-" + id + " > /tmp/www/index.html && cd /tmp/www && nohup python3 -m http.server 8080 >/dev/null 2>&1 &"})
	}
	viaHeaders := func(id string, port int, extra ...string) (int, []byte) {
		return anonymous(t, "GET", s.url+"/index.html", "",
			append([]string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(port)}, extra...)...)
	}
	viaHost := func(id string, port int, extra ...string) (int, []byte) {
		return anonymous(t, "GET", s.url+"/index.html", fmt.Sprintf("%d-%s.localhost", port, id), extra...)
	}
	waitFor(t, 30*time.Second, "web server in the public sandbox", func() bool {
		code, _ := viaHeaders(public, 8080)
		return code == 200
	})

	// The attack: no key, no token, the private sandbox's page by header.
	for name, get := range map[string]func(string, int, ...string) (int, []byte){"header route": viaHeaders, "host route": viaHost} {
		code, body := get(priv.SandboxID, 8080)
		if code != 403 {
			t.Fatalf("%s: private port without token answered %d %q", name, code, truncate(body))
		}
		e := decodeProxyError(t, body)
		if e.SandboxID != priv.SandboxID || e.Code != 403 ||
			e.Message != "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing" {
			t.Fatalf("%s: missing-token answer %s", name, body)
		}
		code, body = get(priv.SandboxID, 8080, "E2b-Traffic-Access-Token", "wrong")
		if e := decodeProxyError(t, body); code != 403 || !strings.Contains(e.Message, "is invalid") {
			t.Fatalf("%s: wrong token answered %d %s", name, code, body)
		}
		waitFor(t, 30*time.Second, name+" with the token", func() bool {
			code, body := get(priv.SandboxID, 8080, "E2b-Traffic-Access-Token", priv.TrafficAccessToken)
			return code == 200 && string(body) == "page-"+priv.SandboxID+"\n"
		})
		if code, body := get(public, 8080); code != 200 || string(body) != "page-"+public+"\n" {
			t.Fatalf("%s: public port: %d %q", name, code, body)
		}
	}
	// envd's port needs no traffic token (envd checks its own): the SDK's
	// traffic to a private sandbox keeps working.
	if code, body := anonymous(t, "GET", s.url+"/health", "", "E2b-Sandbox-Id", priv.SandboxID, "E2b-Sandbox-Port", "49983"); code/100 != 2 {
		t.Fatalf("envd health of a private sandbox: %d %s", code, body)
	}
	if code, body := anonymous(t, "POST", s.url+"/process.Process/List", "", "E2b-Sandbox-Id", priv.SandboxID); code != 401 {
		t.Fatalf("envd RPC without its access token: %d %s", code, body)
	}

	// A closed port of a running sandbox: E2B's "port is not open", by
	// either route, naming sandbox and port.
	for name, get := range map[string]func(string, int, ...string) (int, []byte){"header route": viaHeaders, "host route": viaHost} {
		code, body := get(public, 9999)
		e := decodeProxyError(t, body)
		if code != 502 || e.SandboxID != public || e.Port != 9999 || e.Code != 502 ||
			e.Message != "The sandbox is running but port is not open" {
			t.Fatalf("%s: closed port answered %d %s", name, code, body)
		}
		code, body = get("nosuchsandbox0000000", 8080)
		if e := decodeProxyError(t, body); code != 502 || e.SandboxID != "nosuchsandbox0000000" || e.Message != "The sandbox was not found" {
			t.Fatalf("%s: unknown sandbox answered %d %s", name, code, body)
		}
	}

	// /metrics lists sandboxes by ID: only with the key.
	code, body := anonymous(t, "GET", s.url+"/metrics", "")
	if code != 401 || bytes.Contains(body, []byte(public)) {
		t.Fatalf("/metrics without key: %d, names the sandbox: %v", code, bytes.Contains(body, []byte(public)))
	}
	for _, auth := range [][]string{{"X-API-Key", apiKey}, {"Authorization", "Bearer " + apiKey}} {
		code, body := anonymous(t, "GET", s.url+"/metrics", "", auth...)
		if code != 200 || !bytes.Contains(body, []byte("aenv_sandboxes_live")) {
			t.Fatalf("/metrics with %s: %d", auth[0], code)
		}
	}
}

// TestSecurityMetricsListener: --metrics-listen serves the metrics without
// a key on an address of the operator's choosing, and nothing else.
func TestSecurityMetricsListener(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newServer(t, "--metrics-listen", addr)
	s.start()
	id := s.create(nil).SandboxID
	code, body := anonymous(t, "GET", "http://"+addr+"/metrics", "")
	if code != 200 || !bytes.Contains(body, []byte(`sandbox_id="`+id+`"`)) {
		t.Fatalf("metrics listener: %d, has the sandbox: %v", code, bytes.Contains(body, []byte(id)))
	}
	if code, _ := anonymous(t, "GET", "http://"+addr+"/sandboxes", ""); code != 404 {
		t.Fatalf("metrics listener serves the API: %d", code)
	}
}

// vmHWM is the peak resident memory of a process, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// streamed sends an authenticated request and reads the answer without
// keeping it: its size, and its first and last bytes.
func (s *server) streamed(t *testing.T, method, path string, body any) (status int, size int64, head, tailBytes string) {
	t.Helper()
	enc, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, s.url+path, bytes.NewReader(enc))
	req.Header.Set("X-API-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 1<<16)
	first, _ := br.Peek(64)
	head = string(first)
	var last []byte
	buf := make([]byte, 1<<16)
	for {
		n, err := br.Read(buf)
		size += int64(n)
		if n > 0 {
			last = append(last, buf[:n]...)
			if len(last) > 256 {
				last = last[len(last)-256:]
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s %s: read: %v", method, path, err)
		}
	}
	return resp.StatusCode, size, head, string(last)
}

// TestSecurityLargeAnswers: answers whose JSON escaping multiplies their
// size (control bytes become \u00XX) cost the server a bounded amount of
// memory, not gigabytes.
func TestSecurityLargeAnswers(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	id := s.create(nil).SandboxID
	pid := s.cmd.Process.Pid
	if r := s.exec(id, client.ExecuteRequest{Command: `head -c 32M /dev/zero | tr '\0' '\1' > /tmp/ones`}); r.ExitCode != 0 {
		t.Fatalf("make file: %+v", r)
	}
	base := vmHWM(t, pid)

	status, size, head, _ := s.streamed(t, "GET", "/sandboxes/"+id+"/files/read?path=/tmp/ones", nil)
	if status != 200 || size < 6*32<<20 || !strings.HasPrefix(head, `{"content":"\u0001\u0001`) {
		t.Fatalf("files/read: status %d, %d bytes, head %q", status, size, head)
	}
	afterRead := vmHWM(t, pid)
	t.Logf("files/read of 32 MiB of \\x01 (%d MiB answer): server peak RSS %d -> %d MiB", size>>20, base>>20, afterRead>>20)
	// Before streaming this took about 1 GiB more.
	if grown := afterRead - base; grown > 512<<20 {
		t.Fatalf("files/read of 32 MiB grew the server's peak RSS by %d MiB", grown>>20)
	}

	status, size, head, tailText := s.streamed(t, "POST", "/sandboxes/"+id+"/execute", map[string]any{
		"command": `head -c 70M /dev/zero | tr '\0' '\1'; head -c 70M /dev/zero | tr '\0' '\1' >&2`,
	})
	if status != 200 || size < 2*6*64<<20 || !strings.HasPrefix(head, `{"exitCode":0,"stdout":"\u0001`) ||
		!strings.HasSuffix(strings.TrimSpace(tailText), `"truncated":true}`) {
		t.Fatalf("execute: status %d, %d bytes, head %q, tail %q", status, size, head, tailText)
	}
	afterExec := vmHWM(t, pid)
	t.Logf("execute printing 2 x 70 MiB of \\x01 (%d MiB answer): server peak RSS %d -> %d MiB", size>>20, afterRead>>20, afterExec>>20)
	// The output is held once (64 MiB per stream at most) and streamed;
	// before, this took the server from 30 MB to 3.3 GB.
	if grown := afterExec - base; grown > 1<<30 {
		t.Fatalf("execute grew the server's peak RSS by %d MiB", grown>>20)
	}
	if r := s.exec(id, client.ExecuteRequest{Command: "echo alive"}); r.Stdout != "alive\n" {
		t.Fatalf("after the large answers: %+v", r)
	}
}

// TestSecurityIdleConnections: thousands of idle connections from an
// anonymous client neither exhaust the server's descriptors nor keep
// /health, the API and the envd proxy from answering.
func TestSecurityIdleConnections(t *testing.T) {
	t.Parallel()
	// The server is left 1024 descriptors, so that a flood of a few
	// thousand connections is enough to exhaust them; its connection limit
	// is what it would derive from that (see autoMaxConns).
	s := newServer(t, "--max-connections", "256")
	s.start()
	low := unix.Rlimit{Cur: 1024, Max: 1024}
	if err := unix.Prlimit(s.cmd.Process.Pid, unix.RLIMIT_NOFILE, &low, nil); err != nil {
		t.Fatalf("lower the server's RLIMIT_NOFILE: %v", err)
	}
	id := s.create(nil).SandboxID

	// The attack: 3000 connections, half idle after one keep-alive request,
	// half never sending anything.
	const flood = 3000
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dialFailures := 0
	for i := 0; i < flood; i++ {
		c, err := net.DialTimeout("tcp", s.addr, 2*time.Second)
		if err != nil {
			dialFailures++
			continue
		}
		conns = append(conns, c)
		if i%2 == 0 {
			fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		}
	}
	t.Logf("%d connections open (%d dials failed)", len(conns), dialFailures)

	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	check := func(what string, req *http.Request, want int) {
		t.Helper()
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s during the flood: %v", what, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s during the flood: status %d", what, resp.StatusCode)
		}
		t.Logf("%s answered in %v", what, time.Since(start).Round(time.Millisecond))
	}
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("GET", s.url+"/health", nil)
		check("/health", req, 200)
	}
	req, _ := http.NewRequest("GET", s.url+"/sandboxes", nil)
	req.Header.Set("X-API-Key", apiKey)
	check("list", req, 200)
	req, _ = http.NewRequest("GET", s.url+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	check("envd proxy", req, 204)
	body, _ := json.Marshal(map[string]any{"command": "echo still here"})
	req, _ = http.NewRequest("POST", s.url+"/sandboxes/"+id+"/execute", bytes.NewReader(body))
	req.Header.Set("X-API-Key", apiKey)
	check("execute", req, 200)
}

// TestSecurityRequestBounds: values that used to be taken silently (or
// wrapped around, or ended in a 500) get a clear 4xx and change nothing.
func TestSecurityRequestBounds(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	id := s.create(nil).SandboxID
	huge := map[string]string{}
	for i := 0; i < 20; i++ {
		huge[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 1<<20)
	}
	wide := map[string]string{}
	for i := 0; i < 20; i++ {
		wide[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 4000)
	}
	exec := "/sandboxes/" + id + "/execute"
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		status int
	}{
		{"exec timeout 1e300", "POST", exec, map[string]any{"command": "true", "timeout": 1e300}, 400},
		{"exec timeout 1e19", "POST", exec, map[string]any{"command": "true", "timeout": 1e19}, 400},
		{"exec timeout 1e-12", "POST", exec, map[string]any{"command": "true", "timeout": 1e-12}, 400},
		{"exec env name with =", "POST", exec, map[string]any{"command": "true", "envs": map[string]string{"A=B": "c"}}, 400},
		{"exec env name with newline", "POST", exec, map[string]any{"command": "true", "envs": map[string]string{"A\nB": "c"}}, 400},
		{"create timeout 2^64 ns", "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 18446744074}, 400},
		{"create 20 MB metadata", "POST", "/sandboxes", map[string]any{"templateID": "base", "metadata": huge}, 400},
		{"create 80 KB metadata", "POST", "/sandboxes", map[string]any{"templateID": "base", "metadata": wide}, 400},
		{"create env name with =", "POST", "/sandboxes", map[string]any{"templateID": "base", "envVars": map[string]string{"A=B": "c"}}, 400},
		{"create env name with newline", "POST", "/sandboxes", map[string]any{"templateID": "base", "envVars": map[string]string{"A\nB": "c"}}, 400},
		{"write into the read-only envd mount", "POST", "/sandboxes/" + id + "/files/write", map[string]string{"path": "/.aenv/envd", "content": "x"}, 400},
		{"raw write into sysfs", "PUT", "/sandboxes/" + id + "/files?path=/sys/kernel/x", "x", 400},
		{"read /proc/1/mem", "GET", "/sandboxes/" + id + "/files/read?path=" + url.QueryEscape("/proc/1/mem"), nil, 400},
		// Last: before the fix this killed the sandbox 0.29 s later.
		{"set timeout 2^64 ns", "POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 18446744074}, 400},
	}
	// A procfs file that can be read streams (E2B's envd does, and the
	// Python SDK reads boot IDs this way); the sandbox's own processes are
	// its user's to read.
	s.expect(s.do("GET", "/sandboxes/"+id+"/files/read?path="+url.QueryEscape("/proc/1/environ"), nil), 200, "read /proc/1/environ")
	// gVisor's sysrq-trigger reads as empty: an empty answer, not an error.
	if r := s.expect(s.do("GET", "/sandboxes/"+id+"/files?path="+url.QueryEscape("/proc/sysrq-trigger"), nil), 200, "read /proc/sysrq-trigger"); len(r.body) != 0 {
		t.Errorf("/proc/sysrq-trigger read as %q", truncate(r.body))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(tc.method, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, truncate(r.body))
			}
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			r.json(t, &e)
			if e.Code != r.status || e.Message == "" || e.Message == "internal error" {
				t.Fatalf("error body %s", truncate(r.body))
			}
			t.Logf("%d %s", r.status, e.Message)
		})
	}
	// Nothing above created a sandbox or hurt the one there.
	time.Sleep(time.Second) // a wrapped 0.29 s deadline would have fired by now
	var list []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes", nil), 200, "list").json(t, &list)
	if len(list) != 1 || list[0].SandboxID != id {
		t.Fatalf("bad requests had side effects: %d sandboxes", len(list))
	}
	if res := s.exec(id, client.ExecuteRequest{Command: "echo fine"}); res.Stdout != "fine\n" {
		t.Fatalf("sandbox broken: %+v", res)
	}
}
