package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestDatabaseURL: the DSN comes from --database-url, AENV_DATABASE_URL
// or --database-url-file; a password on the command line (where ps shows
// it) is warned about, one in the environment or a file is not.
func TestDatabaseURL(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "dsn")
	if err := os.WriteFile(file, []byte("postgres://aenv:s3cret@db/aenv\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const withPassword = "postgres://aenv:s3cret@db/aenv"
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, make([]byte, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    string
		warn    bool
		wantErr string
	}{
		{name: "flag with a password", args: []string{"--database-url", withPassword}, want: withPassword, warn: true},
		{name: "flag with a key=value password", args: []string{"--database-url", "host=db user=aenv password=s3cret"},
			want: "host=db user=aenv password=s3cret", warn: true},
		{name: "flag with a password parameter", args: []string{"--database-url", "postgres://db/aenv?password=x"},
			want: "postgres://db/aenv?password=x", warn: true},
		{name: "flag without a password", args: []string{"--database-url", "postgres://aenv@db/aenv"},
			want: "postgres://aenv@db/aenv"},
		{name: "environment", env: map[string]string{"AENV_DATABASE_URL": withPassword}, want: withPassword},
		{name: "file", args: []string{"--database-url-file", file}, want: withPassword},
		{name: "file from the environment", env: map[string]string{"AENV_DATABASE_URL_FILE": file}, want: withPassword},
		{name: "none", wantErr: "--database-url or --database-url-file is required"},
		{name: "both", args: []string{"--database-url", "postgres://db/x", "--database-url-file", file},
			wantErr: "not both"},
		{name: "missing file", args: []string{"--database-url-file", filepath.Join(dir, "nope")},
			wantErr: "--database-url-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"AENV_DATABASE_URL", "AENV_DATABASE_URL_FILE"} {
				t.Setenv(k, tc.env[k])
			}
			// A secrets key, so that only the DSN is warned about here.
			t.Setenv("AENV_SECRETS_KEY_FILE", keyFile)
			for _, kind := range []string{"node", "gateway"} {
				fs := pflag.NewFlagSet(kind, pflag.ContinueOnError)
				var validate func() error
				var warnings func() []string
				var url func() string
				if kind == "node" {
					c := DefaultCluster()
					c.RegisterFlags(fs)
					validate, warnings, url = c.Validate, c.Warnings, func() string { return c.Database.URL }
				} else {
					c := DefaultGateway()
					c.RegisterFlags(fs)
					validate, warnings, url = c.Validate, c.Warnings, func() string { return c.Database.URL }
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
				if err := validate(); err != nil {
					t.Errorf("%s: Validate again: %v", kind, err)
				}
				if got := url(); got != tc.want {
					t.Errorf("%s: DSN %q, want %q", kind, got, tc.want)
				}
				if got := len(warnings()) > 0; got != tc.warn {
					t.Errorf("%s: warnings %q, want a warning: %v", kind, warnings(), tc.warn)
				}
			}
		})
	}
}
