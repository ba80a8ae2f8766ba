package config

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// secretsKeySize is the length of the key that encrypts the secrets a
// cluster keeps in its database (AES-256).
const secretsKeySize = 32

// SecretsKey is the key, read from a file (--secrets-key-file), that
// encrypts the tokens and the cluster secret kept in the cluster's
// database. Every node and gateway of a cluster is given the same one.
type SecretsKey struct {
	File string
	// Key is the file's key once Validate has read it; nil without a file.
	Key []byte
}

func (k *SecretsKey) register(fs *pflag.FlagSet) {
	fs.StringVar(&k.File, "secrets-key-file", envString("secrets-key-file", k.File),
		"file holding the key that encrypts the sandboxes' tokens and the cluster secret in the database: "+
			"32 bytes, raw or in base64 (e.g. head -c 32 /dev/urandom | base64); the same on every node and gateway "+
			"(empty: kept in plain text)"+envHint("secrets-key-file"))
}

// resolve reads the key from its file.
func (k *SecretsKey) resolve() error {
	if k.File == "" {
		k.Key = nil
		return nil
	}
	b, err := os.ReadFile(k.File)
	if err != nil {
		return fmt.Errorf("--secrets-key-file: %w", err)
	}
	key, err := parseSecretsKey(b)
	if err != nil {
		return fmt.Errorf("--secrets-key-file %s: %w", k.File, err)
	}
	k.Key = key
	return nil
}

// parseSecretsKey accepts the key as its 32 raw bytes or as base64 (with
// or without padding, surrounding white space ignored).
func parseSecretsKey(b []byte) ([]byte, error) {
	if len(b) == secretsKeySize {
		return bytes.Clone(b), nil
	}
	text := string(bytes.TrimSpace(b))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding,
		base64.RawURLEncoding} {
		if key, err := enc.DecodeString(text); err == nil && len(key) == secretsKeySize {
			return key, nil
		}
	}
	return nil, fmt.Errorf("want %d random bytes, raw or in base64 (e.g. head -c 32 /dev/urandom | base64)",
		secretsKeySize)
}

// warning says that without a key the secrets are kept in plain text.
func (k *SecretsKey) warning() []string {
	if k.File != "" {
		return nil
	}
	return []string{"no --secrets-key-file: sandboxes' tokens and the cluster secret are kept in plain text in the " +
		"database; give every node and gateway the same key file (" + EnvName("secrets-key-file") + ") to encrypt them"}
}
