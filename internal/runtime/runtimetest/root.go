package runtimetest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireRoot skips the test unless it runs as root. With
// AENV_REQUIRE_ROOT_TESTS=1 (as in CI) it fails instead: there a skip would
// hide a test that never ran.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "test needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "test needs the ip command")
	}
}

// skipOrFail skips, or fails when AENV_REQUIRE_ROOT_TESTS=1.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("AENV_REQUIRE_ROOT_TESTS") == "1" {
		t.Fatalf("%s (AENV_REQUIRE_ROOT_TESTS=1 forbids skipping)", why)
	}
	t.Skip(why)
}

// SkipOrFail is skipOrFail for drivers' tests that lack a prerequisite
// (a runtime binary, a device).
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	skipOrFail(t, why)
}
