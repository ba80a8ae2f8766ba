package runtimetest

import (
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
)

// Fixture starts real sandboxes on a driver for the driver's own tests:
// the cases that need to know how the driver works (its processes, its
// files), such as faults injected into its runtime.
type Fixture struct {
	h *harness
}

// NewFixture prepares fakeenvd and, when env.RootfsPath is empty, a
// minimal rootfs for sandboxes of driver d.
func NewFixture(t testing.TB, d runtime.Driver, env TestEnv) *Fixture {
	t.Helper()
	RequireRoot(t)
	if env.RootfsPath == "" {
		env.RootfsPath = minimalRootfs(t)
	}
	return &Fixture{h: &harness{driver: d, env: env, envdPath: buildFakeEnvd(t), timings: map[string][]time.Duration{}}}
}

// Sandbox is a sandbox a Fixture started.
type Sandbox struct {
	Spec runtime.Spec
	g    *guest
}

// Start starts a sandbox in a new network namespace, waits until its
// fakeenvd answers, and kills it when the test ends.
func (f *Fixture) Start(t testing.TB) *Sandbox {
	t.Helper()
	spec, g := f.h.start(t)
	return &Sandbox{Spec: spec, g: g}
}

// NewSpec returns the spec of a sandbox in a new network namespace, for
// the test to make as it likes; the sandbox is killed when the test ends,
// and the returned Sandbox reaches its fakeenvd once it runs.
func (f *Fixture) NewSpec(t testing.TB) *Sandbox {
	t.Helper()
	ns := NewNetns(t)
	spec := f.h.spec(t, ns)
	f.h.killAtEnd(t, spec.ID)
	return &Sandbox{Spec: spec, g: newGuest(ns.GuestAddr)}
}

// WaitReady waits until the sandbox's fakeenvd answers.
func (s *Sandbox) WaitReady(t testing.TB) {
	t.Helper()
	s.g.waitReady(t, 10*time.Second)
}

// Answers says whether the sandbox's fakeenvd replies within a short time.
func (s *Sandbox) Answers(t testing.TB) bool {
	t.Helper()
	return s.g.answers(t)
}

// Leftovers lists what remains on the host of the driver: processes naming
// its state dir, mounts below it, cgroups below its cgroup parent.
func (f *Fixture) Leftovers(t testing.TB) []string {
	t.Helper()
	return leftovers(t, f.h.env)
}

// Alloc makes the sandbox's fakeenvd fill mb MiB of memory and returns
// its checksum.
func (s *Sandbox) Alloc(t testing.TB, mb int) string {
	t.Helper()
	return s.g.alloc(t, mb)
}

// AllocSum returns the checksum of the memory Alloc filled, recomputed in
// the sandbox now.
func (s *Sandbox) AllocSum(t testing.TB) string {
	t.Helper()
	return s.g.allocSum(t)
}
