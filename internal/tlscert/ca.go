package tlscert

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
)

// Files of a lab CA, in its directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
	lockFile   = ".lock"
)

const (
	caValidity = 10 * 365 * 24 * time.Hour
	// leafValidity stays under the 398 days clients accept for a server
	// certificate; a server running longer issues itself a new one.
	leafValidity = 397 * 24 * time.Hour
	// leafRenewBefore is how long before its end a leaf is replaced.
	leafRenewBefore = 30 * 24 * time.Hour
	// backdate covers clocks a little behind the server's.
	backdate = time.Hour
)

// CA is a lab certificate authority: a key and a self-signed certificate
// kept in a directory, which signs the server's own certificates.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// LoadOrCreateCA loads the CA kept in dir, making it (and dir) first when
// there is none; created says which. Servers sharing dir (several
// gateways) take a lock, so that they all end up with the same CA.
//
// A CA it makes may sign names under domain, localhost and loopback
// addresses only (X.509 name constraints, which clients enforce): a
// client told to trust it trusts nothing else it might sign, should its
// key leak. A CA made for another domain is refused.
func LoadOrCreateCA(dir, domain string) (ca *CA, created bool, err error) {
	return loadOrCreate(dir, func() (*CA, error) { return newCA("aenv lab CA", domain, true) }, func(ca *CA) error {
		if !ca.Permits(domain) {
			return fmt.Errorf("lab CA in %s signs names under %v only, not %q: give --tls-ca-dir another directory, "+
				"or remove this CA (its clients must then trust the new one)", dir, ca.Cert.PermittedDNSDomains, domain)
		}
		return nil
	})
}

// LoadOrCreateOpenCA is LoadOrCreateCA for a CA without name constraints,
// named name: one that may sign any host name. It is for a CA that only
// the sandboxes that need it trust (the egress gateway's, which shows
// them the hosts it intercepts), never a client outside.
func LoadOrCreateOpenCA(dir, name string) (*CA, error) {
	ca, _, err := loadOrCreate(dir, func() (*CA, error) { return newCA(name, "", false) }, func(ca *CA) error {
		if len(ca.Cert.PermittedDNSDomains) > 0 {
			return fmt.Errorf("CA in %s signs names under %v only: it is not one for any host", dir, ca.Cert.PermittedDNSDomains)
		}
		return nil
	})
	return ca, err
}

// loadOrCreate loads the CA kept in dir, checked by check, or makes one
// with create and keeps it there.
func loadOrCreate(dir string, create func() (*CA, error), check func(*CA) error) (ca *CA, created bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("CA dir: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	ca, err = LoadCA(dir)
	if err == nil {
		if err := check(ca); err != nil {
			return nil, false, err
		}
		return ca, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if _, statErr := os.Stat(filepath.Join(dir, CAKeyFile)); statErr == nil {
		// A key without its certificate: refuse rather than replace a CA
		// clients may trust.
		return nil, false, fmt.Errorf("CA in %s: %s exists but %s does not", dir, CAKeyFile, CACertFile)
	}
	if ca, err = create(); err != nil {
		return nil, false, err
	}
	if err := ca.save(dir); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

// LoadCA loads the CA kept in dir; an error wrapping fs.ErrNotExist means
// there is none.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("lab CA: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("lab CA key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("lab CA in %s: %w", dir, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("lab CA in %s: key is %T, want ECDSA", dir, pair.PrivateKey)
	}
	if !pair.Leaf.IsCA {
		return nil, fmt.Errorf("lab CA in %s: %s is not a CA certificate", dir, CACertFile)
	}
	return &CA{Cert: pair.Leaf, CertPEM: certPEM, key: key}, nil
}

// ReadCACert returns the PEM certificate of the CA kept in dir: what
// clients are told to trust.
func ReadCACert(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("lab CA: %w", err)
	}
	if block, _ := pem.Decode(b); block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("lab CA: %s holds no PEM certificate", filepath.Join(dir, CACertFile))
	}
	return b, nil
}

// Permits says whether the CA may sign names under domain: always for a
// CA without name constraints (made before they were added).
func (ca *CA) Permits(domain string) bool {
	permitted := ca.Cert.PermittedDNSDomains
	if len(permitted) == 0 || domain == "" {
		return true
	}
	domain = strings.ToLower(domain)
	for _, p := range permitted {
		p = strings.ToLower(p)
		if domain == p || strings.HasSuffix(domain, "."+p) {
			return true
		}
	}
	return false
}

// constraints are the names a CA made for domain may sign: the domain and
// every name under it, localhost, and loopback addresses.
func constraints(domain string) (dns []string, ips []*net.IPNet) {
	if domain != "" {
		dns = append(dns, strings.ToLower(domain))
	}
	if !slices.Contains(dns, "localhost") {
		dns = append(dns, "localhost")
	}
	for _, cidr := range []string{"127.0.0.0/8", "::1/128"} {
		_, n, _ := net.ParseCIDR(cidr)
		ips = append(ips, n)
	}
	return dns, ips
}

// newCA makes a CA named name; constrained limits it to names under
// domain, localhost and loopback (see constraints).
func newCA(name, domain string, constrained bool) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{name}, CommonName: name + " " + serial.Text(16)[:8]},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	if constrained {
		tmpl.PermittedDNSDomainsCritical = true
		tmpl.PermittedDNSDomains, tmpl.PermittedIPRanges = constraints(domain)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("lab CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("lab CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// save writes the key first (0600), then the certificate (0644): a
// certificate on disk always has its key beside it.
func (ca *CA) save(dir string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("lab CA key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := atomicfile.WriteDurable(filepath.Join(dir, CAKeyFile), bytes.NewReader(keyPEM), 0o600); err != nil {
		return err
	}
	return atomicfile.WriteDurable(filepath.Join(dir, CACertFile), bytes.NewReader(ca.CertPEM), 0o644)
}

// Issue makes a server certificate for names (DNS names, or IP
// addresses) signed by the CA.
func (ca *CA) Issue(names []string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("server key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"aenv"}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	if len(tmpl.DNSNames) > 0 {
		tmpl.Subject.CommonName = tmpl.DNSNames[0]
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// LeafNames are the names the lab CA's server certificate covers: the
// domain, its wildcard (every <port>-<id>.<domain> host) and the API name,
// plus loopback so that a client on the machine may use 127.0.0.1.
func LeafNames(domain string) []string {
	var names []string
	if domain != "" {
		names = append(names, domain, "*."+domain, "api."+domain)
	}
	if domain != "localhost" {
		names = append(names, "localhost")
	}
	return append(names, "127.0.0.1", "::1")
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock lab CA dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock lab CA dir: %w", err)
	}
	return func() { f.Close() }, nil
}
