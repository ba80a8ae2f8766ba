package tlscert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// acmeManager is what the listeners use of autocert's Manager.
type acmeManager interface {
	TLSConfig() *tls.Config
	HTTPHandler(fallback http.Handler) http.Handler
}

// newACME sets up autocert: certificates per host name, ordered at the
// first handshake naming a host the policy allows, kept in the cache dir
// and renewed before they end. Challenges are answered on the HTTPS
// listener (TLS-ALPN-01) and on the plain one (HTTP-01).
func newACME(cfg Config) (*autocert.Manager, error) {
	if cfg.ACMECacheDir == "" {
		return nil, errors.New("ACME needs a cache dir (--acme-cache-dir)")
	}
	if err := os.MkdirAll(cfg.ACMECacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("ACME cache dir: %w", err)
	}
	hc, err := acmeHTTPClient(cfg.ACMECAFile)
	if err != nil {
		return nil, err
	}
	return &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(cfg.ACMECacheDir),
		HostPolicy: HostPolicy(cfg.Domain, cfg.IsSandboxHost),
		Email:      cfg.ACMEEmail,
		Client:     &acme.Client{DirectoryURL: cfg.ACMEDirectory, HTTPClient: hc},
	}, nil
}

// acmeHTTPClient talks to the ACME server, trusting caFile's roots besides
// the system's (a test or private ACME server).
func acmeHTTPClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return &http.Client{Timeout: time.Minute}, nil
	}
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--acme-ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--acme-ca-file %s holds no PEM certificate", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: time.Minute}, nil
}

// HostPolicy allows certificates for the domain, its API name and hosts
// of sandbox ports (isSandboxHost), nothing else: every other name a
// client puts in its TLS handshake would otherwise cost an ACME order.
func HostPolicy(domain string, isSandboxHost func(context.Context, string) bool) autocert.HostPolicy {
	domain = strings.ToLower(domain)
	return func(ctx context.Context, host string) error {
		// An HTTP-01 challenge names the host as its request's Host,
		// which may carry a port (some ACME servers send one).
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.ToLower(host)
		switch {
		case domain == "":
		case host == domain, host == "api."+domain:
			return nil
		case isSandboxHost != nil && isSandboxHost(ctx, host):
			return nil
		}
		return fmt.Errorf("acme/autocert: host %q is not served here", host)
	}
}
