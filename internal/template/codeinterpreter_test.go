package template

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/sqlite"
)

func TestCodeInterpreterConfig(t *testing.T) {
	base := DefaultBaseConfig("/c")
	before := slices.Clone(base.Packages)
	ci := codeInterpreterConfig(base)
	if !slices.Equal(base.Packages, before) {
		t.Errorf("base packages changed to %v", base.Packages)
	}
	if ci.key() == base.key() {
		t.Error("the code interpreter must not share base's cache entry")
	}
	for _, p := range append(before, "python3-ipython", "python3-matplotlib", "python3-pandas") {
		if !slices.Contains(ci.Packages, p) {
			t.Errorf("code interpreter packages lack %s", p)
		}
	}
	if codeInterpreterMarker != "etc/aenv/code-interpreter" {
		t.Errorf("marker %q is not where envd looks", codeInterpreterMarker)
	}
	for name, want := range map[string]bool{"code-interpreter-v1": true, "code-interpreter": true, "base": false, "code-interpreter-v2": false} {
		if got := IsCodeInterpreter(name); got != want {
			t.Errorf("IsCodeInterpreter(%q) = %v", name, got)
		}
	}
}

// Get builds the code interpreter template on its first use, under either
// name, and records it once; other unknown names stay unknown. The build
// here finds its rootfs in the cache (as every build after a machine's
// first does), so no debootstrap runs.
func TestGetMakesCodeInterpreter(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	base, rootfs := cachedCodeInterpreter(t)
	m := NewManager(st, base, Dirs{}, slog.New(slog.NewTextHandler(io.Discard, nil)))

	if _, err := m.Get(ctx, "no-such-template"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(unknown) = %v, want not found", err)
	}
	first, err := m.Get(ctx, CodeInterpreterAlias)
	if err != nil {
		t.Fatal(err)
	}
	if first.Name != CodeInterpreterRootfsName || first.RootfsPath != rootfs || first.DefaultUser != DefaultUser {
		t.Errorf("template %+v", first)
	}
	for _, name := range []string{CodeInterpreterName, CodeInterpreterAlias, CodeInterpreterRootfsName, first.ID} {
		again, err := m.Get(ctx, name)
		if err != nil || again.ID != first.ID {
			t.Errorf("Get(%q) = %v, %v; want the template made first (%s)", name, again, err, first.ID)
		}
	}

	// Once the node has made the warm snapshot, both names are it; the
	// root filesystem stays reachable by its own name.
	warm := &store.Template{ID: "warm", Name: CodeInterpreterName, Kind: store.KindSandboxTemplate,
		RootfsPath: rootfs, ImageDir: t.TempDir()}
	if err := st.PutTemplate(ctx, warm); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{CodeInterpreterName: warm.ID, CodeInterpreterAlias: warm.ID,
		CodeInterpreterRootfsName: first.ID} {
		got, err := m.Get(ctx, name)
		if err != nil || got.ID != want {
			t.Errorf("Get(%q) = %v, %v; want %s", name, got, err, want)
		}
	}
	// A snapshot whose root filesystem is gone is not used: the root
	// filesystem is made again, and boots.
	os.Remove(filepath.Join(rootfs, codeInterpreterMarker))
	if got, err := m.Get(ctx, CodeInterpreterAlias); err != nil || got.ID != first.ID {
		t.Errorf("Get with the rootfs gone = %v, %v; want the rootfs template %s again", got, err, first.ID)
	}
}

// A root filesystem template recorded under CodeInterpreterName by an
// earlier release is renamed on first use, keeping its ID.
func TestCodeInterpreterRenamesEarlierRecord(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	base, rootfs := cachedCodeInterpreter(t)
	old := &store.Template{ID: "earlier", Name: CodeInterpreterName, Kind: store.KindRootfs, RootfsPath: rootfs}
	if err := st.PutTemplate(ctx, old); err != nil {
		t.Fatal(err)
	}
	m := NewManager(st, base, Dirs{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	got, err := m.Get(ctx, CodeInterpreterName)
	if err != nil || got.ID != old.ID || got.Name != CodeInterpreterRootfsName {
		t.Fatalf("Get = %+v, %v; want %s renamed %s", got, err, old.ID, CodeInterpreterRootfsName)
	}
	if _, err := st.GetTemplate(ctx, CodeInterpreterName); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the name %s is still taken: %v", CodeInterpreterName, err)
	}
}

func TestReserved(t *testing.T) {
	for name, want := range map[string]bool{
		"base": true, "code-interpreter": true, "code-interpreter-v1": true, "code-interpreter-v1-rootfs": true,
		"code-interpreter-v1-retired-abc": true, "code-interpreter-v2": false, "my-base": false, "basement": false,
	} {
		if got := Reserved(name); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", name, got, want)
		}
	}
}

// cachedCodeInterpreter is a template cache holding a code interpreter root
// filesystem (as every build after a machine's first finds it), and the
// base configuration over it.
func cachedCodeInterpreter(t *testing.T) (BaseConfig, string) {
	cache := t.TempDir()
	base := DefaultBaseConfig(cache)
	rootfs := filepath.Join(cache, "code-interpreter-"+codeInterpreterConfig(base).key(), "rootfs")
	for _, f := range []string{"bin/bash", codeInterpreterMarker} {
		os.MkdirAll(filepath.Dir(filepath.Join(rootfs, f)), 0o755)
		os.WriteFile(filepath.Join(rootfs, f), nil, 0o644)
	}
	return base, rootfs
}
