package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ErrTooLarge: an upload is bigger than the store allows.
var ErrTooLarge = errors.New("upload too large")

// Uploads keeps the archives of COPY steps on disk under the hash the SDK
// names them by, so an unchanged directory is uploaded once. The SDK's
// hash covers paths, modes and contents, not the archive's bytes, so it
// cannot be checked against them; the archive's own SHA-256 is kept
// beside it and checked whenever it is read.
type Uploads struct {
	dir      string
	maxBytes int64
}

// NewUploads keeps archives of at most maxBytes in dir.
func NewUploads(dir string, maxBytes int64) (*Uploads, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uploads dir: %w", err)
	}
	return &Uploads{dir: dir, maxBytes: maxBytes}, nil
}

func (u *Uploads) path(hash string) string { return filepath.Join(u.dir, hash+".tar") }

// Present reports whether the archive for hash is stored.
func (u *Uploads) Present(hash string) bool {
	_, err := os.Stat(u.path(hash) + ".sha256")
	return err == nil
}

// Put stores r as the archive for hash. A partial upload leaves nothing.
func (u *Uploads) Put(ctx context.Context, hash string, r io.Reader) error {
	if !validHash(hash) {
		return fmt.Errorf("%w: invalid hash", ErrInvalid)
	}
	f, err := os.CreateTemp(u.dir, "upload-*")
	if err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, u.maxBytes+1))
	if err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	if n > u.maxBytes {
		return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, u.maxBytes)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	if err := os.Rename(f.Name(), u.path(hash)); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	// The digest file marks the archive complete.
	sum := hex.EncodeToString(h.Sum(nil))
	if err := os.WriteFile(u.path(hash)+".sha256", []byte(sum), 0o600); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	return nil
}

// Open returns the archive for hash after checking it is intact.
func (u *Uploads) Open(hash string) (*os.File, int64, error) {
	want, err := os.ReadFile(u.path(hash) + ".sha256")
	if err != nil {
		return nil, 0, fmt.Errorf("files %s were not uploaded", hash)
	}
	f, err := os.Open(u.path(hash))
	if err != nil {
		return nil, 0, fmt.Errorf("files %s were not uploaded", hash)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil || hex.EncodeToString(h.Sum(nil)) != string(want) {
		f.Close()
		return nil, 0, fmt.Errorf("stored files %s are damaged; upload them again", hash)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("read upload: %w", err)
	}
	return f, n, nil
}
