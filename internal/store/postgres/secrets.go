package postgres

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Secrets at rest. The values a process must read back — sandboxes' envd
// access and traffic tokens, templates' envd tokens, the cluster secret
// (gateways call nodes with the one kept here) and the answers kept for
// idempotent replays (a create's answer holds the tokens) — are sealed
// with AES-256-GCM under a key the operator gives every member of the
// cluster (--secrets-key-file). A sealed value is sealedPrefix followed by
// base64(nonce | ciphertext); anything else is a value written in plain
// text (before a key was given, or by a store without one), which still
// reads and is sealed when written again or when a store with the key
// opens the database (sealPlainRows). API keys are kept as digests
// instead: they are only compared.

// sealedPrefix marks a sealed value; the digit is the format's version.
const sealedPrefix = "enc1:"

// SecretsKeySize is the length of a secrets key: AES-256.
const SecretsKeySize = 32

// ErrSecretsKey: the secrets key given (or its absence) does not fit the
// database: a value does not open with it, or the database holds sealed
// values and no key was given.
var ErrSecretsKey = errors.New("secrets key does not match the database")

// Options are what a store may be opened with beyond its DSN.
type Options struct {
	// SecretsKey (SecretsKeySize bytes) seals the secrets the store
	// writes; nil writes them in plain text, as before keys existed.
	SecretsKey []byte
}

// secretBox seals and opens secrets; a nil one (or one without a key)
// writes plain text and refuses sealed values.
type secretBox struct {
	aead cipher.AEAD
}

func newSecretBox(key []byte) (*secretBox, error) {
	if key == nil {
		return &secretBox{}, nil
	}
	if len(key) != SecretsKeySize {
		return nil, fmt.Errorf("secrets key: %d bytes, want %d", len(key), SecretsKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return &secretBox{aead: aead}, nil
}

func (b *secretBox) keyed() bool { return b != nil && b.aead != nil }

// aad binds a sealed value to where it is kept (column and row), so that
// one cannot be moved to another row or column and still open.
func aad(column, id string) []byte { return []byte(column + "\x00" + id) }

// seal returns what to store for plain, the value of column in row id.
// Empty values stay empty: there is nothing to hide.
func (b *secretBox) seal(column, id, plain string) (string, error) {
	if !b.keyed() || plain == "" {
		return plain, nil
	}
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal %s: %w", column, err)
	}
	sealed := b.aead.Seal(nonce, nonce, []byte(plain), aad(column, id))
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(sealed), nil
}

// open returns the plain value of a stored one.
func (b *secretBox) open(column, id, stored string) (string, error) {
	rest, ok := strings.CutPrefix(stored, sealedPrefix)
	if !ok {
		return stored, nil // written in plain text
	}
	if !b.keyed() {
		return "", fmt.Errorf("%s of %s is encrypted and no --secrets-key-file was given: %w", column, id, ErrSecretsKey)
	}
	raw, err := base64.RawStdEncoding.DecodeString(rest)
	if err != nil || len(raw) < b.aead.NonceSize() {
		return "", fmt.Errorf("%s of %s: malformed encrypted value: %w", column, id, ErrSecretsKey)
	}
	n := b.aead.NonceSize()
	plain, err := b.aead.Open(nil, raw[:n], raw[n:], aad(column, id))
	if err != nil {
		return "", fmt.Errorf("%s of %s does not decrypt with the --secrets-key-file key (another key, or altered): %w",
			column, id, ErrSecretsKey)
	}
	return string(plain), nil
}

// Where the secrets are kept, as aad's column names.
const (
	colAccessToken   = "sandboxes.access_token"
	colTrafficToken  = "sandboxes.traffic_token"
	colEnvdToken     = "templates.envd_token"
	colClusterSecret = "cluster_settings.cluster_secret"
	colKeyCheck      = "cluster_settings.secrets_key_check"
	colReplayBody    = "idempotency.body"
)

// keyCheckText is sealed into cluster_settings by the first store opened
// with a key, so that one opened with another key, or none, fails at once
// rather than on its first read of a secret.
const keyCheckText = "aenv secrets key check"

// checkSecretsKey makes sure the store's key (or its absence) is the one
// the database's sealed values were written with.
func (s *Store) checkSecretsKey(ctx context.Context) error {
	if s.box.keyed() {
		check, err := s.box.seal(colKeyCheck, "", keyCheckText)
		if err != nil {
			return err
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO cluster_settings (name, value) VALUES ('secrets_key_check', $1)
			ON CONFLICT (name) DO NOTHING`, check); err != nil {
			return fmt.Errorf("secrets key check: %w", err)
		}
	}
	var stored string
	err := s.pool.QueryRow(ctx, `SELECT value FROM cluster_settings WHERE name = 'secrets_key_check'`).Scan(&stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // no key yet, and none given
	case err != nil:
		return fmt.Errorf("secrets key check: %w", err)
	case !s.box.keyed():
		return fmt.Errorf("this cluster's database keeps its secrets encrypted: give every node and gateway "+
			"the cluster's key with --secrets-key-file: %w", ErrSecretsKey)
	}
	got, err := s.box.open(colKeyCheck, "", stored)
	if err != nil || got != keyCheckText {
		return fmt.Errorf("--secrets-key-file holds another key than the one this cluster's database was "+
			"encrypted with: %w", ErrSecretsKey)
	}
	return s.sealPlainRows(ctx)
}

// plainColumns are the secret columns sealPlainRows seals.
var plainColumns = []struct {
	table, column, idColumn, where, aad string
}{
	{"sandboxes", "access_token", "id", "", colAccessToken},
	{"sandboxes", "traffic_token", "id", "", colTrafficToken},
	{"templates", "envd_token", "id", "", colEnvdToken},
	{"cluster_settings", "value", "name", " AND name = 'cluster_secret'", colClusterSecret},
}

// sealPlainRows seals the secrets written in plain text (before the key
// was given). Each row is updated only if its value is still the plain
// one read, so that a write racing with this one is kept.
func (s *Store) sealPlainRows(ctx context.Context) error {
	for _, c := range plainColumns {
		rows, err := s.pool.Query(ctx, `SELECT `+c.idColumn+`, `+c.column+` FROM `+c.table+
			` WHERE `+c.column+` <> '' AND `+c.column+` NOT LIKE '`+sealedPrefix+`%'`+c.where)
		if err != nil {
			return fmt.Errorf("encrypt plain %s.%s: %w", c.table, c.column, err)
		}
		type plainRow struct{ id, value string }
		plain, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (plainRow, error) {
			var p plainRow
			err := r.Scan(&p.id, &p.value)
			return p, err
		})
		if err != nil {
			return fmt.Errorf("encrypt plain %s.%s: %w", c.table, c.column, err)
		}
		for _, p := range plain {
			sealed, err := s.box.seal(c.aad, sealedID(c.aad, p.id), p.value)
			if err != nil {
				return err
			}
			if _, err := s.pool.Exec(ctx, `UPDATE `+c.table+` SET `+c.column+` = $3 WHERE `+c.idColumn+
				` = $1 AND `+c.column+` = $2`, p.id, p.value, sealed); err != nil {
				return fmt.Errorf("encrypt plain %s.%s of %s: %w", c.table, c.column, p.id, err)
			}
		}
	}
	return nil
}

// sealedID is the row ID a column's values are bound to: the cluster
// secret is one value, bound to none.
func sealedID(column, id string) string {
	if column == colClusterSecret {
		return ""
	}
	return id
}
