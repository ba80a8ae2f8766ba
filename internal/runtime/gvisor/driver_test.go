package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// runscForTest finds runsc: $AENV_RUNSC, else the repository's bin/runsc.
func runscForTest(t *testing.T) string {
	t.Helper()
	path := os.Getenv("AENV_RUNSC")
	if path == "" {
		var err error
		if path, err = filepath.Abs("../../../bin/runsc"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); err != nil {
		runtimetest.SkipOrFail(t, "no runsc (set AENV_RUNSC or build bin/runsc): "+err.Error())
	}
	return path
}

// newTestEnv returns a fresh state dir and cgroup parent for a driver.
func newTestEnv(t *testing.T) runtimetest.TestEnv {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return runtimetest.TestEnv{
		RootfsPath:   os.Getenv("AENV_TEST_ROOTFS"),
		StateDir:     t.TempDir(),
		CgroupParent: "/aenv-test-" + hex.EncodeToString(b),
	}
}

// newTestDriver makes a systrap driver for env and removes whatever a
// failed test left when the test ends.
func newTestDriver(t *testing.T, env runtimetest.TestEnv) *Driver {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := New(t.Context(), Config{
		RunscPath: runscForTest(t), StateDir: env.StateDir, CgroupParent: env.CgroupParent,
		Platform: PlatformSystrap, Debug: os.Getenv("AENV_RUNSC_DEBUG") == "1",
		RootImageDir: t.TempDir(),
	}, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Cleanup(ctx, nil); err != nil {
			t.Errorf("final Cleanup: %v", err)
		}
	})
	return d
}

func TestConformance(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	runscForTest(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return newTestDriver(t, env) }, env)
}

// TestConformanceRootImage runs the suite with every sandbox over a root
// image (runtime.Spec.RootImage).
func TestConformanceRootImage(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	env.RootImage = true
	runscForTest(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Driver { return newTestDriver(t, env) }, env)
}

// TestAutoPlatform: "auto" settles on a platform within the probe's bound
// and leaves nothing of the probe behind. (On hosts where kvm hangs in
// gVisor it must fall back to systrap.)
func TestAutoPlatform(t *testing.T) {
	runtimetest.RequireRoot(t)
	runsc := runscForTest(t)
	stateDir := t.TempDir()
	start := time.Now()
	d, err := New(t.Context(), Config{RunscPath: runsc, StateDir: stateDir, Platform: PlatformAuto}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	took := time.Since(start)
	t.Logf("auto chose %s in %v", d.Platform(), took)
	if took > kvmProbeTimeout+3*time.Second {
		t.Errorf("auto platform probe took %v; bound is %v", took, kvmProbeTimeout)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil && d.Platform() != PlatformSystrap {
		t.Errorf("no /dev/kvm but platform %s", d.Platform())
	}
	// Leftovers of a killed probe would show up as processes naming the
	// state dir or as the probe directory itself.
	time.Sleep(200 * time.Millisecond)
	if pids, _ := processesUsing(stateDir); len(pids) > 0 {
		t.Errorf("processes left by the kvm probe: %v", pids)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "kvm-probe")); !os.IsNotExist(err) {
		t.Errorf("kvm probe dir left behind: %v", err)
	}
}
