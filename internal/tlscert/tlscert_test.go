package tlscert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
)

var discard = slog.New(slog.DiscardHandler)

// TestCAIsMadeOnceAndKept: the first start makes the CA (key 0600), later
// ones (and concurrent ones sharing the directory) load that same CA.
func TestCAIsMadeOnceAndKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	first, created, err := LoadOrCreateCA(dir, "aenv.test")
	if err != nil || !created {
		t.Fatalf("first start: created %v, %v", created, err)
	}
	if !first.Cert.IsCA || first.Cert.NotAfter.Before(time.Now().Add(9*365*24*time.Hour)) {
		t.Fatalf("CA certificate: IsCA %v, not after %v", first.Cert.IsCA, first.Cert.NotAfter)
	}
	for name, mode := range map[string]os.FileMode{CAKeyFile: 0o600, CACertFile: 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: %v %v, want mode %v", name, fi, err, mode)
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			again, created, err := LoadOrCreateCA(dir, "aenv.test")
			if err != nil || created || !again.Cert.Equal(first.Cert) {
				t.Errorf("later start: created %v, same CA %v, %v", created, err == nil && again.Cert.Equal(first.Cert), err)
			}
		})
	}
	wg.Wait()
	exported, err := ReadCACert(dir)
	if err != nil || !bytes.Equal(exported, first.CertPEM) {
		t.Fatalf("export: %v", err)
	}
}

// TestCAsSharedDirRace: servers starting at once on an empty shared
// directory all end up with one CA.
func TestCAsSharedDirRace(t *testing.T) {
	dir := t.TempDir()
	cas := make([]*CA, 8)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, _, err := LoadOrCreateCA(dir, "aenv.test")
			if err != nil {
				t.Error(err)
				return
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	for _, ca := range cas[1:] {
		if ca == nil || !ca.Cert.Equal(cas[0].Cert) {
			t.Fatal("servers sharing a directory got different CAs")
		}
	}
}

func TestCAKeyWithoutCertificateRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateCA(dir, "aenv.test"); err == nil || !strings.Contains(err.Error(), "does not") {
		t.Fatalf("a key without its certificate: %v", err)
	}
	if _, err := ReadCACert(t.TempDir()); err == nil {
		t.Fatal("export of a missing CA succeeded")
	}
}

// TestLeafNames: the lab certificate verifies for every host E2B's SDKs
// use with the domain, and for loopback; not for other names.
func TestLeafNames(t *testing.T) {
	ca, _, err := LoadOrCreateCA(t.TempDir(), "aenv.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	id := strings.Repeat("a", 20)
	for _, tc := range []struct {
		domain string
		ok     []string
		bad    []string
	}{
		{"aenv.test", []string{"aenv.test", "api.aenv.test", "49983-" + id + ".aenv.test", "8080-" + id + ".aenv.test", "localhost", "127.0.0.1", "::1"},
			[]string{"a.b.aenv.test", "other.test", "aenv.test.evil"}},
		{"localhost", []string{"localhost", "api.localhost", "49983-" + id + ".localhost", "127.0.0.1"},
			[]string{"a.b.localhost", "aenv.test"}},
		{"", []string{"localhost", "127.0.0.1"}, []string{"api.localhost"}},
	} {
		t.Run(tc.domain, func(t *testing.T) {
			cert, err := ca.Issue(LeafNames(tc.domain))
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range append(tc.ok, tc.bad...) {
				_, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
				if want := slices.Contains(tc.ok, name); (err == nil) != want {
					t.Errorf("%s: verified %v, want %v (%v)", name, err == nil, want, err)
				}
			}
			if cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) > 398*24*time.Hour {
				t.Errorf("lab certificate lasts %v", cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore))
			}
		})
	}
}

// pairFiles writes a certificate and key for names, signed by ca.
func pairFiles(t *testing.T, ca *CA, dir, prefix string, names ...string) (certFile, keyFile string, cert *tls.Certificate) {
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
	certFile, keyFile = filepath.Join(dir, prefix+"cert.pem"), filepath.Join(dir, prefix+"key.pem")
	if err := atomicfile.Write(certFile, bytes.NewReader(chain.Bytes()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(keyFile, bytes.NewReader(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestBadPairsRefused(t *testing.T) {
	ca, _, err := LoadOrCreateCA(t.TempDir(), "aenv.test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certA, keyA, _ := pairFiles(t, ca, dir, "a-", "aenv.test")
	_, keyB, _ := pairFiles(t, ca, dir, "b-", "aenv.test")
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("not a PEM file"), 0o600)
	for _, tc := range []struct {
		name      string
		cert, key string
		want      string
	}{
		{"key of another certificate", certA, keyB, "private key does not match"},
		{"certificate not PEM", garbage, keyA, "failed to find any PEM data"},
		{"key not PEM", certA, garbage, "failed to find any PEM data"},
		{"missing certificate", filepath.Join(dir, "none.pem"), keyA, "no such file"},
		{"certificate without key", certA, "", "go together"},
		{"key without certificate", "", keyA, "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Domain: "aenv.test", CertFile: tc.cert, KeyFile: tc.key}, discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	src, err := New(Config{Domain: "aenv.test", CertFile: certA, KeyFile: keyA}, discard)
	if err != nil || src.Mode != ModeFiles {
		t.Fatalf("a good pair: %v", err)
	}
	if missing := src.Uncovered("aenv.test"); len(missing) != 2 {
		t.Fatalf("a certificate for the bare domain covers %d of the SDKs' names, want 0", 2-len(missing))
	}
}

// serveTLS serves src's TLS configuration on a test server and returns
// the serial of the certificate a new connection gets for host.
func serialServed(t *testing.T, src *Source, roots *x509.CertPool, host string) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = src.TLSConfig()
	srv.StartTLS()
	defer srv.Close()
	conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{ServerName: host, RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake as %s: %v", host, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestCertFilesReload: a renewal replacing the files is served from the
// next check on; a half-written one (new certificate, old key) is not,
// and the current certificate goes on being served.
func TestCertFilesReload(t *testing.T) {
	ca, _, err := LoadOrCreateCA(t.TempDir(), "aenv.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	dir := t.TempDir()
	certFile, keyFile, first := pairFiles(t, ca, dir, "", "*.aenv.test")
	src, err := New(Config{Domain: "aenv.test", CertFile: certFile, KeyFile: keyFile, ReloadInterval: time.Nanosecond}, discard)
	if err != nil {
		t.Fatal(err)
	}
	host := "api.aenv.test"
	if got := serialServed(t, src, roots, host); got != first.Leaf.SerialNumber.String() {
		t.Fatalf("served %s, want %s", got, first.Leaf.SerialNumber)
	}

	// Half a renewal: the new certificate beside the old key.
	otherCert, _, half := pairFiles(t, ca, dir, "other-", "*.aenv.test")
	b, _ := os.ReadFile(otherCert)
	if err := atomicfile.Write(certFile, bytes.NewReader(b), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := serialServed(t, src, roots, host); got != first.Leaf.SerialNumber.String() {
		t.Fatalf("a mismatched pair was served (serial %s, half-written %s)", got, half.Leaf.SerialNumber)
	}

	_, _, second := pairFiles(t, ca, dir, "", "*.aenv.test")
	if got := serialServed(t, src, roots, host); got != second.Leaf.SerialNumber.String() {
		t.Fatalf("after the renewal served %s, want %s", got, second.Leaf.SerialNumber)
	}
}

// TestLabCASource: lab CA mode serves a certificate for the domain's
// hosts, signed by the CA kept in the directory.
func TestLabCASource(t *testing.T) {
	dir := t.TempDir()
	src, err := New(Config{Domain: "aenv.test", CADir: dir}, discard)
	if err != nil || src.Mode != ModeLabCA {
		t.Fatalf("lab CA mode: %v", err)
	}
	pemBytes, err := ReadCACert(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemBytes)
	serialServed(t, src, roots, "49983-abcdefghij0123456789.aenv.test")
	if missing := src.Uncovered("aenv.test"); len(missing) != 0 {
		t.Fatalf("lab certificate misses %v", missing)
	}
	if _, err := New(Config{Domain: "aenv.test"}, discard); err == nil {
		t.Fatal("lab CA mode without a directory")
	}
}

// TestACMEHTTPHandler: in ACME mode the plain listener's handler answers
// only the challenge path itself; everything else reaches the API.
func TestACMEHTTPHandler(t *testing.T) {
	src, err := New(Config{Domain: "aenv.test", ACMEDirectory: "https://acme.invalid/directory",
		ACMECacheDir: t.TempDir()}, discard)
	if err != nil || src.Mode != ModeACME {
		t.Fatalf("ACME mode: %v", err)
	}
	if !slices.Contains(src.TLSConfig().NextProtos, "acme-tls/1") {
		t.Fatalf("NextProtos %v: no TLS-ALPN-01", src.TLSConfig().NextProtos)
	}
	h := src.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) }))
	for path, want := range map[string]int{"/health": 299, "/sandboxes": 299, "/.well-known/acme-challenge/unknown": 404} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://api.aenv.test"+path, nil))
		if rec.Code != want {
			t.Errorf("GET %s: %d, want %d", path, rec.Code, want)
		}
	}
	if _, err := New(Config{Domain: "aenv.test", ACMEDirectory: "https://acme.invalid/directory"}, discard); err == nil {
		t.Fatal("ACME without a cache dir")
	}
}

// TestCANameConstraints: a lab CA signs, as far as its clients are
// concerned, names under its domain, localhost and loopback only: a
// certificate it issues for another name fails verification, so a leaked
// CA key cannot impersonate other sites to them. A CA dir made for one
// domain is refused for another.
func TestCANameConstraints(t *testing.T) {
	dir := t.TempDir()
	ca, _, err := LoadOrCreateCA(dir, "aenv.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"api.aenv.test", true},
		{"localhost", true},
		{"bank.example", false},
		{"aenv.test.evil", false},
	} {
		cert, err := ca.Issue([]string{tc.name})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cert.Leaf.Verify(x509.VerifyOptions{DNSName: tc.name, Roots: roots})
		if (err == nil) != tc.ok {
			t.Errorf("a certificate for %s: verified %v, want %v (%v)", tc.name, err == nil, tc.ok, err)
		}
	}
	cert, err := ca.Issue([]string{"10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots}); err == nil {
		t.Error("a certificate for a non-loopback address verified")
	}

	if _, _, err := LoadOrCreateCA(dir, "sub.aenv.test"); err != nil {
		t.Errorf("a subdomain of the CA's domain: %v", err)
	}
	if _, _, err := LoadOrCreateCA(dir, "other.test"); err == nil || !strings.Contains(err.Error(), "other.test") {
		t.Errorf("the CA of aenv.test loaded for other.test: %v", err)
	}
	if !(&CA{Cert: &x509.Certificate{}}).Permits("any.test") {
		t.Error("a CA without constraints (made before them) refused a domain")
	}
}
