package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/aenv-dev/aenv/internal/network"
)

// helloBytes captures the ClientHello crypto/tls sends for serverName.
func helloBytes(t *testing.T, serverName string) []byte {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		c := tls.Client(client, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
		c.Handshake() // fails when the pipe closes
	}()
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64<<10)
	n, err := io.ReadAtLeast(server, buf, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := 5 + int(buf[3])<<8 | int(buf[4])
	for n < want {
		m, err := server.Read(buf[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	server.Close()
	return buf[:n]
}

// splitRecords re-frames a one-record ClientHello into records of at most
// size bytes of handshake data each.
func splitRecords(rec []byte, size int) []byte {
	msg := rec[5:]
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, rec[0], rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// withExtension appends an empty extension of typ to a one-record
// ClientHello, fixing the lengths.
func withExtension(t *testing.T, rec []byte, typ uint16) []byte {
	t.Helper()
	body := append([]byte(nil), rec[9:]...)
	// version, random, session ID, suites, compression, then extensions.
	off := 2 + 32
	off += 1 + int(body[off])
	off += 2 + (int(body[off])<<8 | int(body[off+1]))
	off += 1 + int(body[off])
	extLen := int(body[off])<<8 | int(body[off+1]) + 4
	body[off], body[off+1] = byte(extLen>>8), byte(extLen)
	body = append(body, byte(typ>>8), byte(typ), 0, 0)
	msg := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 0x03, 0x01, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

func TestPeekClientHello(t *testing.T) {
	plain := helloBytes(t, "api.example.com")
	tests := []struct {
		name    string
		data    []byte
		want    clientHello
		wantErr string
	}{
		{"crypto/tls hello", plain, clientHello{serverName: "api.example.com"}, ""},
		{"split over records", splitRecords(plain, 100), clientHello{serverName: "api.example.com"}, ""},
		{"no SNI", helloBytes(t, ""), clientHello{}, ""},
		{"ECH", withExtension(t, plain, extECH), clientHello{serverName: "api.example.com", ech: true}, ""},
		{"ESNI", withExtension(t, plain, extESNI), clientHello{serverName: "api.example.com", esni: true}, ""},
		{"two server_name extensions", withExtension(t, plain, extServerName), clientHello{}, "repeats extension 0"},
		{"not a handshake", []byte("GET / HTTP/1.1\r\n\r\n"), clientHello{}, "not a TLS ClientHello"},
		{"truncated", plain[:len(plain)-10], clientHello{}, "read TLS record"},
		{"empty record", []byte{0x16, 3, 1, 0, 0}, clientHello{}, "TLS record of 0 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(bytes.NewReader(tt.data), readBufferSize)
			got, err := peekClientHello(br)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			// Nothing consumed: the hello goes upstream whole.
			if br.Buffered() != len(tt.data) {
				t.Errorf("%d bytes buffered, want %d", br.Buffered(), len(tt.data))
			}
		})
	}
}

func TestRequestHost(t *testing.T) {
	tests := []struct {
		req, want, wantErr string
	}{
		{"GET / HTTP/1.1\r\nHost: Example.COM:8080\r\n\r\n", "example.com", ""},
		{"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com", ""},
		{"CONNECT evil.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "", "CONNECT tunnels"},
		{"GET http://evil.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", "", "absolute-form"},
		{"GET / HTTP/1.1\r\n\r\n", "", "no Host"},
		{"GET / HTTP/1.0\r\nHost: example.com\r\n\r\n", "", "HTTP/1.1 only"},
		{"GET / HTTP/1.1\r\nHost: a\\.b.example.com\r\n\r\n", "", "invalid Host"},
	}
	for _, tt := range tests {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(tt.req)))
		if err != nil {
			t.Fatalf("%q: %v", tt.req, err)
		}
		got, err := requestHost(req)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: error %v, want %q", tt.req, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q: got %q, %v; want %q", tt.req, got, err, tt.want)
		}
	}
}

func TestLooksLikeHTTP(t *testing.T) {
	for in, want := range map[string]bool{
		"GET / HTTP/1.1\r\n": true, "OPTIONS * HTTP/1.1": true, "get / HTTP/1.1": false,
		"SSH-2.0-x\r\n": false, " GET": false, "\x16\x03\x01": false, "ABCDEFGHIJKLMNOPQRSTUVWXYZ ": false,
	} {
		if got := looksLikeHTTP(bufio.NewReader(strings.NewReader(in))); got != want {
			t.Errorf("looksLikeHTTP(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestEventLogKeepsTheNewest(t *testing.T) {
	l := newEventLog(3)
	for i := range 5 {
		l.add(&Event{Host: fmt.Sprint(i)})
	}
	var hosts []string
	for _, e := range l.events() {
		hosts = append(hosts, e.Host)
	}
	if got := strings.Join(hosts, ","); got != "2,3,4" {
		t.Errorf("events %s, want 2,3,4", got)
	}
}

// testGateway is a gateway on loopback whose "sandbox" is 127.0.0.1: the
// proxy's connections carry dst as their original destination.
func testGateway(t *testing.T, hosts string, dst func() netip.AddrPort) *Gateway {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{HostsFile: path, ListenAddr: "127.0.0.1", PeekTimeout: 2 * time.Second, DialTimeout: 2 * time.Second,
		originalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst(), nil }}
	g, err := Listen(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func mustPolicy(t *testing.T, allowOut, denyOut []string) network.Policy {
	t.Helper()
	pol, err := network.ParsePolicy(nil, allowOut, denyOut)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func TestDNSAnswersByPolicy(t *testing.T) {
	g := testGateway(t, "127.0.0.2 allowed.test other.test\n", func() netip.AddrPort { return netip.AddrPort{} })
	dnsPort, _ := g.Ports()
	server := fmt.Sprintf("127.0.0.1:%d", dnsPort)
	ask := func(name string, qtype uint16, transport string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		resp, _, err := (&dns.Client{Net: transport, Timeout: 5 * time.Second}).Exchange(m, server)
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		return resp
	}
	// No slot has the address yet: refused.
	if r := ask("allowed.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Errorf("unknown source: rcode %s", dns.RcodeToString[r.Rcode])
	}
	sandbox := netip.MustParseAddr("127.0.0.1")
	g.SetSlot(1, sandbox, mustPolicy(t, []string{"allowed.test"}, []string{"0.0.0.0/0"}), false)
	for _, transport := range []string{"udp", "tcp"} {
		r := ask("Allowed.Test", dns.TypeA, transport)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "127.0.0.2" {
			t.Errorf("%s: allowed name: %v", transport, r)
		}
		if r := ask("other.test", dns.TypeA, transport); r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: name not allowed: rcode %s", transport, dns.RcodeToString[r.Rcode])
		}
	}
	if r := ask("allowed.test", dns.TypeHTTPS, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("HTTPS record: %v, want an empty answer", r)
	}
	if ev := g.Events(1); len(ev) != 2 || ev[0].Host != "other.test" || ev[0].Verdict != VerdictDenied || ev[0].Protocol != "dns" {
		t.Errorf("events %+v, want the two refused queries", ev)
	}
	// A policy that lets the sandbox ask the resolvers: any name.
	undo := g.SetSlot(1, sandbox, mustPolicy(t, nil, nil), true)
	if r := ask("other.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("open policy: %v", r)
	}
	if len(g.Events(1)) != 2 {
		t.Error("a policy change on the same sandbox lost its log")
	}
	undo() // back to the first policy, not to nothing
	if r := ask("other.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeRefused {
		t.Errorf("after undo: rcode %s", dns.RcodeToString[r.Rcode])
	}
	g.ClearSlot(1)
	if r := ask("allowed.test", dns.TypeA, "udp"); r.Rcode != dns.RcodeRefused || g.Events(1) != nil {
		t.Errorf("cleared slot: rcode %s, events %v", dns.RcodeToString[r.Rcode], g.Events(1))
	}
}

// TestProxyJudgesByName drives the proxy on loopback: the upstream is a
// TLS and an HTTP server on 127.0.0.1, named by the hosts file.
func TestProxyJudgesByName(t *testing.T) {
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls host=%s", r.Host)
	}))
	defer tlsUp.Close()
	plainUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain host=%s ua=%q", r.Host, r.Header.Get("User-Agent"))
	}))
	defer plainUp.Close()
	tlsAddr := netip.MustParseAddrPort(tlsUp.Listener.Addr().String())
	plainAddr := netip.MustParseAddrPort(plainUp.Listener.Addr().String())

	// The sandbox "sent" its connection to 192.0.2.1 on the upstream's
	// port: an address of no host, which the gateway never dials for a
	// name.
	var dstMu sync.Mutex
	var dstValue netip.AddrPort
	setDst := func(a netip.AddrPort) { dstMu.Lock(); dstValue = a; dstMu.Unlock() }
	g := testGateway(t, "127.0.0.1 allowed.test\n127.0.0.1 denied.test\n", func() netip.AddrPort {
		dstMu.Lock()
		defer dstMu.Unlock()
		return dstValue
	})
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), mustPolicy(t, []string{"allowed.test"}, []string{"0.0.0.0/0"}), false)
	_, proxyPort := g.Ports()
	proxy := fmt.Sprintf("127.0.0.1:%d", proxyPort)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", proxy)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: dial, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
	get := func(url string) (string, error) {
		resp, err := client.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}

	setDst(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), tlsAddr.Port()))
	if got, err := get(fmt.Sprintf("https://allowed.test:%d/", tlsAddr.Port())); err != nil || got != fmt.Sprintf("200 tls host=allowed.test:%d", tlsAddr.Port()) {
		t.Errorf("TLS to an allowed name: %q, %v", got, err)
	}
	if _, err := get(fmt.Sprintf("https://denied.test:%d/", tlsAddr.Port())); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("TLS to a name not allowed: %v, want an access denied alert", err)
	}
	setDst(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), plainAddr.Port()))
	if got, err := get(fmt.Sprintf("http://allowed.test:%d/", plainAddr.Port())); err != nil || !strings.HasPrefix(got, "200 plain host=allowed.test") {
		t.Errorf("HTTP to an allowed name: %q, %v", got, err)
	}
	if got, err := get(fmt.Sprintf("http://denied.test:%d/", plainAddr.Port())); err != nil || got != "403 aenv egress: denied.test is not in allowOut\n" {
		t.Errorf("HTTP to a name not allowed: %q, %v", got, err)
	}
	// The request goes up as the client sent it: no User-Agent added.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://allowed.test:%d/", plainAddr.Port()), nil)
	req.Header.Set("User-Agent", "")
	if resp, err := client.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `ua=""`) {
			t.Errorf("User-Agent added: %s", b)
		}
	}

	// The default-open policy with a name: addresses go straight through.
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), mustPolicy(t, []string{"allowed.test"}, nil), false)
	setDst(plainAddr)
	if got, err := get(fmt.Sprintf("http://denied.test:%d/", plainAddr.Port())); err != nil || !strings.HasPrefix(got, "200 plain host=denied.test") {
		t.Errorf("open policy: %q, %v", got, err)
	}

	var verdicts []string
	for _, e := range g.Events(1) {
		verdicts = append(verdicts, e.Protocol+":"+e.Host+":"+e.Verdict)
	}
	want := "tls:allowed.test:allowed tls:denied.test:denied http:allowed.test:allowed http:denied.test:denied http:allowed.test:allowed tcp::allowed"
	if got := strings.Join(verdicts, " "); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
}

// BenchmarkGatewayIdleMemory: what the gateway holds for 500 idle
// sandboxes, each with a full egress log, on top of what it holds empty.
func BenchmarkGatewayIdleMemory(b *testing.B) {
	const sandboxes = 500
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for i := 0; i < b.N; i++ {
		g, err := Listen(b.Context(), Config{ListenAddr: "127.0.0.1"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		before := heap()
		pol, _ := network.ParsePolicy(nil, []string{"pypi.org", "*.github.com"}, []string{"0.0.0.0/0"})
		base := netip.MustParseAddr("10.200.0.2").As4()
		for s := range sandboxes {
			addr := base
			addr[2], addr[3] = byte(s>>6), byte(s<<2|2)
			g.SetSlot(s, netip.AddrFrom4(addr), pol, false)
			g.mu.RLock()
			log := g.slots[s].log
			g.mu.RUnlock()
			for e := range eventLogSize {
				log.add(&Event{Time: time.Now(), Protocol: "tls", Host: "files.pythonhosted.org", Address: "151.101.0.223",
					Port: 443, Upstream: "151.101.0.223:443", Verdict: VerdictAllowed, Rule: "pypi.org", BytesOut: int64(e), BytesIn: int64(e)})
			}
		}
		b.ReportMetric(float64(heap()-before)/(1<<20), "MB-for-500")
		g.Close()
	}
}

// recordingUpstream is a TCP server on loopback that keeps what each
// connection sends and answers each with answer (nothing if "").
type recordingUpstream struct {
	l      net.Listener
	mu     sync.Mutex
	got    []string
	answer string
}

func newRecordingUpstream(t *testing.T, answer string) *recordingUpstream {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &recordingUpstream{l: l, answer: answer}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if u.answer != "" {
					io.WriteString(c, u.answer)
				}
				b, _ := io.ReadAll(c)
				u.mu.Lock()
				u.got = append(u.got, string(b))
				u.mu.Unlock()
			}()
		}
	}()
	return u
}

func (u *recordingUpstream) received() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.got, "|")
}

// TestProxyHoldsUnderAbuse: what a hostile client might try on an allowed
// HTTP connection, and the gateway's own shutdown with a silent upstream.
func TestProxyHoldsUnderAbuse(t *testing.T) {
	refusing := newRecordingUpstream(t, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
	silent := newRecordingUpstream(t, "")
	var dstMu sync.Mutex
	var dst netip.AddrPort
	setDst := func(a net.Addr) { dstMu.Lock(); dst = netip.MustParseAddrPort(a.String()); dstMu.Unlock() }
	g := testGateway(t, "127.0.0.1 allowed.test\n", func() netip.AddrPort {
		dstMu.Lock()
		defer dstMu.Unlock()
		return dst
	})
	g.SetSlot(1, netip.MustParseAddr("127.0.0.1"), mustPolicy(t, []string{"allowed.test"}, []string{"0.0.0.0/0"}), false)
	_, proxyPort := g.Ports()
	send := func(data string) string {
		t.Helper()
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", proxyPort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, data)
		c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		return string(b)
	}

	setDst(refusing.l.Addr())
	// A WebSocket upgrade the server refuses, with a request for another
	// host behind it: the second request never goes up.
	out := send("GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" +
		"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if !strings.HasPrefix(out, "HTTP/1.1 400") {
		t.Errorf("refused upgrade: client got %q", out)
	}
	waitUntil(t, func() bool { return strings.Contains(refusing.received(), "allowed.test") })
	if strings.Contains(refusing.received(), "other.test") {
		t.Errorf("a request after a refused upgrade went up: %q", refusing.received())
	}
	// An h2c upgrade goes up as a plain request.
	send("GET /h2c HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	waitUntil(t, func() bool { return strings.Contains(refusing.received(), "/h2c") })
	for _, r := range strings.Split(refusing.received(), "|") {
		if strings.Contains(r, "/h2c") && (strings.Contains(r, "Upgrade") || strings.Contains(r, "HTTP2-Settings")) {
			t.Errorf("h2c upgrade went up: %q", r)
		}
	}
	// Two Upgrade headers (websocket and h2c): no upgrade goes up.
	send("GET /two HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	waitUntil(t, func() bool { return strings.Contains(refusing.received(), "/two") })
	for _, r := range strings.Split(refusing.received(), "|") {
		if strings.Contains(r, "/two") && (strings.Contains(r, "Upgrade") || strings.Contains(r, "HTTP2-Settings")) {
			t.Errorf("an upgrade list went up: %q", r)
		}
	}
	// A server that answers a WebSocket upgrade by switching to another
	// protocol gets nothing more from the client.
	switching := newRecordingUpstream(t, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
	setDst(switching.l.Addr())
	send("GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	waitUntil(t, func() bool { return strings.Contains(switching.received(), "allowed.test") })
	if strings.Contains(switching.received(), "other.test") {
		t.Errorf("bytes after a switch to another protocol went up: %q", switching.received())
	}
	setDst(refusing.l.Addr())

	// Headers past the bound: 431, nothing up.
	before := refusing.received()
	out = send("GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n")
	if !strings.HasPrefix(out, "HTTP/1.1 431") {
		t.Errorf("2 MiB of headers: client got %.80q", out)
	}
	if refusing.received() != before {
		t.Error("a request with too many header bytes went up")
	}

	// A relayed connection to an upstream that never answers ends when its
	// slot is cleared, and the gateway's Close does not wait on it.
	setDst(silent.l.Addr())
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", proxyPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	waitUntil(t, func() bool { return len(g.Events(1)) > 0 && g.Events(1)[len(g.Events(1))-1].Verdict == VerdictAllowed })
	g.ClearSlot(1)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection of a cleared slot still open: %v", err)
	}
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits on relayed connections")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
