package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// envdDriver is the fake driver, saying which envd builds its sandboxes
// run.
type envdDriver struct {
	*fakeDriver
	inUse map[string]bool
	err   error
}

func (d *envdDriver) EnvdInUse(context.Context) (map[string]bool, error) { return d.inUse, d.err }

// pinBuild writes an envd build named by its digest into dir, last used
// age ago, and returns its path.
func pinBuild(t *testing.T, dir, content string, age time.Duration) string {
	t.Helper()
	sum := sha256.Sum256([]byte(content))
	p := filepath.Join(dir, hex.EncodeToString(sum[:]))
	if err := os.WriteFile(p, []byte(content), 0o555); err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-age)
	if err := os.Chtimes(p, then, then); err != nil {
		t.Fatal(err)
	}
	return p
}

// The pinned envd builds (one more at each upgrade) go once unused for a
// day, unless a sandbox runs one (named at any path) or it is the
// server's own; half-made copies go after ten minutes. A build removed is pinned again by a
// restore of an image taken with it, and marked used. A driver that
// cannot say which builds run, or fails to, keeps them all.
func TestCollectEnvdBuilds(t *testing.T) {
	dir := t.TempDir()
	old := envdBuildIdle + time.Hour
	own := pinBuild(t, dir, "own", old)
	running := pinBuild(t, dir, "running", old)
	idle := pinBuild(t, dir, "idle", old)
	recent := pinBuild(t, dir, "recent", envdBuildIdle-time.Hour)
	halfMade := filepath.Join(dir, filepath.Base(idle)+".1234.copying")
	beingMade := filepath.Join(dir, filepath.Base(recent)+".5678.copying")
	for _, p := range []string{halfMade, beingMade} {
		if err := os.WriteFile(p, []byte("half"), 0o555); err != nil {
			t.Fatal(err)
		}
	}
	then := time.Now().Add(-2 * copyingAge)
	if err := os.Chtimes(halfMade, then, then); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The sandbox's bundle was made by a run with another data directory.
	driver := &envdDriver{fakeDriver: &fakeDriver{faults: newFaults(), inst: map[string]*instance{}},
		inUse: map[string]bool{filepath.Join("/old-data-dir/envd", filepath.Base(running)): true}}
	m := &Manager{cfg: Config{EnvdDir: dir, EnvdPath: own}, driver: driver, logger: logger}

	exists := func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	}
	// The driver fails, or cannot tell: no build goes.
	driver.err = errors.New("bundle unreadable")
	if n, err := m.collectEnvdBuilds(t.Context()); err == nil || exists(halfMade) || !exists(idle) {
		t.Errorf("driver failing: removed %d, %v; want the half-made copy alone, and the error", n, err)
	}
	driver.err = nil
	blind := &Manager{cfg: m.cfg, driver: driver.fakeDriver, logger: logger}
	if n, err := blind.collectEnvdBuilds(t.Context()); err != nil || n != 0 {
		t.Errorf("a driver that cannot tell: removed %d, %v", n, err)
	}

	if n, err := m.collectEnvdBuilds(t.Context()); err != nil || n != 1 {
		t.Errorf("collect: removed %d, %v; want the idle build", n, err)
	}
	if exists(idle) {
		t.Error("idle build kept")
	}
	for _, p := range []string{own, running, recent, beingMade} {
		if !exists(p) {
			t.Errorf("%s removed", filepath.Base(p))
		}
	}

	// A restore of an image taken with the idle build pins it again.
	image := t.TempDir()
	if err := os.WriteFile(filepath.Join(image, runtime.EnvdImagePrefix+filepath.Base(idle)), []byte("idle"), 0o555); err != nil {
		t.Fatal(err)
	}
	if got := m.envdOf(image); got != idle {
		t.Fatalf("envdOf: %q, want %q", got, idle)
	}
	// And marks a build it finds used, so that it stays.
	then = time.Now().Add(-old)
	if err := os.Chtimes(idle, then, then); err != nil {
		t.Fatal(err)
	}
	m.envdOf(image)
	if n, err := m.collectEnvdBuilds(t.Context()); err != nil || n != 0 || !exists(idle) {
		t.Errorf("collect after a restore used the build: removed %d, %v", n, err)
	}
}
