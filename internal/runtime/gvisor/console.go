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
func (d *Driver) ConsoleTail(id string, limit int64) (runtime.ConsoleTail, error) {
	var tail runtime.ConsoleTail
	if err := d.requireSandbox(id); err != nil {
		return tail, fmt.Errorf("console of %s: %w", id, err)
	}
	f, err := os.Open(filepath.Join(d.sandboxDir(id), "console.log"))
	if errors.Is(err, fs.ErrNotExist) {
		return tail, nil
	}
	if err != nil {
		return tail, fmt.Errorf("console of %s: %w", id, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return tail, fmt.Errorf("console of %s: %w", id, err)
	}
	tail.Written = fi.ModTime()
	// One byte more than asked, to tell whether the first line is whole.
	// The file may grow while it is read; what is read is bounded anyway.
	offset := max(fi.Size()-limit-1, 0)
	if tail.Data, err = io.ReadAll(io.NewSectionReader(f, offset, fi.Size()-offset)); err != nil {
		return tail, fmt.Errorf("console of %s: %w", id, err)
	}
	if offset > 0 && len(tail.Data) > 0 {
		tail.Truncated = tail.Data[0] != '\n'
		tail.Data = tail.Data[1:]
	}
	return tail, nil
}
