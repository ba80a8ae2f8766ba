package egress

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
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
)

// CA is the node's egress CA: it signs, on the fly, the certificates the
// gateway shows sandboxes for the hosts whose requests it transforms.
// Sandboxes with such rules trust it (and only they); nothing else does.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// leafKey is the one key of every leaf: a leaf is made per host, and
	// a key per leaf would cost a key generation per new host for nothing
	// (the leaves are only ever shown to this node's sandboxes).
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Lifetimes of the CA and of the certificates it signs.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
	// leafRenewal: a cached leaf this close to its end is signed afresh.
	leafRenewal = 24 * time.Hour
	// maxLeaves bounds the cache; past it, it starts afresh.
	maxLeaves = 4096
)

// LoadOrCreateCA reads the CA kept in dir (ca.pem, ca-key.pem), making one
// the first time. name goes into its subject.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		if certPEM, err = createCA(dir, certPath, keyPath, name); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	certBlock, _ := pem.Decode(certPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if certBlock == nil || keyBlock == nil {
		return nil, fmt.Errorf("egress CA in %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA key: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, key: key, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

func createCA(dir, certPath, keyPath, name string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "aenv egress CA " + name, Organization: []string{"aenv"}},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	// The key first, and each written aside then renamed: a crash leaves
	// either no CA (made again) or a whole one.
	if err := atomicfile.WriteDurable(keyPath, bytes.NewReader(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})), 0o600); err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := atomicfile.WriteDurable(certPath, bytes.NewReader(certPEM), 0o644); err != nil {
		return nil, err
	}
	return certPEM, nil
}

// CertPEM is the CA's certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// leaf returns a certificate for host signed by the CA, cached.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > leafRenewal {
		return c, nil
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(leafLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %s: %w", host, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: parsed}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}
