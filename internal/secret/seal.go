package secret

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/aenv-dev/aenv/internal/atomicfile"
)

// KeySize is the length of the key that seals secrets' values: AES-256.
const KeySize = 32

// sealedMagic starts a sealed value; its digit is the format's version.
// After it: the key's ID (keyIDSize bytes), the nonce, and the AES-GCM
// ciphertext of the value with the secret's ID as additional data, so a
// sealed value moved to another secret's row does not open.
const sealedMagic = "aes1"

const keyIDSize = 8

// ErrKey: a sealed value was sealed with another key than the box's.
var ErrKey = errors.New("sealed with another key")

// Box seals and opens secrets' values with one key.
type Box struct {
	aead  cipher.AEAD
	keyID []byte
}

// NewBox returns a box of key (KeySize bytes).
func NewBox(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key: %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	// The key's ID says which key sealed a value (a digest: it tells
	// nothing of the key).
	sum := sha256.Sum256(append([]byte("aenv secrets key id\x00"), key...))
	return &Box{aead: aead, keyID: sum[:keyIDSize]}, nil
}

// Seal seals value, bound to the secret id.
func (b *Box) Seal(id string, value []byte) []byte {
	nonce := make([]byte, b.aead.NonceSize())
	rand.Read(nonce)
	out := append([]byte(sealedMagic), b.keyID...)
	out = append(out, nonce...)
	return b.aead.Seal(out, nonce, value, []byte(id))
}

// Open opens what Seal sealed for the secret id.
func (b *Box) Open(id string, sealed []byte) ([]byte, error) {
	head := len(sealedMagic) + keyIDSize + b.aead.NonceSize()
	if len(sealed) < head+b.aead.Overhead() || string(sealed[:len(sealedMagic)]) != sealedMagic {
		return nil, errors.New("not a sealed value")
	}
	if !bytes.Equal(sealed[len(sealedMagic):len(sealedMagic)+keyIDSize], b.keyID) {
		return nil, ErrKey
	}
	nonce := sealed[len(sealedMagic)+keyIDSize : head]
	value, err := b.aead.Open(nil, nonce, sealed[head:], []byte(id))
	if err != nil {
		return nil, fmt.Errorf("open sealed value: %w", err)
	}
	return value, nil
}

// LoadOrCreateKey reads the key kept at path, making one (KeySize random
// bytes, in base64, readable by root alone) when there is none: a single
// server's key, kept beside its database in the data directory.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, KeySize)
		rand.Read(key)
		text := base64.StdEncoding.EncodeToString(key) + "\n"
		// Written aside and renamed: a crash never leaves half a key,
		// which would lose every secret sealed with the whole one.
		if err := atomicfile.WriteDurable(path, strings.NewReader(text), 0o600); err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("secrets key %s: want %d bytes in base64", path, KeySize)
	}
	return key, nil
}
