package config

import (
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// Database is the cluster's DSN, given one of two ways: as a value
// (--database-url, or AENV_DATABASE_URL), or as a file holding it
// (--database-url-file), which keeps a password out of `ps` and of the
// process's environment.
type Database struct {
	URL  string
	File string
	// onCommandLine: --database-url was an argument, which every user of
	// the machine can read.
	onCommandLine bool
	// fromFile: URL was read from File.
	fromFile bool
}

// urlFlag is --database-url: pflag calls Set only for a value given on the
// command line (environment values are defaults), which tells them apart.
type urlFlag struct{ d *Database }

func (f urlFlag) String() string { return f.d.URL }
func (f urlFlag) Type() string   { return "string" }
func (f urlFlag) Set(v string) error {
	f.d.URL, f.d.onCommandLine = v, true
	return nil
}

func (d *Database) register(fs *pflag.FlagSet) {
	d.URL = envString("database-url", d.URL)
	fs.Var(urlFlag{d}, "database-url", "PostgreSQL DSN of the cluster's shared state (required, or --database-url-file); "+
		"arguments are visible in ps: give a password in the environment or a file"+envHint("database-url"))
	fs.StringVar(&d.File, "database-url-file", envString("database-url-file", d.File),
		"file holding the PostgreSQL DSN (instead of --database-url)"+envHint("database-url-file"))
}

// resolve reads the DSN from its file when one is given.
func (d *Database) resolve() error {
	switch {
	case d.File == "" || d.fromFile:
		if d.URL == "" {
			return fmt.Errorf("--database-url or --database-url-file is required (a PostgreSQL DSN)")
		}
		return nil
	case d.URL != "":
		return fmt.Errorf("give the database's DSN once: --database-url (or %s) or --database-url-file, not both",
			EnvName("database-url"))
	}
	b, err := os.ReadFile(d.File)
	if err != nil {
		return fmt.Errorf("--database-url-file: %w", err)
	}
	if d.URL = strings.TrimSpace(string(b)); d.URL == "" {
		return fmt.Errorf("--database-url-file %s is empty", d.File)
	}
	d.fromFile = true
	return nil
}

// warning says why a DSN given on the command line is a risk: its
// password is readable by every user of the machine.
func (d *Database) warning() []string {
	if !d.onCommandLine || !dsnHasPassword(d.URL) {
		return nil
	}
	return []string{"the database password given with --database-url is visible to every user of this machine (ps, /proc); " +
		"give the DSN in " + EnvName("database-url") + " or with --database-url-file instead"}
}

// dsnHasPassword reports whether a PostgreSQL DSN, as a URL or as
// key=value pairs, holds a password.
func dsnHasPassword(dsn string) bool {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if _, ok := u.User.Password(); ok {
			return true
		}
		return u.Query().Has("password")
	}
	for _, field := range strings.Fields(dsn) {
		if k, _, ok := strings.Cut(field, "="); ok && strings.TrimSpace(k) == "password" {
			return true
		}
	}
	return false
}
