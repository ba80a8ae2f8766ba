package gvisor

import (
	"os"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// TestBackgroundCPUWeight: a sandbox prepared with Spec.Background has the
// least CPU weight its cgroup can have, and Foreground gives it the
// default; it then starts and answers like any other.
func TestBackgroundCPUWeight(t *testing.T) {
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	d := newTestDriver(t, env)
	fx := runtimetest.NewFixture(t, d, env)

	weight := func(id string) string {
		t.Helper()
		file, _, err := d.cgroups.cpuWeightFile(d.cgroupPath(id))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	wantBackground, wantDefault := "1", "100"
	if d.cgroups.usesV1() {
		wantBackground, wantDefault = "2", "1024"
	}

	sb := fx.NewSpec(t)
	sb.Spec.Background = true
	if err := d.Prepare(t.Context(), sb.Spec); err != nil {
		t.Fatal(err)
	}
	if got := weight(sb.Spec.ID); got != wantBackground {
		t.Errorf("prepared in the background: CPU weight %s, want %s", got, wantBackground)
	}
	if err := d.Foreground(t.Context(), sb.Spec.ID); err != nil {
		t.Fatal(err)
	}
	if got := weight(sb.Spec.ID); got != wantDefault {
		t.Errorf("after Foreground: CPU weight %s, want %s", got, wantDefault)
	}
	if err := d.StartPrepared(t.Context(), sb.Spec.ID); err != nil {
		t.Fatal(err)
	}
	sb.WaitReady(t)

	// A sandbox made the ordinary way has the default from the start.
	plain := fx.Start(t)
	if got := weight(plain.Spec.ID); got != wantDefault {
		t.Errorf("started sandbox: CPU weight %s, want %s", got, wantDefault)
	}
	if err := d.Foreground(t.Context(), "unknown0000000000000"); err == nil {
		t.Error("Foreground of an unknown sandbox succeeded")
	}
}
