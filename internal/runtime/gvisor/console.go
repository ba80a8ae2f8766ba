package gvisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/aenv-dev/aenv/internal/runtime"
)

var _ runtime.ConsoleReader = (*Driver)(nil)

// ConsoleTail reads the end of console.log, where the sandbox's init
// writes (see runscDetached). The file lives as long as the sandbox's
// directory: a sandbox paused to disk, or restored from a snapshot or for
// a fork, starts a new one.
func (d *Driver) ConsoleTail(id string, limit int64) ([]byte, bool, error) {
	if err := d.requireSandbox(id); err != nil {
		return nil, false, fmt.Errorf("console of %s: %w", id, err)
	}
	f, err := os.Open(filepath.Join(d.sandboxDir(id), "console.log"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("console of %s: %w", id, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("console of %s: %w", id, err)
	}
	offset := max(fi.Size()-limit, 0)
	// The file may grow while it is read; what is read is bounded anyway.
	data, err := io.ReadAll(io.NewSectionReader(f, offset, fi.Size()-offset))
	if err != nil {
		return nil, false, fmt.Errorf("console of %s: %w", id, err)
	}
	return data, offset > 0, nil
}
