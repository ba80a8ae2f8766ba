package egress

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/tlscert"
)

// CA is the node's egress CA: it signs, on the fly, the certificates the
// gateway shows sandboxes for the hosts whose requests it transforms.
// Sandboxes with such rules trust it (and only they); nothing else does.
// It is a tlscert CA without name constraints, with the leaves it signed
// kept per host.
type CA struct {
	ca *tlscert.CA

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

const (
	// leafRenewal: a cached leaf this close to its end is signed afresh.
	leafRenewal = 30 * 24 * time.Hour
	// maxLeaves bounds the cache; past it, it starts afresh.
	maxLeaves = 4096
)

// LoadOrCreateCA reads the CA kept in dir (tlscert's files), making one
// the first time.
func LoadOrCreateCA(dir string) (*CA, error) {
	ca, err := tlscert.LoadOrCreateOpenCA(dir, "aenv egress CA")
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	return &CA{ca: ca, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA's certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return ca.ca.CertPEM }

// leaf returns a certificate for host signed by the CA, cached.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > leafRenewal {
		return c, nil
	}
	c, err := ca.ca.Issue([]string{host})
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %s: %w", host, err)
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}
