package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/armon/go-socks5"

	"github.com/aenv-dev/aenv/internal/client"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "aenv egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

func (ca *testCA) leaf(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// namedHost is a fake internet host (see newFakeHostNetns) serving HTTPS
// on 443 and HTTP on 80, both answering which host they are and what the
// request carried, a banner on 22, and recording UDP datagrams to 443.
type namedHost struct {
	label, addr string
	mu          sync.Mutex
	datagrams   []string
}

func newNamedHost(t testing.TB, ca *testCA, label string, names ...string) *namedHost {
	t.Helper()
	ns, addr := newFakeHostNetns(t)
	h := &namedHost{label: label, addr: addr}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /bytes/N: N bytes, for throughput.
		if n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64); err == nil {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			io.CopyN(w, zeros{}, n)
			return
		}
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		// The Authorization header by its digest: a transform's secret
		// must not come back into the sandbox through the echo.
		auth := ""
		if a := r.Header.Get("Authorization"); a != "" {
			auth = fmt.Sprintf("%x", sha256.Sum256([]byte(a)))
		}
		fmt.Fprintf(w, "host=%s sni=%s hosthdr=%s auth-sha256=%s\n", label, sni, r.Host, auth)
	})
	listen := func(port string) net.Listener {
		l, err := listenInNetns(ns, addr+":"+port)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	cert := ca.leaf(t, names...)
	for _, l := range []net.Listener{
		tls.NewListener(listen("443"), &tls.Config{Certificates: []tls.Certificate{cert}}),
		listen("80"),
	} {
		srv := &http.Server{Handler: handler}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	banner := listen("22")
	t.Cleanup(func() { banner.Close() })
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-fake-"+label+"\r\n")
			c.Close()
		}
	}()
	udp, err := listenPacketInNetns(ns, addr+":443")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			h.mu.Lock()
			h.datagrams = append(h.datagrams, string(buf[:n]))
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *namedHost) received(payload string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.datagrams {
		if d == payload {
			return true
		}
	}
	return false
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// rawClientHello is a minimal TLS ClientHello record naming sni, with
// empty extensions of the extra types.
func rawClientHello(sni string, extra ...uint16) []byte {
	var exts []byte
	if sni != "" {
		name := append([]byte{0}, binary.BigEndian.AppendUint16(nil, uint16(len(sni)))...)
		name = append(name, sni...)
		list := binary.BigEndian.AppendUint16(nil, uint16(len(name)))
		list = append(list, name...)
		exts = binary.BigEndian.AppendUint16(exts, 0)
		exts = binary.BigEndian.AppendUint16(exts, uint16(len(list)))
		exts = append(exts, list...)
	}
	for _, typ := range extra {
		exts = binary.BigEndian.AppendUint16(exts, typ)
		exts = binary.BigEndian.AppendUint16(exts, 0)
	}
	body := []byte{0x03, 0x03}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session ID
	body = append(body, 0, 2, 0x13, 0x01)    // TLS_AES_128_GCM_SHA256
	body = append(body, 1, 0)                // no compression
	body = binary.BigEndian.AppendUint16(body, uint16(len(exts)))
	body = append(body, exts...)
	msg := []byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}
	msg = append(msg, body...)
	rec := []byte{0x16, 0x03, 0x01, byte(len(msg) >> 8), byte(len(msg))}
	return append(rec, msg...)
}

// sendRaw is a shell command that sends data to addr:port from inside a
// sandbox and prints, hex-encoded, what comes back before the connection
// closes (or 3 s pass); "closed" if nothing does.
func sendRaw(addr string, port int, data []byte) string {
	return fmt.Sprintf(`python3 - <<'EOF'
import base64, socket
s = socket.create_connection(("%s", %d), 5)
s.settimeout(3)
s.sendall(base64.b64decode("%s"))
out = b""
try:
    while True:
        b = s.recv(4096)
        if not b:
            break
        out += b
except Exception:
    pass
print(out.hex() if out else "closed")
EOF`, addr, port, base64.StdEncoding.EncodeToString(data))
}

// TestEgressByName: host names in allowOut, judged by the node's egress
// gateway, and every way around them the issue lists, each refused.
func TestEgressByName(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	a := newNamedHost(t, ca, "a", "allowed.test", "x.wild.test", "wild.test")
	b := newNamedHost(t, ca, "b", "other.test")
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, fmt.Appendf(nil, "%s allowed.test x.wild.test wild.test\n%s other.test\n", a.addr, b.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--dns-hosts-file", hosts)
	s.start()

	named := s.create(map[string]any{"templateID": "base",
		"network": map[string]any{"allowOut": []string{"allowed.test", "*.wild.test"}, "denyOut": []string{"0.0.0.0/0"}}}).SandboxID
	open := s.create(nil).SandboxID
	sh := func(id, cmd string) client.ExecuteResult {
		t.Helper()
		return s.exec(id, client.ExecuteRequest{Command: cmd})
	}
	for _, id := range []string{named, open} {
		if res := sh(id, "cat > /tmp/ca.pem <<'EOF'\n"+ca.pem+"EOF"); res.ExitCode != 0 {
			t.Fatalf("write CA: %+v", res)
		}
	}
	// curl verifying the hosts' certificates with the test's CA.
	curl := func(id, args string) string {
		t.Helper()
		return sh(id, "curl -s -m 10 --cacert /tmp/ca.pem "+args).Stdout
	}
	wantReach := func(what, got, want string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}
	wantRefused := func(what, got string) {
		t.Helper()
		if strings.Contains(got, "host=") {
			t.Errorf("%s: reached a host: %q", what, got)
		}
	}

	// Allowed names, by TLS and by HTTP; the wildcard covers names under
	// its domain, not the domain.
	wantReach("https allowed", curl(named, "https://allowed.test/"), "host=a sni=allowed.test")
	wantReach("http allowed", curl(named, "http://allowed.test/"), "host=a sni= hosthdr=allowed.test")
	wantReach("wildcard", curl(named, "https://x.wild.test/"), "host=a sni=x.wild.test")
	wantRefused("wildcard's own domain", curl(named, "https://wild.test/"))
	wantRefused("name not allowed", curl(named, "https://other.test/"))
	wantRefused("address without a name", curl(named, "-k https://"+a.addr+"/"))
	wantRefused("plain HTTP by address", curl(named, "http://"+b.addr+"/"))

	// An allowed name sent to another host's address reaches the allowed
	// host (the gateway dials the name): fronting, rebinding and a forged
	// answer all end there.
	wantReach("SNI to another address", curl(named, "--resolve allowed.test:443:"+b.addr+" https://allowed.test/"), "host=a")
	wantReach("HTTP to another address", curl(named, "--resolve allowed.test:80:"+b.addr+" http://allowed.test/"), "host=a")
	wantReach("SNI allowed, Host not", curl(named, "-H 'Host: other.test' https://allowed.test/"), "host=a sni=allowed.test hosthdr=other.test")
	if got := curl(named, "-H 'Host: other.test' http://"+b.addr+"/"); !strings.Contains(got, "aenv egress: other.test is not in allowOut") {
		t.Errorf("plain HTTP Host not allowed: %q", got)
	}

	// A second request on an allowed connection naming another host, and
	// a CONNECT tunnel, are refused.
	twoHosts := []byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if out := sh(named, sendRaw(a.addr, 80, twoHosts)).Stdout; strings.Count(out, fmt.Sprintf("%x", "host=a")) != 1 {
		t.Errorf("keep-alive with a second host: answers %q, want the first only", out)
	}
	connect := []byte("CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if out := sh(named, sendRaw(a.addr, 80, connect)).Stdout; !strings.HasPrefix(out, fmt.Sprintf("%x", "HTTP/1.1 403")) {
		t.Errorf("CONNECT: answer %q, want a 403", out)
	}

	// Encrypted SNI hides the name: refused with a TLS alert, as is a hello
	// whose (outer) name is not allowed.
	alert := "15030300020231"
	if out := sh(named, sendRaw(a.addr, 443, rawClientHello("allowed.test", 0xffce))).Stdout; strings.TrimSpace(out) != alert {
		t.Errorf("ESNI: answer %q, want an access_denied alert", out)
	}
	if out := sh(named, sendRaw(a.addr, 443, rawClientHello("other.test", 0xfe0d))).Stdout; strings.TrimSpace(out) != alert {
		t.Errorf("ECH with an outer name not allowed: answer %q, want an access_denied alert", out)
	}
	if out := sh(named, sendRaw(a.addr, 853, rawClientHello("dns.other.test"))).Stdout; strings.TrimSpace(out) != alert {
		t.Errorf("DNS over TLS to a resolver not allowed: answer %q, want an access_denied alert", out)
	}

	// Other protocols and ports carry no name: refused unless the address
	// is allowed (the open sandbox shows the host answers).
	banner := fmt.Sprintf("%x", "SSH-2.0-fake-a")
	if out := sh(open, sendRaw(a.addr, 22, nil)).Stdout; !strings.HasPrefix(out, banner) {
		t.Fatalf("open sandbox to port 22: %q", out)
	}
	if out := sh(named, sendRaw(a.addr, 22, []byte("SSH-2.0-client\r\n"))).Stdout; strings.Contains(out, banner) {
		t.Errorf("port 22 of an allowed host's address: %q", out)
	}

	// UDP (QUIC) is judged by address only: the named sandbox's datagram
	// never arrives, though the open one's (sent after it) does.
	udp := func(id, payload string) {
		t.Helper()
		sh(id, fmt.Sprintf(`python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'%s', ('%s', 443))"`, payload, a.addr))
	}
	udp(named, "from-named")
	udp(open, "from-open")
	waitFor(t, 10*time.Second, "the open sandbox's datagram", func() bool { return a.received("from-open") })
	if a.received("from-named") {
		t.Error("UDP 443 from the named sandbox reached the host")
	}

	// DNS: allowed names resolve; others are refused, whichever resolver
	// the query is sent to (it is answered by the node).
	if res := sh(named, "getent hosts allowed.test"); !strings.Contains(res.Stdout, a.addr) {
		t.Errorf("resolve an allowed name: %+v", res)
	}
	if res := sh(named, "getent hosts other.test"); res.ExitCode == 0 {
		t.Errorf("resolve a name not allowed: %+v", res)
	}
	if res := sh(open, "getent hosts other.test"); !strings.Contains(res.Stdout, b.addr) {
		t.Errorf("open sandbox resolves any name: %+v", res)
	}
	query := "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05other\x04test\x00\x00\x01\x00\x01"
	dnsCmd := fmt.Sprintf(`python3 - <<'EOF'
import base64, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(base64.b64decode("%s"), ("%s", 53))
print(s.recv(512)[3] & 15)
EOF`, base64.StdEncoding.EncodeToString([]byte(query)), b.addr)
	if res := sh(named, dnsCmd); strings.TrimSpace(res.Stdout) != "5" {
		t.Errorf("DNS to another resolver: rcode %+v, want 5 (refused) from the node", res)
	}

	// The sandbox's egress log says what happened, and why.
	var events []struct {
		Host, Verdict, Rule, Reason, Protocol string
		BytesIn                               int64
	}
	s.expect(s.do("GET", "/sandboxes/"+named+"/egress", nil), 200, "egress log").json(t, &events)
	var allowedSeen, deniedSeen bool
	for _, e := range events {
		allowedSeen = allowedSeen || (e.Host == "allowed.test" && e.Verdict == "allowed" && e.Rule == "allowed.test" && e.BytesIn > 0)
		deniedSeen = deniedSeen || (e.Host == "other.test" && e.Verdict == "denied" && e.Protocol == "tls" && strings.Contains(e.Reason, "not in allowOut"))
	}
	if !allowedSeen || !deniedSeen {
		t.Errorf("egress log lacks the allowed or the denied connection: %+v", events)
	}
	s.expect(s.do("GET", "/sandboxes/nosuchsandbox0000000/egress", nil), 404, "egress log of an unknown sandbox")
	if out := s.cliOK("egress", named); !strings.Contains(out, "other.test is not in allowOut") || !strings.Contains(out, "VERDICT") {
		t.Errorf("aenv egress: %s", out)
	}
	if out, code := s.cli("egress", "nosuchsandbox0000000"); code == 0 {
		t.Errorf("aenv egress of an unknown sandbox: exit 0: %s", out)
	}

	// A new policy applies to new connections at once; fork children
	// inherit it.
	s.expect(s.do("PUT", "/sandboxes/"+named+"/network",
		map[string]any{"allowOut": []string{"other.test"}, "denyOut": []string{"0.0.0.0/0"}}), 204, "update")
	wantReach("after update, the new name", curl(named, "https://other.test/"), "host=b")
	wantRefused("after update, the old name", curl(named, "https://allowed.test/"))
	for _, c := range s.fork("/sandboxes/"+named+"/fork", 1) {
		wantReach("fork child, parent's name", curl(c, "https://other.test/"), "host=b")
		wantRefused("fork child, other name", curl(c, "https://allowed.test/"))
	}

	// Bad names are refused before anything is made.
	for _, bad := range []map[string]any{
		{"allowOut": []string{"*.*.com"}},
		{"allowOut": []string{""}},
		{"allowOut": []string{strings.Repeat(strings.Repeat("a", 60)+".", 5) + "com"}},
		{"allowOut": []string{"exa mple.com"}},
		{"allowOut": []string{"*"}},
		{"denyOut": []string{"evil.example.com"}},
	} {
		s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "network": bad}), 400, fmt.Sprintf("create with %v", bad))
		s.expect(s.do("PUT", "/sandboxes/"+named+"/network", bad), 400, fmt.Sprintf("update with %v", bad))
	}

	// Counters for the scrape.
	metrics := string(s.expect(s.do("GET", "/metrics", nil), 200, "metrics").body)
	for _, want := range []string{`aenv_egress_connections_total{protocol="tls",verdict="denied"}`, `aenv_egress_dns_queries_total{verdict="denied"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// socksRecorder is a SOCKS5 rule set that allows everything and records
// the destinations asked for.
type socksRecorder struct {
	mu    sync.Mutex
	asked []string
}

func (r *socksRecorder) Allow(ctx context.Context, req *socks5.Request) (context.Context, bool) {
	dest := req.DestAddr.FQDN
	if dest == "" {
		dest = req.DestAddr.IP.String()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, fmt.Sprintf("%s:%d user=%s", dest, req.DestAddr.Port, req.AuthContext.Payload["Username"]))
	return ctx, true
}

func (r *socksRecorder) saw(what string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.asked, what)
}

// socksNames resolves the test's names for the SOCKS5 proxy.
type socksNames map[string]string

func (n socksNames) Resolve(ctx context.Context, name string) (context.Context, net.IP, error) {
	if a, ok := n[name]; ok {
		return ctx, net.ParseIP(a), nil
	}
	return ctx, nil, fmt.Errorf("no such test host %q", name)
}

// TestEgressUpstreamProxy: network.egressProxy sends a sandbox's allowed
// TCP egress through a SOCKS5 proxy (a test one, in a namespace of its
// own), names included (the proxy resolves them); a proxy that cannot be
// used is refused before anything is made.
func TestEgressUpstreamProxy(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	a := newNamedHost(t, ca, "a", "allowed.test")
	b := newNamedHost(t, ca, "b", "other.test")
	proxyNS, proxyAddr := newFakeHostNetns(t)
	rec := &socksRecorder{}
	socks, err := socks5.New(&socks5.Config{
		Credentials: socks5.StaticCredentials{"agent": "s3cret"},
		Resolver:    socksNames{"allowed.test": a.addr, "other.test": b.addr},
		Rules:       rec,
		Logger:      log.New(io.Discard, "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := listenInNetns(proxyNS, proxyAddr+":1080")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go socks.Serve(l)

	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, fmt.Appendf(nil, "%s allowed.test\n%s other.test\n", a.addr, b.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--dns-hosts-file", hosts)
	s.start()
	proxy := map[string]any{"address": proxyAddr + ":1080", "username": "agent", "password": "s3cret"}
	sh := func(id, cmd string) string {
		t.Helper()
		return s.exec(id, client.ExecuteRequest{Command: cmd}).Stdout
	}

	// Names allowed, the rest denied, all through the proxy.
	named := s.create(map[string]any{"templateID": "base", "network": map[string]any{
		"allowOut": []string{"allowed.test"}, "denyOut": []string{"0.0.0.0/0"}, "egressProxy": proxy}}).SandboxID
	sh(named, "cat > /tmp/ca.pem <<'EOF'\n"+ca.pem+"EOF")
	if got := sh(named, "curl -s -m 10 --cacert /tmp/ca.pem https://allowed.test/"); !strings.Contains(got, "host=a sni=allowed.test") {
		t.Errorf("allowed name through the proxy: %q", got)
	}
	if !rec.saw("allowed.test:443 user=agent") {
		t.Errorf("the proxy was not asked for allowed.test:443 as agent: %v", rec.asked)
	}
	if got := sh(named, fmt.Sprintf("curl -s -m 10 -k --resolve other.test:443:%s https://other.test/", b.addr)); strings.Contains(got, "host=") {
		t.Errorf("a name not allowed reached a host: %q", got)
	}
	if rec.saw("other.test:443 user=agent") {
		t.Error("a name not allowed was sent to the proxy")
	}

	// An open policy: every connection, by address too, goes through it.
	open := s.create(map[string]any{"templateID": "base", "network": map[string]any{"egressProxy": proxy}}).SandboxID
	if got := sh(open, fmt.Sprintf("curl -s -m 10 http://%s/", b.addr)); !strings.Contains(got, "host=b") {
		t.Errorf("address through the proxy: %q", got)
	}
	if want := b.addr + ":80 user=agent"; !rec.saw(want) {
		t.Errorf("the proxy was not asked for %s: %v", want, rec.asked)
	}

	// The record shows the proxy, never its password.
	var info struct {
		Network struct {
			EgressProxy map[string]any `json:"egressProxy"`
		} `json:"network"`
	}
	r := s.expect(s.do("GET", "/sandboxes/"+named, nil), 200, "get")
	r.json(t, &info)
	if info.Network.EgressProxy["address"] != proxyAddr+":1080" || info.Network.EgressProxy["username"] != "agent" || strings.Contains(string(r.body), "s3cret") {
		t.Errorf("sandbox record: %s", r.body)
	}

	// A proxy that cannot be used is refused at create and at update.
	for what, bad := range map[string]map[string]any{
		"nothing listening":      {"address": proxyAddr + ":1081"},
		"wrong password":         {"address": proxyAddr + ":1080", "username": "agent", "password": "wrong"},
		"no credentials":         {"address": proxyAddr + ":1080"},
		"a private address":      {"address": "10.0.0.1:1080"},
		"the node itself":        {"address": "127.0.0.1:1080"},
		"a password, no user":    {"address": proxyAddr + ":1080", "password": "s3cret"},
		"not host:port":          {"address": "proxy.example"},
		"a name that is unknown": {"address": "nosuchproxy.test:1080"},
	} {
		s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"egressProxy": bad}}), 400, "create with "+what)
		s.expect(s.do("PUT", "/sandboxes/"+open+"/network", map[string]any{"egressProxy": bad}), 400, "update with "+what)
	}
	// The update that works: the open sandbox keeps the proxy.
	s.expect(s.do("PUT", "/sandboxes/"+open+"/network", map[string]any{"allowOut": []string{"allowed.test"},
		"denyOut": []string{"0.0.0.0/0"}, "egressProxy": proxy}), 204, "update with the proxy")
	if got := sh(open, "curl -s -m 10 http://allowed.test/"); !strings.Contains(got, "host=a") {
		t.Errorf("after update: %q", got)
	}

	// The operator's proxy for every sandbox (--egress-proxy): addresses go
	// through it, and names too, resolved by the node (so its denied ranges
	// hold) and sent by address.
	s.stop(syscall.SIGTERM)
	node := newServer(t, "--dns-hosts-file", hosts, "--egress-proxy", "socks5://agent:s3cret@"+proxyAddr+":1080")
	node.start()
	plain := node.create(map[string]any{"templateID": "base"}).SandboxID
	if got := node.exec(plain, client.ExecuteRequest{Command: fmt.Sprintf("curl -s -m 10 http://%s/", b.addr)}).Stdout; !strings.Contains(got, "host=b") {
		t.Errorf("through the node's proxy: %q", got)
	}
	named2 := node.create(map[string]any{"templateID": "base", "network": map[string]any{
		"allowOut": []string{"allowed.test"}, "denyOut": []string{"0.0.0.0/0"}}}).SandboxID
	before := len(rec.asked)
	if got := node.exec(named2, client.ExecuteRequest{Command: "curl -s -m 10 http://allowed.test/"}).Stdout; !strings.Contains(got, "host=a") {
		t.Errorf("a name through the node's proxy: %q", got)
	}
	rec.mu.Lock()
	asked := slices.Clone(rec.asked[before:])
	rec.mu.Unlock()
	if !slices.Contains(asked, a.addr+":80 user=agent") {
		t.Errorf("the node's proxy was asked for %v, want %s:80 by address", asked, a.addr)
	}
}

// TestEgressAfterRestart: a sandbox's names hold after the server is
// killed and restarted (the gateway's ports change; the firewall and the
// adopted sandbox's policy follow) and after a pause to disk and resume
// (a new network slot).
func TestEgressAfterRestart(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	a := newNamedHost(t, ca, "a", "allowed.test")
	b := newNamedHost(t, ca, "b", "other.test")
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, fmt.Appendf(nil, "%s allowed.test\n%s other.test\n", a.addr, b.addr), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--dns-hosts-file", hosts)
	s.start()
	id := s.create(map[string]any{"templateID": "base", "timeout": 600,
		"network": map[string]any{"allowOut": []string{"allowed.test"}, "denyOut": []string{"0.0.0.0/0"}}}).SandboxID
	check := func(when string) {
		t.Helper()
		if got := s.exec(id, client.ExecuteRequest{Command: "curl -s -m 10 http://allowed.test/"}).Stdout; !strings.Contains(got, "host=a") {
			t.Errorf("%s: allowed name: %q", when, got)
		}
		got := s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf("curl -s -m 10 --resolve other.test:80:%s http://other.test/", b.addr)}).Stdout
		if !strings.Contains(got, "other.test is not in allowOut") {
			t.Errorf("%s: name not allowed: %q", when, got)
		}
	}
	check("before")
	s.stop(syscall.SIGKILL)
	s.start()
	check("after a restart")
	s.expect(s.do("POST", "/sandboxes/"+id+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	s.expect(s.do("POST", "/sandboxes/"+id+"/resume", map[string]any{}), 201, "resume")
	check("after a pause to disk")
}

// Header transforms with secrets (network.rules): the gateway sets the
// rule's headers, the team's secret filled in, into HTTPS requests to the
// rule's hosts, which it intercepts with the node's CA (trusted by the
// sandbox's system bundle and the usual variables); other hosts pass
// untouched; the secret is nowhere inside the sandbox.
func TestEgressTransforms(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	a := newNamedHost(t, ca, "a", "api.test")
	b := newNamedHost(t, ca, "b", "plain.test")
	dir := t.TempDir()
	hosts, caFile := filepath.Join(dir, "hosts"), filepath.Join(dir, "ca.pem")
	os.WriteFile(hosts, fmt.Appendf(nil, "%s api.test\n%s plain.test\n", a.addr, b.addr), 0o644)
	os.WriteFile(caFile, []byte(ca.pem), 0o644)
	s := newServer(t, "--dns-hosts-file", hosts, "--egress-upstream-ca-file", caFile)
	s.start()

	const value = "sk-transform-Hq72LxP0"
	digest := func(v string) string { return fmt.Sprintf("auth-sha256=%x", sha256.Sum256([]byte(v))) }
	s.expect(s.do("POST", "/secrets", map[string]any{"name": "openai-key", "value": value}), 201, "secret")
	rules := map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{
		"headers": map[string]string{"Authorization": "Bearer ${e2b.secrets.openai-key}"}}}}}
	network := func(extra map[string]any) map[string]any {
		n := map[string]any{"allowOut": []string{"api.test", "plain.test"}, "denyOut": []string{"0.0.0.0/0"}, "rules": rules}
		for k, v := range extra {
			n[k] = v
		}
		return n
	}

	// Refused before anything is made: an unknown secret, a header a
	// transform may not set, a bad host.
	for what, rs := range map[string]any{
		"an unknown secret": map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Authorization": "${e2b.secrets.nope}"}}}}},
		"Host":              map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Host": "evil.test"}}}}},
		"a bare *":          map[string]any{"*": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"A": "b"}}}}},
	} {
		r := s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "network": network(map[string]any{"rules": rs})})
		if r.status != 400 {
			t.Errorf("rules with %s: %d %s, want 400", what, r.status, r.body)
		}
	}

	id := s.create(map[string]any{"templateID": "base", "network": network(nil)}).SandboxID
	sh := func(id, cmd string) client.ExecuteResult {
		t.Helper()
		return s.exec(id, client.ExecuteRequest{Command: cmd})
	}
	// The rule's host, with the sandbox's own trust store (no --cacert):
	// the gateway's CA is in it. The host got the secret; the sandbox's
	// own Authorization was replaced.
	if got := sh(id, "curl -s -m 10 -H 'Authorization: mine' https://api.test/").Stdout; !strings.Contains(got, "host=a sni=api.test") ||
		!strings.Contains(got, digest("Bearer "+value)) {
		t.Fatalf("curl to the rule's host: %q, want the secret's digest %s", got, digest("Bearer "+value))
	}
	// Python's ssl (SSL_CERT_FILE) as well.
	if got := sh(id, `python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.test/').read().decode())"`).Stdout; !strings.Contains(got, digest("Bearer "+value)) {
		t.Errorf("python to the rule's host: %q", got)
	}
	// A host without rules is not intercepted: the gateway's CA does not
	// vouch for it (the test's does), and its requests pass untouched.
	if res := sh(id, "curl -s -m 10 https://plain.test/"); strings.Contains(res.Stdout, "host=b") {
		t.Errorf("plain.test verified with the sandbox's bundle: %q (intercepted?)", res.Stdout)
	}
	if got := sh(id, "cat > /tmp/ca.pem <<'EOF'\n"+ca.pem+"EOF\ncurl -s -m 10 --cacert /tmp/ca.pem -H 'Authorization: mine' https://plain.test/").Stdout; !strings.Contains(got, digest("mine")) {
		t.Errorf("plain.test: %q, want the sandbox's own header", got)
	}
	// The secret is nowhere inside: not in the environment, files or any
	// process's memory map.
	if res := sh(id, "env; cat /proc/*/environ 2>/dev/null; grep -rl '"+value+"' /etc /tmp /root /home /usr/local 2>/dev/null; true"); strings.Contains(res.Stdout, value) {
		t.Fatalf("the secret is inside the sandbox:\n%s", res.Stdout)
	}
	if res := sh(id, "echo $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS"); !strings.Contains(res.Stdout, "/etc/ssl/certs/ca-certificates.crt /usr/local/share/ca-certificates/aenv-egress-ca.crt") {
		t.Errorf("trust variables: %q", res.Stdout)
	}

	// An update reaches the next request.
	s.expect(s.do("POST", "/secrets/openai-key", map[string]any{"value": "rotated"}), 200, "update secret")
	waitFor(t, 30*time.Second, "the rotated secret used", func() bool {
		return strings.Contains(sh(id, "curl -s -m 10 https://api.test/").Stdout, digest("Bearer rotated"))
	})
	// Rules added at runtime: plain.test is intercepted from then on.
	s.expect(s.do("PUT", "/sandboxes/"+id+"/network", map[string]any{"allowOut": []string{"api.test", "plain.test"},
		"denyOut": []string{"0.0.0.0/0"}, "rules": map[string]any{"plain.test": []any{map[string]any{"transform": map[string]any{
			"headers": map[string]string{"X-Team": "lab"}}}}}}), 204, "update network")
	if got := sh(id, "curl -s -m 10 https://plain.test/").Stdout; !strings.Contains(got, "host=b sni=plain.test") {
		t.Errorf("plain.test after its rule: %q", got)
	}
	var info struct {
		Network struct {
			Rules map[string][]map[string]map[string]map[string]string `json:"rules"`
		} `json:"network"`
	}
	s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "info").json(t, &info)
	if info.Network.Rules["plain.test"][0]["transform"]["headers"]["X-Team"] != "lab" {
		t.Errorf("getInfo's rules: %+v", info.Network.Rules)
	}

	// A destroyed secret fails the request at the gateway, saying why;
	// the placeholder is never sent.
	s.expect(s.do("PUT", "/sandboxes/"+id+"/network", network(nil)), 204, "rules back")
	s.expect(s.do("DELETE", "/secrets/openai-key", nil), 204, "destroy secret")
	waitFor(t, 30*time.Second, "the destroyed secret refused", func() bool {
		got := sh(id, "curl -s -m 10 https://api.test/").Stdout
		return strings.Contains(got, `unknown secret "openai-key"`) && !strings.Contains(got, "host=a")
	})

	// The egress log says which connections were intercepted.
	var events []struct{ Host, Transform, Verdict string }
	s.expect(s.do("GET", "/sandboxes/"+id+"/egress", nil), 200, "egress log").json(t, &events)
	intercepted := 0
	for _, e := range events {
		if e.Transform == "api.test" && e.Host == "api.test" {
			intercepted++
		}
	}
	if intercepted < 3 {
		t.Errorf("%d intercepted connections in the log, want at least 3: %+v", intercepted, events)
	}

	// With the internet open the rule's host is reached by address, and
	// still intercepted.
	s.expect(s.do("POST", "/secrets", map[string]any{"name": "openai-key", "value": value}), 201, "secret again")
	open := s.create(map[string]any{"templateID": "base", "network": map[string]any{"rules": rules}}).SandboxID
	if got := sh(open, "curl -s -m 10 https://api.test/").Stdout; !strings.Contains(got, digest("Bearer "+value)) {
		t.Errorf("open internet, rule's host: %q", got)
	}
	if got := sh(open, "curl -s -m 10 http://plain.test/").Stdout; !strings.Contains(got, "host=b") {
		t.Errorf("open internet, another host: %q", got)
	}
}
