package diskspace

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

func TestFree(t *testing.T) {
	dir := t.TempDir()
	avail, size, err := Free(dir)
	if err != nil || size == 0 || avail > size {
		t.Fatalf("Free(%s) = %d, %d, %v", dir, avail, size, err)
	}
	if _, _, err := Free(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Free of a missing directory: %v, want it not to exist", err)
	}
}
