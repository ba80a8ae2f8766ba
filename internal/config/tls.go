package config

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"

	"github.com/spf13/pflag"
)

// TLS configures the HTTPS listener of a server, node or gateway. Its
// certificates come from, first match: --tls-cert/--tls-key, an ACME
// server (--acme-directory), or a lab CA kept in --tls-ca-dir.
type TLS struct {
	Listen   string
	CertFile string
	KeyFile  string
	CADir    string

	ACMEDirectory string
	ACMEEmail     string
	ACMECAFile    string
	ACMECacheDir  string
}

// register adds the TLS flags; dataDir says whether the command
// has a data dir to keep the lab CA and the ACME cache in by default.
func (c *TLS) register(fs *pflag.FlagSet, dataDir bool) {
	str := func(p *string, name, usage string) {
		fs.StringVar(p, name, envString(name, *p), usage+envHint(name))
	}
	str(&c.Listen, "tls-listen", "address of an HTTPS listener serving what --listen serves (the API, envd traffic and <port>-<id>.<domain> hosts) with the same limits; --listen stays plain HTTP (empty: no HTTPS)")
	str(&c.CertFile, "tls-cert", "PEM certificate (chain) of the HTTPS listener, typically a wildcard for *.<domain> plus api.<domain>; looked at again every few seconds, so a renewal needs no restart (needs --tls-key)")
	str(&c.KeyFile, "tls-key", "PEM private key of --tls-cert")
	caDefault, cacheDefault := "default: <data-dir>/tls", "default: <data-dir>/tls/acme"
	if !dataDir {
		caDefault, cacheDefault = "required in this mode: the gateway has no data dir; gateways sharing one directory share one CA", "required with --acme-directory"
	}
	str(&c.CADir, "tls-ca-dir", "directory of the lab CA (ca.pem, ca-key.pem, made at first start), used when --tls-listen is set without --tls-cert or --acme-directory: it signs the listener's certificate for <domain>, *.<domain> and api.<domain>; clients trust the output of aenv ca export ("+caDefault+")")
	str(&c.ACMEDirectory, "acme-directory", "ACME directory URL (e.g. https://acme-v02.api.letsencrypt.org/directory): get certificates for <domain>, api.<domain> and each <port>-<id>.<domain> host at its first handshake, through TLS-ALPN-01 on --tls-listen or HTTP-01 on --listen (which must then be reachable on port 80); a wildcard from DNS-01 with --tls-cert is better for many sandboxes")
	str(&c.ACMEEmail, "acme-email", "contact address given to the ACME server (optional)")
	str(&c.ACMECAFile, "acme-ca-file", "PEM root to trust, besides the system's, when talking to the ACME server (a private or test ACME server)")
	str(&c.ACMECacheDir, "acme-cache-dir", "where ACME account keys and certificates are kept ("+cacheDefault+")")
}

// Enabled reports whether an HTTPS listener is configured.
func (c *TLS) Enabled() bool { return c.Listen != "" }

// validate checks the combination; dataDir is the command's data dir
// ("" for the gateway), which gives the lab CA's and the ACME cache's
// default places.
func (c *TLS) validate(dataDir, domain string) error {
	files := c.CertFile != "" || c.KeyFile != ""
	acme := c.ACMEDirectory != ""
	if !c.Enabled() {
		for _, f := range []struct{ name, v string }{
			{"--tls-cert", c.CertFile}, {"--tls-key", c.KeyFile}, {"--tls-ca-dir", c.CADir},
			{"--acme-directory", c.ACMEDirectory}, {"--acme-email", c.ACMEEmail},
			{"--acme-ca-file", c.ACMECAFile}, {"--acme-cache-dir", c.ACMECacheDir},
		} {
			if f.v != "" {
				return fmt.Errorf("%s needs --tls-listen", f.name)
			}
		}
		return nil
	}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		return errors.New("--tls-cert needs --tls-key")
	case c.KeyFile != "" && c.CertFile == "":
		return errors.New("--tls-key needs --tls-cert")
	case files && acme:
		return errors.New("--tls-cert and --acme-directory are two sources of certificates: give one")
	case c.CADir != "" && (files || acme):
		return errors.New("--tls-ca-dir is the lab CA mode's: it goes with neither --tls-cert nor --acme-directory")
	case !acme && (c.ACMEEmail != "" || c.ACMECAFile != "" || c.ACMECacheDir != ""):
		return errors.New("--acme-email, --acme-ca-file and --acme-cache-dir need --acme-directory")
	}
	if acme {
		u, err := url.Parse(c.ACMEDirectory)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("--acme-directory must be an http(s) URL, got %q", c.ACMEDirectory)
		}
		if domain == "" {
			return errors.New("--acme-directory needs --domain: certificates are ordered for its names")
		}
		if c.ACMECacheDir == "" && dataDir == "" {
			return errors.New("--acme-directory needs --acme-cache-dir on a gateway (it has no data dir)")
		}
	}
	if !files && !acme && c.CADir == "" && dataDir == "" {
		return errors.New("--tls-listen on a gateway needs certificates: --tls-cert and --tls-key, --acme-directory, " +
			"or --tls-ca-dir for a lab CA (the gateway has no data dir; gateways sharing the directory share the CA)")
	}
	return nil
}

// withDefaults fills the lab CA's and the ACME cache's directories under
// dataDir when unset.
func (c TLS) withDefaults(dataDir string) TLS {
	if dataDir == "" || !c.Enabled() {
		return c
	}
	files := c.CertFile != "" || c.KeyFile != ""
	if c.ACMEDirectory != "" && c.ACMECacheDir == "" {
		c.ACMECacheDir = filepath.Join(dataDir, "tls", "acme")
	}
	if !files && c.ACMEDirectory == "" && c.CADir == "" {
		c.CADir = DefaultCADir(dataDir)
	}
	return c
}

// DefaultCADir is where a server keeps its lab CA.
func DefaultCADir(dataDir string) string { return filepath.Join(dataDir, "tls") }

// TLSSettings is the HTTPS configuration with the data dir's defaults
// filled in.
func (c *Server) TLSSettings() TLS { return c.TLS.withDefaults(c.DataDir) }
