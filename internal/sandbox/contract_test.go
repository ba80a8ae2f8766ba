package sandbox

import (
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// TestFakeDriverContract runs the drivers' contract (the part of the
// conformance suite gVisor's driver passes that needs no sandbox inside)
// against the fake the lifecycle tests use, so that the fake answers as
// the real driver does.
func TestFakeDriverContract(t *testing.T) {
	d := &fakeDriver{faults: newFaults(), inst: map[string]*instance{}}
	runtimetest.Contract(t, d, func(t *testing.T) runtime.Spec {
		return runtime.Spec{ID: NewID(), RootfsPath: t.TempDir(), VCPU: 1, MemoryMB: 256}
	})
}
