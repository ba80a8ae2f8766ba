package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

func TestWriteReplacesWhole(t *testing.T) {
	for _, durable := range []bool{false, true} {
		dir := t.TempDir()
		path := filepath.Join(dir, "state.json")
		if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		write := Write
		if durable {
			write = WriteDurable
		}
		if err := write(path, strings.NewReader("new contents"), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != "new contents" {
			t.Fatalf("durable=%v: read %q, %v", durable, got, err)
		}
		fi, _ := os.Stat(path)
		if fi.Mode().Perm() != 0o640 {
			t.Errorf("durable=%v: mode %v, want 0640", durable, fi.Mode().Perm())
		}
		assertOnly(t, dir, "state.json")
	}
}

// A write that fails halfway leaves the old file as it was and no
// temporary file behind.
func TestFailedWriteKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("source broke")
	r := io.MultiReader(strings.NewReader("half"), iotest.ErrReader(boom))
	if err := WriteDurable(path, r, 0o600); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the source's", err)
	}
	got, _ := os.ReadFile(path)
	if string(got) != "old" {
		t.Errorf("file is %q after a failed write", got)
	}
	assertOnly(t, dir, "state.json")
}

func TestMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "file")
	if err := Write(path, strings.NewReader("x"), 0o600); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("directory holds %v, want %v", got, names)
	}
}
