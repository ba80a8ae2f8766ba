// Package tlscert gives the HTTPS listener its certificates, in one of
// three modes: certificate files an operator provides (reloaded when they
// change), a lab CA kept on disk that signs the server's own certificate,
// or certificates obtained from an ACME server (autocert).
package tlscert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Modes.
const (
	ModeFiles = "files"
	ModeLabCA = "lab-ca"
	ModeACME  = "acme"
)

// DefaultReloadInterval is how often certificate files are looked at for
// a renewal.
const DefaultReloadInterval = 5 * time.Second

// Config says where certificates come from: CertFile and KeyFile, else an
// ACME directory, else the lab CA in CADir.
type Config struct {
	// Domain is the server's --domain: certificates cover it, api.<domain>
	// and <port>-<id>.<domain>.
	Domain string

	CertFile, KeyFile string
	// ReloadInterval bounds how often the files are looked at (0: the
	// default).
	ReloadInterval time.Duration

	// CADir keeps the lab CA.
	CADir string

	ACMEDirectory string
	ACMEEmail     string
	// ACMECAFile is a PEM root trusted, besides the system's, when
	// talking to the ACME server.
	ACMECAFile   string
	ACMECacheDir string
	// IsSandboxHost says whether a host names a port of a sandbox that
	// exists
	// (<port>-<id>.<domain>, with a well-formed ID): the ACME host policy.
	IsSandboxHost func(ctx context.Context, host string) bool
}

// Source is what the listeners need from a mode.
type Source struct {
	Mode string
	// CAFile is the lab CA's certificate (lab CA mode only).
	CAFile string
	// Leaf is the certificate served when it is fixed at start (files and
	// lab CA modes), for the start log.
	Leaf *x509.Certificate

	tlsConfig *tls.Config
	acme      acmeManager
}

// TLSConfig is the HTTPS listener's configuration (a copy).
func (s *Source) TLSConfig() *tls.Config { return s.tlsConfig.Clone() }

// HTTPHandler wraps the plain HTTP listener's handler: with ACME, the
// HTTP-01 challenges (/.well-known/acme-challenge/) are answered there and
// everything else goes to h; in other modes it is h.
func (s *Source) HTTPHandler(h http.Handler) http.Handler {
	if s.acme == nil {
		return h
	}
	return s.acme.HTTPHandler(h)
}

// New prepares the mode cfg names: it loads (and checks) certificate
// files, makes or loads the lab CA and issues the server's certificate,
// or sets up the ACME client. Nothing is asked of an ACME server yet: the
// first handshake for a name orders its certificate.
func New(cfg Config, logger *slog.Logger) (*Source, error) {
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	interval := cfg.ReloadInterval
	if interval <= 0 {
		interval = DefaultReloadInterval
	}
	switch {
	case cfg.CertFile != "" || cfg.KeyFile != "":
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		fc, err := loadFileCert(cfg.CertFile, cfg.KeyFile, interval, logger)
		if err != nil {
			return nil, err
		}
		base.GetCertificate = fc.GetCertificate
		return &Source{Mode: ModeFiles, Leaf: fc.cert.Leaf, tlsConfig: base}, nil
	case cfg.ACMEDirectory != "":
		m, err := newACME(cfg)
		if err != nil {
			return nil, err
		}
		tc := m.TLSConfig()
		tc.MinVersion = tls.VersionTLS12
		return &Source{Mode: ModeACME, tlsConfig: tc, acme: m}, nil
	default:
		if cfg.CADir == "" {
			return nil, errors.New("lab CA mode needs a directory for the CA (--tls-ca-dir)")
		}
		ca, created, err := LoadOrCreateCA(cfg.CADir, cfg.Domain)
		if err != nil {
			return nil, err
		}
		if created {
			logger.Info("made a lab CA; clients must trust its certificate (aenv ca export)", "dir", cfg.CADir)
		}
		lc, err := newLabCert(ca, LeafNames(cfg.Domain))
		if err != nil {
			return nil, err
		}
		base.GetCertificate = lc.GetCertificate
		return &Source{Mode: ModeLabCA, CAFile: filepath.Join(cfg.CADir, CACertFile), Leaf: lc.cert.Leaf, tlsConfig: base}, nil
	}
}

// labCert is the server's certificate from the lab CA, issued again when
// it nears its end (a server may run longer than a certificate lasts).
type labCert struct {
	ca    *CA
	names []string

	mu   sync.Mutex
	cert *tls.Certificate
}

func newLabCert(ca *CA, names []string) (*labCert, error) {
	cert, err := ca.Issue(names)
	if err != nil {
		return nil, err
	}
	return &labCert{ca: ca, names: names, cert: cert}, nil
}

func (l *labCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Until(l.cert.Leaf.NotAfter) < leafRenewBefore {
		cert, err := l.ca.Issue(l.names)
		if err != nil {
			return nil, fmt.Errorf("renew lab certificate: %w", err)
		}
		l.cert = cert
	}
	return l.cert, nil
}

// Uncovered lists the names a client of this server will ask for that the
// fixed certificate (Leaf) does not cover: the API name and a sandbox host.
// None when the certificate is not fixed (ACME orders per name).
func (s *Source) Uncovered(domain string) []string {
	if s.Leaf == nil || domain == "" {
		return nil
	}
	var out []string
	for _, name := range []string{"api." + domain, "49983-" + strings.Repeat("x", 20) + "." + domain} {
		if s.Leaf.VerifyHostname(name) != nil {
			out = append(out, name)
		}
	}
	return out
}
