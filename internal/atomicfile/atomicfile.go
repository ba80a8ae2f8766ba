// Package atomicfile replaces files all or nothing: a reader (or a process
// started after a crash) sees the old contents or the whole new ones, never
// a torn mix, because the new contents are written beside the file and
// renamed over it.
package atomicfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with what r yields, with permissions perm. It
// survives the writing process dying at any point; the machine losing
// power may still lose the new contents (see WriteDurable). It is for
// files rewritten often whose loss costs a retry, not data.
func Write(path string, r io.Reader, perm fs.FileMode) error {
	return write(path, r, perm, false)
}

// WriteDurable is Write that also syncs the file and its directory before
// returning, so that the new contents survive a crash of the machine.
func WriteDurable(path string, r io.Reader, perm fs.FileMode) error {
	return write(path, r, perm, true)
}

func write(path string, r io.Reader, perm fs.FileMode, durable bool) (err error) {
	dir := filepath.Dir(path)
	// The temporary name starts with a dot and names its target, so that
	// one left by a crash is recognisable and hidden from listings.
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		return fmt.Errorf("replace %s: write: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("replace %s: sync: %w", path, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	// The rename itself lasts only once the directory is synced.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("replace %s: sync directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("replace %s: sync directory: %w", path, err)
	}
	return nil
}
