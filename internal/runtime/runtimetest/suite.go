// Package runtimetest is the conformance test every runtime.Driver passes.
// It needs root: it makes network namespaces and veths with the ip command
// and runs real sandboxes whose init is fakeenvd (a static stand-in for envd
// built by the test).
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// TestEnv describes the driver under test to the suite.
type TestEnv struct {
	// RootfsPath is the template rootfs to use. Empty: the suite makes a
	// minimal one. Either way the suite checks it is never modified.
	RootfsPath string
	// StateDir and CgroupParent are the driver's. After the suite's final
	// Cleanup no process may name StateDir, no mount may be below it and no
	// cgroup below CgroupParent.
	StateDir     string
	CgroupParent string
	// RootImage runs every sandbox with runtime.Spec.RootImage.
	RootImage bool
}

// harness is the state the subtests share.
type harness struct {
	driver   runtime.Driver
	env      TestEnv
	envdPath string

	mu      sync.Mutex
	timings map[string][]time.Duration
}

// Run runs the conformance suite against one driver. newDriver is called
// once; the suite calls Cleanup(nil) on the driver at the end.
func Run(t *testing.T, newDriver func(t *testing.T) runtime.Driver, env TestEnv) {
	RequireRoot(t)
	if env.RootfsPath == "" {
		env.RootfsPath = minimalRootfs(t)
	}
	h := &harness{env: env, envdPath: buildFakeEnvd(t), timings: map[string][]time.Duration{}}
	rootfsBefore := treeListing(t, env.RootfsPath)
	h.driver = newDriver(t)
	t.Cleanup(func() { h.reportTimings(t) })

	t.Run("Lifecycle", h.testLifecycle)
	t.Run("PauseResume", h.testPauseResume)
	t.Run("CheckpointRestore", h.testCheckpointRestore)
	t.Run("CheckpointRestoreLarge", h.testCheckpointRestoreLarge)
	t.Run("Fork", h.testFork)
	t.Run("FilesystemSnapshot", h.testFilesystemSnapshot)
	t.Run("InitExitIsStopped", h.testInitExit)
	t.Run("FailedStartLeavesNothing", h.testFailedStart)
	t.Run("KillIsIdempotent", h.testKillIdempotent)
	t.Run("Prepared", h.testPrepared)
	t.Run("Contract", func(t *testing.T) {
		Contract(t, h.driver, func(t *testing.T) runtime.Spec { return h.spec(t, NewNetns(t)) })
	})
	t.Run("Cleanup", h.testCleanup)

	if changes := treeChanges(rootfsBefore, treeListing(t, env.RootfsPath)); len(changes) > 0 {
		t.Errorf("template rootfs %s changed: %v", env.RootfsPath, changes)
	}
}

// spec returns a spec for a new sandbox in ns.
func (h *harness) spec(t testing.TB, ns *Netns) runtime.Spec {
	id := randomID(t)
	return runtime.Spec{
		ID: id, RootfsPath: h.env.RootfsPath, EnvdPath: h.envdPath, NetnsPath: ns.Path,
		VCPU: 1, MemoryMB: 256, PidsLimit: 256, Hostname: "sbx-" + id[:6],
		Env: []string{"PATH=/usr/bin:/bin"}, RootImage: h.env.RootImage,
	}
}

// timed runs op, records its duration under name and fails on error.
func (h *harness) timed(t testing.TB, name string, op func() error) {
	t.Helper()
	start := time.Now()
	err := op()
	d := time.Since(start)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	h.mu.Lock()
	h.timings[name] = append(h.timings[name], d)
	h.mu.Unlock()
}

// start starts a sandbox in a new namespace, waits for fakeenvd and kills
// the sandbox at the end of the test.
func (h *harness) start(t testing.TB) (runtime.Spec, *guest) {
	t.Helper()
	ns := NewNetns(t)
	spec := h.spec(t, ns)
	h.timed(t, "Start", func() error { return h.driver.Start(t.Context(), spec) })
	h.killAtEnd(t, spec.ID)
	g := newGuest(ns.GuestAddr)
	h.record("Start→envd answers", g.waitReady(t, 10*time.Second))
	return spec, g
}

// restore restores image into a new sandbox in a new namespace.
func (h *harness) restore(t testing.TB, image string) (runtime.Spec, *guest) {
	t.Helper()
	ns := NewNetns(t)
	spec := h.spec(t, ns)
	h.timed(t, "Restore", func() error { return h.driver.Restore(t.Context(), spec, image) })
	h.killAtEnd(t, spec.ID)
	g := newGuest(ns.GuestAddr)
	h.record("Restore→envd answers", g.waitReady(t, 10*time.Second))
	return spec, g
}

func (h *harness) record(name string, d time.Duration) {
	h.mu.Lock()
	h.timings[name] = append(h.timings[name], d)
	h.mu.Unlock()
}

func (h *harness) killAtEnd(t testing.TB, id string) {
	t.Cleanup(func() {
		// t.Context() is already canceled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.driver.Kill(ctx, id); err != nil {
			t.Errorf("kill %s at test end: %v", id, err)
		}
	})
}

func (h *harness) wantState(t testing.TB, id string, want runtime.State) {
	t.Helper()
	got, err := h.driver.State(t.Context(), id)
	if err != nil || got != want {
		t.Fatalf("State(%s) = %q, %v; want %q", id, got, err, want)
	}
}

func (h *harness) wantNotFound(t testing.TB, id string) {
	t.Helper()
	if got, err := h.driver.State(t.Context(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("State(%s) = %q, %v; want ErrNotFound", id, got, err)
	}
	list, err := h.driver.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if slices.ContainsFunc(list, func(i runtime.Instance) bool { return i.ID == id }) {
		t.Fatalf("List still has %s: %+v", id, list)
	}
}

func (h *harness) reportTimings(t *testing.T) {
	names := make([]string, 0, len(h.timings))
	for name := range h.timings {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		ds := h.timings[name]
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		fmt.Fprintf(&b, "\n  %-24s n=%d mean=%v all=%v", name, len(ds), (sum / time.Duration(len(ds))).Round(time.Millisecond), roundAll(ds))
	}
	t.Logf("%s timings:%s", h.driver.Name(), b.String())
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// waitState polls State until it is want.
func (h *harness) waitState(t testing.TB, id string, want runtime.State, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, err := h.driver.State(t.Context(), id)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("State(%s) = %q, %v after %v; want %q", id, got, err, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rootfsPath maps a path inside the sandbox to the template's copy.
func (h *harness) rootfsPath(p string) string {
	return filepath.Join(h.env.RootfsPath, p)
}
