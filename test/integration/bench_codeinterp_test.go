package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// BenchmarkCodeInterpreter: from a create of the code interpreter template
// until its first runCode ('1 + 1') answers, as an E2B user or an RL
// reward function sees it, next to the same with the template's root
// filesystem booted (what the node does without the warm snapshot: the
// first run starts IPython and waits for it) and to raw runsc doing the
// nearest it can (`runsc run --detach`, then `runsc exec` of a python3
// that imports what the snapshot's kernel has imported) on the same
// root filesystem, in the same run. `make bench-code-interpreter`.
func BenchmarkCodeInterpreter(b *testing.B) {
	s := benchServer(b)
	first := createCodeInterpreter(b, s) // makes the root filesystem and the snapshot
	s.api.DeleteSandbox(b.Context(), first.SandboxID)

	createRun := func(b *testing.B, template, code string) {
		var total, run []time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			time.Sleep(time.Second) // the prepared pool refills, as between creates not back to back
			b.StartTimer()
			start := time.Now()
			var sb client.Sandbox
			s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": template}), 201, "create").json(b, &sb)
			created := time.Now()
			ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
			ex, err := s.api.CodeInterpreter(sb.SandboxID, sb.EnvdAccessToken).RunCode(ctx,
				client.RunCodeRequest{Code: code}, nil)
			cancel()
			if err != nil || ex.Text() != "2" {
				b.Fatalf("first run in %s: %+v, %v", template, ex, err)
			}
			total = append(total, time.Since(start))
			run = append(run, time.Since(created))
			b.StopTimer()
			s.api.DeleteSandbox(b.Context(), sb.SandboxID)
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, total)
		reportNamed(b, "first-run", run)
	}
	b.Run("aenv-warm-snapshot", func(b *testing.B) { createRun(b, "code-interpreter", "1 + 1") })
	// A base create to its first command, the figure a code interpreter
	// create is held against (≤ 1.2x).
	b.Run("aenv-base-create-first-exec", func(b *testing.B) { createBench(b, s, time.Second) })
	// runCode('1 + 1') round trips in one sandbox, beside exec round trips
	// of `true` in a base one (≤ 1.5x).
	b.Run("aenv-runcode-round-trip", func(b *testing.B) {
		sb := createCodeInterpreter(b, s)
		defer s.api.DeleteSandbox(b.Context(), sb.SandboxID)
		ci := s.api.CodeInterpreter(sb.SandboxID, sb.EnvdAccessToken)
		var samples []time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			ex, err := ci.RunCode(b.Context(), client.RunCodeRequest{Code: "1 + 1"}, nil)
			if err != nil || ex.Text() != "2" {
				b.Fatalf("runCode: %+v, %v", ex, err)
			}
			samples = append(samples, time.Since(start))
		}
		b.StopTimer()
		reportLatencies(b, samples)
	})
	b.Run("aenv-exec-round-trip", func(b *testing.B) { execRoundTrips(b, s) })
	b.Run("aenv-boot-rootfs", func(b *testing.B) { createRun(b, "code-interpreter-v1-rootfs", "1 + 1") })
	b.Run("raw-runsc", func(b *testing.B) {
		rootfs, _ := filepath.Glob(filepath.Join(templateCache, "code-interpreter-*", "rootfs"))
		if len(rootfs) == 0 {
			b.Fatal("no code interpreter rootfs in " + templateCache)
		}
		rt := newRawRuntimeOn(b, filepath.Join(binDir, "runsc"),
			[]string{"--platform=systrap", "--network=none", "--overlay2=root:memory"}, rootfs[0])
		var samples []time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("ci%d", i)
			start := time.Now()
			rt.run("run", "--detach", "--bundle", rt.bundle, id)
			rt.run("exec", id, "/usr/bin/python3", "-c",
				"import IPython, numpy, pandas, matplotlib; matplotlib.use('agg'); import matplotlib.pyplot, requests; print(1 + 1)")
			samples = append(samples, time.Since(start))
			b.StopTimer()
			rt.run("delete", "--force", id)
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, samples)
	})
}
