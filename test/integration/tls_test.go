package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/tlscert"
)

// The HTTPS listener (--tls-listen) serves what E2B's SDKs ask for given
// only E2B_DOMAIN: the API at https://api.<domain>, envd at
// https://49983-<id>.<domain>, a sandbox's ports at https://<port>-<id>.<domain>.
// Clients here dial the listener whatever the host, so no DNS is needed.

const tlsDomain = "aenv.test"

// freeAddr is a loopback address nothing listens on.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// tlsClient sends every request to addr, whatever its URL's host (which
// still names the server for SNI and verification), trusting only roots
// (nil: the system's). h2 offers HTTP/2 as well as HTTP/1.1.
func tlsClient(addr string, roots *x509.CertPool, h2 bool) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots},
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   h2,
	}}
}

// hostURL is https://<host>.<domain>:<port of addr>.
func hostURL(host, addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return "https://" + host + "." + tlsDomain + ":" + port
}

// exportCA runs `aenv ca export` (the real CLI) and returns a pool of the
// certificate it prints.
func exportCA(t testing.TB, args ...string) *x509.CertPool {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "aenv"), append([]string{"ca", "export"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("aenv ca export %v: %v\n%s", args, err, stderr.String())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(out) {
		t.Fatalf("aenv ca export printed no certificate: %q", out)
	}
	return pool
}

// checkTLSRoutes creates a sandbox through https://api.<domain>, runs a
// command and reads a file through https://49983-<id>.<domain> (envd's
// access token checked as ever), reaches a web server in the sandbox
// through https://8080-<id>.<domain>, and checks that a client not
// trusting roots is refused. It returns the sandbox's ID.
func checkTLSRoutes(t *testing.T, tlsAddr string, roots *x509.CertPool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hc := tlsClient(tlsAddr, roots, true)
	api := client.New(client.Config{URL: hostURL("api", tlsAddr), APIKey: apiKey, HTTP: hc})
	sb, err := api.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("create through https://api.%s: %v", tlsDomain, err)
	}
	if sb.EnvdAccessToken == "" {
		t.Fatal("the sandbox has no envd access token")
	}
	id := sb.SandboxID

	// The health check negotiates HTTP/2 with a client offering it.
	resp, err := hc.Get(hostURL("api", tlsAddr) + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("GET /health over TLS: %d %s", resp.StatusCode, resp.Proto)
	}

	// A build's upload link keeps the scheme the client used: https, on a
	// single server and on a node behind a gateway alike. The link is
	// asked for as the SDK does, after the build is requested.
	apiCall := func(method, path, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, hostURL("api", tlsAddr)+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp = apiCall("POST", "/v3/templates", `{"name":"tls-upload"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("request a build over https: %d", resp.StatusCode)
	}
	resp = apiCall("GET", "/templates/tls-upload/files/"+strings.Repeat("ab", 32), "")
	var upload struct {
		URL string `json:"url"`
	}
	err = json.NewDecoder(resp.Body).Decode(&upload)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated || !strings.HasPrefix(upload.URL, hostURL("api", tlsAddr)+"/build-uploads/") {
		t.Fatalf("upload link over https: %d %q %v", resp.StatusCode, upload.URL, err)
	}

	// envd by its host, over HTTP/2 and HTTP/1.1: a Connect stream (the
	// process service) and /files.
	envdURL := hostURL("49983-"+id, tlsAddr)
	for _, h2 := range []bool{true, false} {
		envd := envdclient.New(envdURL, tlsClient(tlsAddr, roots, h2), sb.EnvdAccessToken)
		proc, err := envd.Start(ctx, envdclient.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-c",
			"echo over-tls-$((6*7)); mkdir -p /tmp/www && echo hello-" + id + " > /tmp/www/index.html"}})
		if err != nil {
			t.Fatalf("process start through %s (h2 %v): %v", envdURL, h2, err)
		}
		var stdout bytes.Buffer
		exit, err := proc.Wait(envdclient.Output{Stdout: &stdout, Stderr: io.Discard})
		if err != nil || exit.Code != 0 || strings.TrimSpace(stdout.String()) != "over-tls-42" {
			t.Fatalf("process through %s (h2 %v): %+v %v %q", envdURL, h2, exit, err, stdout.String())
		}
	}
	envd := envdclient.New(envdURL, hc, sb.EnvdAccessToken)
	body, _, err := envd.ReadFile(ctx, "/tmp/www/index.html", "user")
	if err != nil {
		t.Fatalf("read a file through %s: %v", envdURL, err)
	}
	content, _ := io.ReadAll(body)
	body.Close()
	if string(content) != "hello-"+id+"\n" {
		t.Fatalf("file through %s: %q", envdURL, content)
	}
	if _, _, err := envdclient.New(envdURL, hc, "wrong-token").ReadFile(ctx, "/tmp/www/index.html", "user"); err == nil {
		t.Fatalf("%s took a wrong access token", envdURL)
	}

	// A port of the sandbox by its host.
	proc, err := envd.Start(ctx, envdclient.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-c",
		"cd /tmp/www && nohup python3 -m http.server 8080 >/dev/null 2>&1 &"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proc.Wait(envdclient.Output{}); err != nil {
		t.Fatal(err)
	}
	portURL := hostURL("8080-"+id, tlsAddr) + "/index.html"
	var got string
	waitFor(t, 30*time.Second, "the sandbox's web server through "+portURL, func() bool {
		resp, err := hc.Get(portURL)
		if err != nil {
			t.Fatalf("GET %s: %v", portURL, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got = string(b)
		return resp.StatusCode == 200
	})
	if got != "hello-"+id+"\n" {
		t.Fatalf("GET %s: %q", portURL, got)
	}

	// A client that does not trust the CA is refused.
	_, err = tlsClient(tlsAddr, nil, true).Get(hostURL("api", tlsAddr) + "/health")
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) {
		t.Fatalf("a client not trusting the server's CA: %v, want a verification error", err)
	}
	return id
}

// TestTLSLabCA: a server with --tls-listen and no certificate makes a lab
// CA in its data dir; a client trusting `aenv ca export` reaches the API,
// envd and a sandbox's port by their hosts; plain HTTP still works.
func TestTLSLabCA(t *testing.T) {
	t.Parallel()
	tlsAddr := freeAddr(t)
	s := newServer(t, "--domain", tlsDomain, "--tls-listen", tlsAddr)
	s.start()
	id := checkTLSRoutes(t, tlsAddr, exportCA(t, "--data-dir", s.dataDir))
	if fi, err := os.Stat(filepath.Join(s.dataDir, "tls", "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi, err)
	}
	// The plain listener serves the same API.
	s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get over plain HTTP")

	// A restart keeps the CA: clients trusting it need nothing new.
	before, err := os.ReadFile(filepath.Join(s.dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	s.stop(syscall.SIGTERM)
	s.start()
	after, err := os.ReadFile(filepath.Join(s.dataDir, "tls", "ca.pem"))
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the lab CA changed across a restart (%v)", err)
	}
	resp, err := tlsClient(tlsAddr, exportCA(t, "--data-dir", s.dataDir), false).Get(hostURL("api", tlsAddr) + "/health")
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	resp.Body.Close()
}

// writePair writes a certificate (with its chain) and key for names,
// signed by ca, through renames as a renewal client does.
func writePair(t testing.TB, ca *tlscert.CA, certFile, keyFile string, names ...string) *x509.Certificate {
	t.Helper()
	cert, err := ca.Issue(names)
	if err != nil {
		t.Fatal(err)
	}
	var chain bytes.Buffer
	for _, der := range cert.Certificate {
		pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string][]byte{
		certFile: chain.Bytes(),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	return cert.Leaf
}

// servedSerial is the serial of the certificate a new connection to addr
// is given for host.
func servedSerial(t testing.TB, addr, host string, roots *x509.CertPool) string {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: host, RootCAs: roots})
	if err != nil {
		t.Fatalf("TLS to %s as %s: %v", addr, host, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestTLSCertFilesReload: with --tls-cert/--tls-key the server serves the
// files' certificate and, when a renewal replaces them, new connections
// get the new one without a restart. A key that is not the certificate's
// is refused at start.
func TestTLSCertFilesReload(t *testing.T) {
	t.Parallel()
	ca, _, err := tlscert.LoadOrCreateCA(t.TempDir(), tlsDomain)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	first := writePair(t, ca, certFile, keyFile, tlsDomain, "*."+tlsDomain)

	// Refused at start: a key of another certificate.
	otherCert, otherKey := filepath.Join(dir, "other.pem"), filepath.Join(dir, "other-key.pem")
	writePair(t, ca, otherCert, otherKey, tlsDomain)
	out, err := exec.Command(serverBin, "server", "--data-dir", t.TempDir(), "--listen", freeAddr(t),
		"--tls-listen", freeAddr(t), "--tls-cert", certFile, "--tls-key", otherKey).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "private key does not match public key") {
		t.Fatalf("a mismatched key was not refused at start: %v\n%s", err, out)
	}

	tlsAddr := freeAddr(t)
	s := newServer(t, "--domain", tlsDomain, "--tls-listen", tlsAddr, "--tls-cert", certFile, "--tls-key", keyFile)
	s.start()
	host := "api." + tlsDomain
	if got := servedSerial(t, tlsAddr, host, roots); got != first.SerialNumber.String() {
		t.Fatalf("served serial %s, want the file's %s", got, first.SerialNumber)
	}
	resp, err := tlsClient(tlsAddr, roots, false).Get(hostURL("api", tlsAddr) + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	second := writePair(t, ca, certFile, keyFile, tlsDomain, "*."+tlsDomain)
	// The files are looked at every few seconds.
	waitFor(t, 30*time.Second, "the renewed certificate served", func() bool {
		return servedSerial(t, tlsAddr, host, roots) == second.SerialNumber.String()
	})
	// The new pair is served from the moment it is swapped in; the log
	// line follows it.
	waitFor(t, 10*time.Second, "the reload logged", func() bool {
		return strings.Contains(s.logs.String(), "TLS certificate reloaded")
	})
}

// TestTLSGateway: a gateway with --tls-listen and a lab CA in
// --tls-ca-dir serves the same hosts, reaching the node holding the
// sandbox; without a CA dir or certificates it refuses to start.
func TestTLSGateway(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(serverBin, "gateway", "--database-url", "postgres://nowhere.invalid/x",
		"--tls-listen", freeAddr(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--tls-ca-dir") {
		t.Fatalf("a gateway with --tls-listen and no certificate source started: %v\n%s", err, out)
	}

	c := newCluster(t)
	c.addNode("n1", "--domain", tlsDomain)
	caDir := t.TempDir()
	tlsAddr := freeAddr(t)
	g := c.addGateway("--domain", tlsDomain, "--tls-listen", tlsAddr, "--tls-ca-dir", caDir)
	g.waitReady(t, "n1")
	checkTLSRoutes(t, tlsAddr, exportCA(t, "--tls-ca-dir", caDir))
}
