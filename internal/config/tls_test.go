package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestTLSFlags: every combination of the TLS flags is accepted or refused
// at start with an error naming the flags, on a server (which has a data
// dir for the lab CA and the ACME cache) and on a gateway (which has not).
func TestTLSFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		server  string // "" accepted, else a fragment of the error
		gateway string
	}{
		{"off", nil, "", ""},
		{"lab CA", []string{"--tls-listen", ":8443"}, "", "--tls-ca-dir"},
		{"lab CA in a dir", []string{"--tls-listen", ":8443", "--tls-ca-dir", "/x"}, "", ""},
		{"files", []string{"--tls-listen", ":8443", "--tls-cert", "c", "--tls-key", "k"}, "", ""},
		{"cert without key", []string{"--tls-listen", ":8443", "--tls-cert", "c"}, "--tls-cert needs --tls-key", "--tls-cert needs --tls-key"},
		{"key without cert", []string{"--tls-listen", ":8443", "--tls-key", "k"}, "--tls-key needs --tls-cert", "--tls-key needs --tls-cert"},
		{"cert without listener", []string{"--tls-cert", "c", "--tls-key", "k"}, "--tls-cert needs --tls-listen", "--tls-cert needs --tls-listen"},
		{"files and ACME", []string{"--tls-listen", ":8443", "--tls-cert", "c", "--tls-key", "k", "--acme-directory", "https://a/d"}, "give one", "give one"},
		{"CA dir and files", []string{"--tls-listen", ":8443", "--tls-ca-dir", "/x", "--tls-cert", "c", "--tls-key", "k"}, "lab CA mode", "lab CA mode"},
		{"ACME", []string{"--tls-listen", ":8443", "--acme-directory", "https://a/d", "--acme-email", "ops@example.org"}, "", "--acme-cache-dir"},
		{"ACME with a cache", []string{"--tls-listen", ":8443", "--acme-directory", "https://a/d", "--acme-cache-dir", "/c"}, "", ""},
		{"ACME not a URL", []string{"--tls-listen", ":8443", "--acme-directory", "a/d", "--acme-cache-dir", "/c"}, "http(s) URL", "http(s) URL"},
		{"ACME without domain", []string{"--tls-listen", ":8443", "--acme-directory", "https://a/d", "--acme-cache-dir", "/c", "--domain", ""}, "needs --domain", "needs --domain"},
		{"ACME email alone", []string{"--tls-listen", ":8443", "--acme-email", "a@b"}, "need --acme-directory", "need --acme-directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Default()
			fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
			s.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			checkErr(t, "server", s.Validate(), tc.server)
			g := DefaultGateway()
			fs = pflag.NewFlagSet("gateway", pflag.ContinueOnError)
			g.RegisterFlags(fs)
			if err := fs.Parse(append(tc.args, "--database-url", "postgres://db/x")); err != nil {
				t.Fatal(err)
			}
			checkErr(t, "gateway", g.Validate(), tc.gateway)
		})
	}
}

func checkErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	if want == "" && err != nil {
		t.Errorf("%s refused: %v", what, err)
	}
	if want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
		t.Errorf("%s: %v, want an error with %q", what, err, want)
	}
}

// TestTLSDefaultsUnderDataDir: a server keeps its lab CA and ACME cache
// in its data dir unless told otherwise.
func TestTLSDefaultsUnderDataDir(t *testing.T) {
	s := Default()
	s.DataDir = "/d"
	s.TLS.Listen = ":8443"
	if got := s.TLSSettings().CADir; got != filepath.Join("/d", "tls") {
		t.Errorf("lab CA dir %q", got)
	}
	s.TLS.ACMEDirectory = "https://a/d"
	if got := s.TLSSettings(); got.ACMECacheDir != filepath.Join("/d", "tls", "acme") || got.CADir != "" {
		t.Errorf("ACME: cache %q, CA dir %q", got.ACMECacheDir, got.CADir)
	}
	s.TLS = TLS{Listen: ":8443", CertFile: "c", KeyFile: "k"}
	if got := s.TLSSettings(); got.CADir != "" || got.ACMECacheDir != "" {
		t.Errorf("files: %+v", got)
	}
}
