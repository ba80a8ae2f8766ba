package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
)

func TestConsoleTail(t *testing.T) {
	d := &Driver{cfg: Config{StateDir: t.TempDir()}}
	const id = "abcdefghij0123456789"
	if _, err := d.ConsoleTail(id, 10); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("a sandbox the driver does not hold: %v, want ErrNotFound", err)
	}
	if err := os.MkdirAll(d.sandboxDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if tail, err := d.ConsoleTail(id, 10); err != nil || len(tail.Data) != 0 || tail.Truncated {
		t.Fatalf("no console yet: %+v, %v", tail, err)
	}
	if err := os.WriteFile(filepath.Join(d.sandboxDir(id), "console.log"), []byte("first\nsecond\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		limit     int64
		data      string
		truncated bool
	}{
		{100, "first\nsecond\n", false},
		{13, "first\nsecond\n", false}, // the whole file
		{7, "second\n", false},         // the byte before is a newline: the line is whole
		{5, "cond\n", true},            // mid-line
	} {
		tail, err := d.ConsoleTail(id, tc.limit)
		if err != nil || string(tail.Data) != tc.data || tail.Truncated != tc.truncated || tail.Written.IsZero() {
			t.Errorf("limit %d: %q truncated=%v written=%v, %v; want %q truncated=%v",
				tc.limit, tail.Data, tail.Truncated, tail.Written, err, tc.data, tc.truncated)
		}
	}
}
