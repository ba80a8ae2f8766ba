package build

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/template"
)

// ErrTooLarge: an upload is bigger than the store allows.
var ErrTooLarge = errdefs.New(errdefs.ErrTooLarge, "upload too large")

// Uploads keeps the archives of COPY steps on disk, per template, under
// the hash the SDK names them by, so an unchanged directory is uploaded
// once and an upload for one template never changes another's files. The
// SDK's hash covers paths, modes, sizes and contents as its host saw them
// (and the step's source and destination), not the archive's bytes, so it
// cannot be recomputed from them: an upload is checked to be a whole tar
// archive when it arrives, and its own SHA-256, kept beside it, whenever
// it is read.
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

// templateDir is where templateID's archives are; the prefix keeps a name
// of dots one path element.
func (u *Uploads) templateDir(templateID string) string {
	return filepath.Join(u.dir, "t-"+templateID)
}

func (u *Uploads) path(templateID, hash string) string {
	return filepath.Join(u.templateDir(templateID), hash+".tar")
}

// Present reports whether templateID's archive for hash is stored.
func (u *Uploads) Present(templateID, hash string) bool {
	if template.CheckName(templateID) != nil || !validHash(hash) {
		return false
	}
	_, err := os.Stat(u.path(templateID, hash) + ".sha256")
	return err == nil
}

// Put stores r as templateID's archive for hash once it is read whole and
// is a tar archive (gzipped or not). A partial or refused upload leaves
// nothing and keeps what was stored.
func (u *Uploads) Put(ctx context.Context, templateID, hash string, r io.Reader) error {
	if err := template.CheckName(templateID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !validHash(hash) {
		return fmt.Errorf("%w: invalid hash", ErrInvalid)
	}
	if err := os.MkdirAll(u.templateDir(templateID), 0o700); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	f, err := os.CreateTemp(u.templateDir(templateID), "upload-*")
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
	if err := checkArchive(f); err != nil {
		return fmt.Errorf("%w: the upload is not a whole tar archive: %v", ErrInvalid, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	p := u.path(templateID, hash)
	// The digest file marks the archive complete: it goes first, so a
	// replaced archive is never read against its predecessor's digest.
	os.Remove(p + ".sha256")
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err := os.WriteFile(p+".sha256", []byte(sum), 0o600); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	return nil
}

// checkArchive reads f from its start as a tar archive, gzipped or not,
// to its end.
func checkArchive(f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	entries := 0
	for {
		_, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		entries++
	}
	if entries == 0 {
		return errors.New("no files in it")
	}
	// What follows the archive's end must be read too (a gzip stream's
	// checksum is checked at its end).
	_, err := io.Copy(io.Discard, r)
	return err
}

// Open returns templateID's archive for hash after checking it is intact.
func (u *Uploads) Open(templateID, hash string) (*os.File, int64, error) {
	if template.CheckName(templateID) != nil || !validHash(hash) {
		return nil, 0, fmt.Errorf("files %s were not uploaded", hash)
	}
	p := u.path(templateID, hash)
	want, err := os.ReadFile(p + ".sha256")
	if err != nil {
		return nil, 0, fmt.Errorf("files %s were not uploaded", hash)
	}
	f, err := os.Open(p)
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
