package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/roottest"
	"github.com/aenv-dev/aenv/internal/wire/wiretest"
	"github.com/aenv-dev/aenv/test/dnsstub"
)

// TestACMECertificates: with --acme-directory the HTTPS listener of a
// server or a gateway gets its certificates from an ACME server, here Let's
// Encrypt's test server (pebble, built by make test-prepare), at the first
// handshake naming api.<domain> or a sandbox port's host. Pebble validates
// each order by connecting, at the address a stub resolver gives for the
// name, to the HTTPS listener (TLS-ALPN-01) or the plain one (HTTP-01);
// each case leaves pebble only one of the two. A client trusting only
// pebble's root then reaches both names; a name outside the domain gets no
// certificate.
func TestACMECertificates(t *testing.T) {
	t.Parallel()
	pebbleBin := filepath.Join(binDir, "pebble")
	if _, err := os.Stat(pebbleBin); err != nil {
		roottest.SkipOrFail(t, fmt.Sprintf("pebble missing in %s (run `make test-prepare`)", binDir))
	}
	for _, tc := range []struct {
		name    string
		gateway bool
		// alpn validates on the HTTPS listener, else on the plain one;
		// pebble's other port is one nothing listens on.
		alpn bool
	}{
		{"server TLS-ALPN-01 on the HTTPS listener", false, true},
		{"server HTTP-01 on the plain listener", false, false},
		{"gateway TLS-ALPN-01 on the HTTPS listener", true, true},
		{"gateway HTTP-01 on the plain listener", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testACME(t, pebbleBin, tc.gateway, tc.alpn) })
	}
}

// acmeFront is what testACME needs of the server or gateway under test,
// listening on port 80 (plain) and 443 (HTTPS) of one address.
type acmeFront struct {
	logs *syncBuffer
	api  *client.Client
}

func testACME(t *testing.T, pebbleBin string, gateway, alpn bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// As deployed: the domain's names resolve to an address whose port 80
	// is the plain listener and 443 the HTTPS one (ACME servers validate
	// there); the address is the test's own, so concurrent runs never meet.
	domain := randomLetters(10) + ".aenv.test"
	ip := randomLoopback()
	resolver, err := dnsstub.Start(ctx, "127.0.0.1:0", map[string]netip.Addr{domain: ip})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resolver.Close() })
	plainAddr, tlsAddr := netip.AddrPortFrom(ip, 80).String(), netip.AddrPortFrom(ip, 443).String()

	httpPort, tlsPort, closed := 80, 443, port(t, freeLoopbackAddr(t))
	if alpn {
		httpPort = closed
	} else {
		tlsPort = closed
	}
	pb := startPebble(t, pebbleBin, httpPort, tlsPort, resolver.Addr())
	tlsFlags := []string{"--domain", domain, "--tls-listen", tlsAddr,
		"--acme-directory", pb.directory, "--acme-ca-file", pb.certFile, "--acme-email", "ops@" + domain}
	var front acmeFront
	if gateway {
		c := newCluster(t)
		c.addNode("acme-node", "--domain", domain)
		g := startGatewayAt(c, plainAddr, append(tlsFlags, "--acme-cache-dir", t.TempDir())...)
		g.waitReady(t, "acme-node")
		front = acmeFront{logs: g.logs, api: g.api}
	} else {
		s := newServer(t, tlsFlags...)
		s.listenOn(plainAddr)
		s.start()
		front = acmeFront{logs: s.logs, api: s.api}
	}

	// The client trusts pebble's issuing root only, and finds every name
	// of the domain at the HTTPS listener.
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pb.issuingRoot(t)) {
		t.Fatal("pebble's root is not PEM")
	}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, tlsAddr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	get := func(host, path string, headers ...string) (*http.Response, string, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", "https://"+host+path, nil)
		if err != nil {
			return nil, "", err
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, string(body), err
	}
	checkIssued := func(resp *http.Response, host string) {
		t.Helper()
		leaf := resp.TLS.PeerCertificates[0]
		if !slices.Contains(leaf.DNSNames, host) {
			t.Errorf("certificate for %s names %v", host, leaf.DNSNames)
		}
	}

	// The API's name: ordered at the first handshake.
	api := "api." + domain
	resp, body, err := get(api, "/health")
	if err != nil {
		t.Fatalf("GET https://%s/health: %v\nlogs:\n%s\npebble logs:\n%s", api, err, tail(front.logs.String(), 60), tail(pb.logs.String(), 60))
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET https://%s/health: %d %s", api, resp.StatusCode, body)
	}
	checkIssued(resp, api)
	var sandboxes []client.Sandbox
	if resp, body, err := get(api, "/sandboxes", "X-API-Key", apiKey); err != nil || resp.StatusCode != 200 || json.Unmarshal([]byte(body), &sandboxes) != nil {
		t.Fatalf("GET https://%s/sandboxes: %v %v %s", api, resp, err, body)
	}

	// A sandbox port's host: a certificate of its own.
	sb, err := front.api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	if _, err := front.api.Execute(ctx, id, client.ExecuteRequest{Command: "mkdir -p /tmp/www && echo acme-" + id +
		" > /tmp/www/index.html && cd /tmp/www && nohup python3 -m http.server 8080 >/dev/null 2>&1 &"}); err != nil {
		t.Fatal(err)
	}
	host := "8080-" + id + "." + domain
	waitFor(t, 2*time.Minute, "the sandbox's server over https", func() bool {
		resp, body, err := get(host, "/index.html")
		if err != nil {
			t.Logf("GET https://%s/index.html: %v", host, err)
			return false
		}
		if resp.StatusCode != 200 {
			return false
		}
		checkIssued(resp, host)
		return body == "acme-"+id+"\n"
	})

	// Names outside the domain cost no order: the handshake fails.
	conn, err := tls.Dial("tcp", tlsAddr, &tls.Config{ServerName: "elsewhere.example", RootCAs: roots})
	if err == nil {
		conn.Close()
		t.Fatal("a handshake for a name outside the domain succeeded")
	}
}

// startGatewayAt is c.addGateway listening at addr.
func startGatewayAt(c *cluster, addr string, extra ...string) *gateway {
	c.t.Helper()
	g := &gateway{t: c.t, addr: addr, url: "http://" + addr, dsn: c.dsn, keyFile: c.keyFile, raceDir: c.t.TempDir(), extra: extra}
	g.api = client.New(client.Config{URL: g.url, APIKey: apiKey,
		HTTP: &http.Client{Transport: wiretest.Transport(c.t, client.NewHTTPClient(4).Transport)}})
	g.start()
	c.t.Cleanup(func() { g.stop(syscall.SIGTERM) })
	c.gateways = append(c.gateways, g)
	return g
}

// randomLoopback is an address in 127.0.0.0/8 outside 127.0.0.0/16, where
// a test can listen on fixed ports that concurrent tests, on addresses of
// their own, also use.
func randomLoopback() netip.Addr {
	b := make([]byte, 3)
	rand.Read(b)
	return netip.AddrFrom4([4]byte{127, 1 + b[0]%254, b[1], 1 + b[2]%254})
}

// freeLoopbackAddr is a 127.0.0.1 address with a port nothing listens on.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pebble is a running pebble ACME server.
type pebble struct {
	// directory is the ACME directory URL; its TLS certificate is certFile
	// (self-signed), which also serves the management API at mgmt.
	directory string
	mgmt      string
	certFile  string
	client    *http.Client
	logs      *syncBuffer
}

// startPebble runs pebble on loopback ports of its own; it validates
// challenges on httpPort (HTTP-01) and tlsPort (TLS-ALPN-01) of the
// address dnsServer gives for the name, without the random sleeps and
// nonce rejections it makes by default (to exercise clients' retries).
func startPebble(t *testing.T, bin string, httpPort, tlsPort int, dnsServer string) *pebble {
	t.Helper()
	dir := t.TempDir()
	certPEM := selfSignedCert(t, dir)
	listen, mgmt := freeLoopbackAddr(t), freeLoopbackAddr(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  listen,
		"managementListenAddress":        mgmt,
		"certificate":                    filepath.Join(dir, "cert.pem"),
		"privateKey":                     filepath.Join(dir, "key.pem"),
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
	}}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	pb := &pebble{
		directory: "https://" + listen + "/dir",
		mgmt:      "https://" + mgmt,
		certFile:  filepath.Join(dir, "cert.pem"),
		logs:      &syncBuffer{},
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	pb.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}

	cmd := exec.Command(bin, "-config", cfgFile, "-dnsserver", dnsServer)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	cmd.Stdout, cmd.Stderr = pb.logs, pb.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("pebble logs:\n%s", tail(pb.logs.String(), 100))
		}
	})
	waitFor(t, time.Minute, "pebble's directory", func() bool {
		select {
		case <-exited:
			t.Fatalf("pebble exited:\n%s", pb.logs.String())
		default:
		}
		resp, err := pb.client.Get(pb.directory)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return pb
}

// issuingRoot is the root pebble signs certificates under (made at its
// start), from its management API.
func (pb *pebble) issuingRoot(t *testing.T) []byte {
	t.Helper()
	resp, err := pb.client.Get(pb.mgmt + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("pebble's root: %d %v %s", resp.StatusCode, err, data)
	}
	return data
}

// selfSignedCert writes cert.pem and key.pem in dir: a certificate for
// 127.0.0.1 and localhost signed by its own key, which pebble serves its
// API with and clients of that API trust. It returns the certificate.
func selfSignedCert(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pebble test API"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certPEM
}
