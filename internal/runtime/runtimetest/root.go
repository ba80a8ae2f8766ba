package runtimetest

import (
	"os/exec"
	"testing"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// RequireRoot skips the test unless it runs as root with the ip command
// (or fails it where root tests are required, see roottest).
func RequireRoot(t testing.TB) {
	t.Helper()
	roottest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		roottest.SkipOrFail(t, "test needs the ip command")
	}
}

// SkipOrFail is roottest.SkipOrFail, for drivers' tests that lack a
// prerequisite (a runtime binary, a device).
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	roottest.SkipOrFail(t, why)
}
