package config

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestSecretsKey: the key comes from --secrets-key-file or its variable,
// as 32 raw bytes or base64; anything else is refused at Validate; no file
// is allowed but warned about.
func TestSecretsKey(t *testing.T) {
	dir := t.TempDir()
	key := bytes.Repeat([]byte{0xa5}, 32)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	raw := write("raw", key)
	b64 := write("b64", []byte(base64.StdEncoding.EncodeToString(key)+"\n"))
	short := write("short", []byte(base64.StdEncoding.EncodeToString(key[:16])))
	for _, tc := range []struct {
		name    string
		env     string
		args    []string
		want    []byte
		warn    bool
		wantErr string
	}{
		{name: "none", warn: true},
		{name: "raw", args: []string{"--secrets-key-file", raw}, want: key},
		{name: "base64", args: []string{"--secrets-key-file", b64}, want: key},
		{name: "environment", env: b64, want: key},
		{name: "too short", args: []string{"--secrets-key-file", short}, wantErr: "want 32 random bytes"},
		{name: "missing", args: []string{"--secrets-key-file", filepath.Join(dir, "nope")}, wantErr: "--secrets-key-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AENV_DATABASE_URL", "postgres://aenv@db/aenv")
			t.Setenv("AENV_DATABASE_URL_FILE", "")
			t.Setenv("AENV_SECRETS_KEY_FILE", tc.env)
			for _, kind := range []string{"node", "gateway"} {
				fs := pflag.NewFlagSet(kind, pflag.ContinueOnError)
				var validate func() error
				var warnings func() []string
				var sk *SecretsKey
				if kind == "node" {
					c := DefaultCluster()
					c.RegisterFlags(fs)
					validate, warnings, sk = c.Validate, c.Warnings, &c.SecretsKey
				} else {
					c := DefaultGateway()
					c.RegisterFlags(fs)
					validate, warnings, sk = c.Validate, c.Warnings, &c.SecretsKey
				}
				if err := fs.Parse(tc.args); err != nil {
					t.Fatal(err)
				}
				err := validate()
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Errorf("%s: Validate() = %v, want an error containing %q", kind, err, tc.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: Validate: %v", kind, err)
				}
				if !bytes.Equal(sk.Key, tc.want) {
					t.Errorf("%s: key %x, want %x", kind, sk.Key, tc.want)
				}
				w := warnings()
				if got := len(w) > 0; got != tc.warn {
					t.Errorf("%s: warnings %q, want a warning: %v", kind, w, tc.warn)
				}
				if tc.warn && !strings.Contains(strings.Join(w, "\n"), "--secrets-key-file") {
					t.Errorf("%s: warnings %q do not name --secrets-key-file", kind, w)
				}
			}
		})
	}
}
