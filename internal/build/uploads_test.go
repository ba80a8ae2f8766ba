package build

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUploads(t *testing.T) {
	dir := t.TempDir()
	u, err := NewUploads(dir, 16)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if u.Present(hashA) {
		t.Fatal("present before upload")
	}
	if err := u.Put(ctx, hashA, strings.NewReader("0123456789abcdefX")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized upload: %v", err)
	}
	if u.Present(hashA) {
		t.Fatal("oversized upload kept")
	}
	if err := u.Put(ctx, "../x", strings.NewReader("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad hash: %v", err)
	}
	if err := u.Put(ctx, hashA, strings.NewReader("archive")); err != nil {
		t.Fatal(err)
	}
	if !u.Present(hashA) {
		t.Fatal("not present after upload")
	}
	f, n, err := u.Open(hashA)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(f)
	f.Close()
	if string(data) != "archive" || n != 7 {
		t.Fatalf("read %q (%d)", data, n)
	}
	// A damaged archive is refused rather than copied into a template.
	if err := os.WriteFile(filepath.Join(dir, hashA+".tar"), []byte("archivE"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.Open(hashA); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("damaged archive: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "upload-") {
			t.Fatalf("temporary file %s left", e.Name())
		}
	}
}
