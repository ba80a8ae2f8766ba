// Package roottest tiers the tests that need root (network namespaces,
// cgroups, gVisor sandboxes): without root they skip, unless
// AENV_REQUIRE_ROOT_TESTS=1 (set by `make test` and CI), where a missing
// requirement fails the test, so that a skip is never reported as a pass.
package roottest

import (
	"os"
	"testing"
)

// Require skips or fails t unless it runs as root.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "test needs root")
	}
}

// SkipOrFail skips t for why, or fails it when root tests are required.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
		t.Fatalf("%s (AENV_REQUIRE_ROOT_TESTS=1: required tests may not skip)", why)
	}
	t.Skip(why)
}
