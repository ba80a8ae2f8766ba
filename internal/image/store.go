package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// layerPath is where the blob with digest lives in the store:
// <dir>/sha256/<hex>.
func layerPath(dir, digest string) (string, error) {
	algo, hexSum, ok := strings.Cut(digest, ":")
	if !ok || algo != "sha256" || len(hexSum) != 64 {
		return "", fmt.Errorf("layer digest %q: not a sha256 digest", digest)
	}
	if _, err := hex.DecodeString(hexSum); err != nil {
		return "", fmt.Errorf("layer digest %q: %w", digest, err)
	}
	return filepath.Join(dir, algo, hexSum), nil
}

// hasLayer reports whether the store holds the blob.
func hasLayer(dir, digest string) (bool, error) {
	p, err := layerPath(dir, digest)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// putLayer copies r into the store under digest, verifying the content.
// The blob appears whole or not at all: it is written to a temporary file
// and renamed into place.
func putLayer(dir, digest string, r io.Reader) error {
	p, err := layerPath(dir, digest)
	if err != nil {
		return err
	}
	// Layers may hold a private image's content: the store is the server's
	// alone, whatever the data dir's mode.
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	sum := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, sum), r); err != nil {
		tmp.Close()
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != digest {
		return fmt.Errorf("store layer %s: content has digest %s", digest, got)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	return nil
}
