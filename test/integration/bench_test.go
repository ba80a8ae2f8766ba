package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// The benchmarks print aenv's figures next to raw runsc and runc doing the
// same work on the same rootfs in the same run. Each reports p50 and p99
// in milliseconds beside Go's mean ns/op. Run with `make bench`.

func reportLatencies(b *testing.B, samples []time.Duration) {
	b.Helper()
	p50, p99 := percentiles(samples)
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p99, "p99-ms")
}

// percentiles returns p50 and p99 in milliseconds.
func percentiles(samples []time.Duration) (float64, float64) {
	if len(samples) == 0 {
		return 0, 0
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	pct := func(p float64) float64 {
		return float64(sorted[int(float64(len(sorted)-1)*p)].Microseconds()) / 1000
	}
	return pct(0.50), pct(0.99)
}

// BenchmarkAenvCreateFirstExec: POST /sandboxes (base, default shape)
// until the first /execute answers, served by the warm pool; the pool
// refills between iterations (outside the timer), as it does between
// creates that are not back to back.
func BenchmarkAenvCreateFirstExec(b *testing.B) {
	createBench(b, benchServer(b), time.Second)
}

// BenchmarkAenvColdCreateFirstExec: the same with the warm pool off: every
// create boots a sandbox (the seed's "cold boot").
func BenchmarkAenvColdCreateFirstExec(b *testing.B) {
	s := newServer(b, "--warm-sandboxes", "0")
	s.start()
	createBench(b, s, 0)
}

func createBench(b *testing.B, s *server, gap time.Duration) {
	var samples []time.Duration
	var ids []string
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(gap)
		b.StartTimer()
		start := time.Now()
		sb := s.create(nil)
		s.exec(sb.SandboxID, client.ExecuteRequest{Command: "true"})
		samples = append(samples, time.Since(start))
		ids = append(ids, sb.SandboxID)
	}
	b.StopTimer()
	reportLatencies(b, samples)
	for _, id := range ids {
		s.api.DeleteSandbox(b.Context(), id)
	}
}

// BenchmarkAenvExecRoundTrip: /execute of `true` in a running sandbox.
func BenchmarkAenvExecRoundTrip(b *testing.B) {
	execRoundTrips(b, benchServer(b))
}

func execRoundTrips(b *testing.B, s *server) {
	sb := s.create(nil)
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		s.exec(sb.SandboxID, client.ExecuteRequest{Command: "true"})
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportLatencies(b, samples)
	s.api.DeleteSandbox(b.Context(), sb.SandboxID)
}

// BenchmarkAenvDelete: DELETE /sandboxes/{id} of a running sandbox.
func BenchmarkAenvDelete(b *testing.B) {
	s := benchServer(b)
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sb := s.create(map[string]any{"templateID": "base", "memoryMB": 256})
		b.StartTimer()
		start := time.Now()
		if err := s.api.DeleteSandbox(b.Context(), sb.SandboxID); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportLatencies(b, samples)
}

// BenchmarkRawRunscRunExec: `runsc run --detach` then `runsc exec true`,
// the CLI path a plain runsc user takes, on the base rootfs.
func BenchmarkRawRunscRunExec(b *testing.B) {
	rawBench(b, filepath.Join(binDir, "runsc"), []string{"--platform=systrap", "--network=none", "--overlay2=root:memory"})
}

// BenchmarkRawRuncRunExec: the same with runc (no sandbox kernel; the
// rootfs mounted read-only).
func BenchmarkRawRuncRunExec(b *testing.B) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		b.Fatal("runc not installed (make deps)")
	}
	rawBench(b, runc, nil)
}

// rawRuntime drives runsc or runc directly on the base rootfs: a bundle
// in a temp dir, a state root of its own, and the command line.
type rawRuntime struct {
	b      *testing.B
	bin    string
	flags  []string
	bundle string
	out    *os.File
}

func newRawRuntime(b *testing.B, bin string, flags []string) *rawRuntime {
	return newRawRuntimeOn(b, bin, flags, baseRootfs(b))
}

// newRawRuntimeOn is newRawRuntime on another root filesystem.
func newRawRuntimeOn(b *testing.B, bin string, flags []string, rootfs string) *rawRuntime {
	dir := b.TempDir()
	root := filepath.Join(dir, "state")
	writeBundle(b, dir, rootfs, bin)
	// Output goes to a file, not a pipe: a detached container inherits it
	// and would keep a pipe open forever.
	out, err := os.Create(filepath.Join(dir, "output"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		out.Close()
		exec.Command("umount", filepath.Join(root, "null-netns")).Run() // runsc's pin
	})
	return &rawRuntime{b: b, bin: bin, flags: append([]string{"--root", root}, flags...), bundle: dir, out: out}
}

// run runs one subcommand and fails the benchmark if it fails.
func (r *rawRuntime) run(args ...string) {
	r.b.Helper()
	cmd := exec.Command(r.bin, append(append([]string{}, r.flags...), args...)...)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(r.out.Name())
		r.b.Fatalf("%s %v: %v: %s", filepath.Base(r.bin), args, err, out)
	}
}

func rawBench(b *testing.B, bin string, flags []string) {
	rt := newRawRuntime(b, bin, flags)
	run, dir := rt.run, rt.bundle
	b.ResetTimer()
	var runExec, execOnly, del []time.Duration
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench%d", i)
		start := time.Now()
		run("run", "--detach", "--bundle", dir, id)
		t1 := time.Now()
		run("exec", id, "/bin/true")
		t2 := time.Now()
		run("delete", "--force", id)
		runExec = append(runExec, t2.Sub(start))
		execOnly = append(execOnly, t2.Sub(t1))
		del = append(del, time.Since(t2))
	}
	b.StopTimer()
	reportLatencies(b, runExec)
	reportNamed(b, "exec", execOnly)
	reportNamed(b, "delete", del)
}

func writeBundle(b *testing.B, dir, rootfs, bin string) {
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0}, "args": []string{"/bin/sleep", "infinity"},
			"env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/",
		},
		"root":     map[string]any{"path": rootfs, "readonly": filepath.Base(bin) == "runc"},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}},
			"resources":  map[string]any{"memory": map[string]int{"limit": 256 << 20}},
		},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// baseRootfs finds the base template's rootfs in the shared cache.
func baseRootfs(b testing.TB) string {
	matches, _ := filepath.Glob(filepath.Join(templateCache, "base-*", "rootfs"))
	if len(matches) == 0 {
		// Building it takes a server start.
		benchServer(b)
		matches, _ = filepath.Glob(filepath.Join(templateCache, "base-*", "rootfs"))
	}
	if len(matches) == 0 {
		b.Fatal("no base rootfs in " + templateCache)
	}
	return matches[0]
}

func benchServer(b testing.TB) *server {
	s := newServer(b)
	s.start()
	return s
}
