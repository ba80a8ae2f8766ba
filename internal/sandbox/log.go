package sandbox

import (
	"context"
	"errors"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/sandboxlog"
)

// SandboxLog returns the entries q selects of what the sandbox's envd
// logged, oldest first: none while it holds no instance (paused on disk)
// or on a runtime that keeps no console.
func (m *Manager) SandboxLog(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	if m.entry(id) == nil {
		if _, err := m.Get(ctx, id); err != nil {
			return nil, err
		}
		return nil, nil
	}
	console, ok := m.driver.(runtime.ConsoleReader)
	if !ok {
		return nil, nil
	}
	tail, err := console.ConsoleTail(id, sandboxlog.MaxBytes)
	if errors.Is(err, runtime.ErrNotFound) {
		return nil, nil // gone, or not made yet, since the entry was read
	}
	if err != nil {
		return nil, err
	}
	return sandboxlog.Read(tail.Data, tail.Truncated, tail.Written, q), nil
}
