package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// TestPrecompiledSeccomp: the runsc that make build puts in bin/ carries
// precompiled seccomp programs for the configuration aenv runs (see
// tools/runsc-seccomp), so neither the sandbox nor its gofer compiles
// its filters when it starts. A runsc built without them still works,
// ~14 ms of CPU slower per start and restore; this test is what notices.
func TestPrecompiledSeccomp(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	d.cfg.Debug = true
	sb := runtimetest.NewFixture(t, d, env).Start(t)

	logs, err := filepath.Glob(filepath.Join(d.sandboxDir(sb.Spec.ID), "debug", "*"))
	if err != nil {
		t.Fatal(err)
	}
	installed := map[string]bool{} // by the log's command: boot, gofer
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		if i := strings.Index(text, "No precompiled program found"); i >= 0 {
			line, _, _ := strings.Cut(text[i:], "\n")
			t.Errorf("%s: %s", filepath.Base(path), line)
		}
		if strings.Contains(text, "Loaded precompiled seccomp instructions") {
			for _, cmd := range []string{"boot", "gofer"} {
				if strings.Contains(filepath.Base(path), "."+cmd+".") {
					installed[cmd] = true
				}
			}
		}
	}
	for _, cmd := range []string{"boot", "gofer"} {
		if !installed[cmd] {
			t.Errorf("no %s debug log among %d says it loaded precompiled seccomp programs", cmd, len(logs))
		}
	}
}
