package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// Benchmarks of the seed's set: pause, resume, snapshot create, snapshot
// boot, fork of 16, pause to disk and resume from disk at several memory
// sizes, next to raw runsc checkpoint/restore.

func BenchmarkAenvPauseResume(b *testing.B) {
	s := benchServer(b)
	id := s.create(nil).SandboxID
	var pauses, resumes []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		must(b, s.api.Pause(b.Context(), id, client.PauseRequest{}))
		mid := time.Now()
		must(b, s.api.Resume(b.Context(), id, 0))
		pauses = append(pauses, mid.Sub(start))
		resumes = append(resumes, time.Since(mid))
	}
	b.StopTimer()
	reportLatencies(b, pauses)
	reportNamed(b, "resume", resumes)
}

// must fails the benchmark on an error.
func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func reportNamed(b *testing.B, name string, samples []time.Duration) {
	b.Helper()
	p50, p99 := percentiles(samples)
	b.ReportMetric(p50, name+"-p50-ms")
	b.ReportMetric(p99, name+"-p99-ms")
}

func BenchmarkAenvSnapshotCreate(b *testing.B) {
	s := benchServer(b)
	id := s.create(nil).SandboxID
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		snap, err := s.api.CreateSnapshot(b.Context(), id, "")
		must(b, err)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		s.api.DeleteTemplate(b.Context(), snap.SnapshotID)
		b.StartTimer()
	}
	b.StopTimer()
	reportLatencies(b, samples)
}

// BenchmarkAenvSnapshotBoot: create from a snapshot template (a restore)
// until the first /execute answers.
func BenchmarkAenvSnapshotBoot(b *testing.B) {
	s := benchServer(b)
	src := s.create(nil).SandboxID
	_, err := s.api.CreateSnapshot(b.Context(), src, "bench")
	must(b, err)
	var samples []time.Duration
	var ids []string
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		sb := s.create(map[string]any{"templateID": "bench"})
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

// BenchmarkAenvFork16: fork 16 children and wait until every one answers
// a command; per-child is the wall time over 16.
func BenchmarkAenvFork16(b *testing.B) {
	s := benchServer(b)
	parent := s.create(map[string]any{"templateID": "base", "memoryMB": 512}).SandboxID
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		children := s.fork("/sandboxes/"+parent+"/fork", 16)
		for _, c := range children {
			s.exec(c, client.ExecuteRequest{Command: "true"})
		}
		samples = append(samples, time.Since(start))
		b.StopTimer()
		for _, c := range children {
			s.api.DeleteSandbox(b.Context(), c)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportLatencies(b, samples)
	p50, _ := percentiles(samples)
	b.ReportMetric(p50/16, "per-child-ms")
}

// BenchmarkAenvPauseToDisk: pause straight to disk ({"toDisk": true}: the
// memory is released and kept in the image) and resume from disk, with 0,
// 100 and 500 MB of dirty memory.
func BenchmarkAenvPauseToDisk(b *testing.B) {
	for _, mb := range []int{0, 100, 500} {
		b.Run(fmt.Sprintf("%dMB", mb), func(b *testing.B) {
			s := benchServer(b)
			id := s.create(map[string]any{"templateID": "base", "memoryMB": 1024}).SandboxID
			if mb > 0 {
				s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf(
					"nohup python3 -c 'import os,time; d=bytearray(os.urandom(1<<20))*%d; time.sleep(1e9)' >/dev/null 2>&1 & sleep 3", mb)})
			}
			var pauses, resumes []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				must(b, s.api.Pause(b.Context(), id, client.PauseRequest{ToDisk: true}))
				mid := time.Now()
				must(b, s.api.Resume(b.Context(), id, 0))
				pauses = append(pauses, mid.Sub(start))
				resumes = append(resumes, time.Since(mid))
			}
			b.StopTimer()
			reportLatencies(b, pauses)
			reportNamed(b, "resume", resumes)
		})
	}
}

// BenchmarkRawRunscCheckpointRestore: runsc checkpoint of a running
// sandbox and restore into a new container, through the runsc CLI.
func BenchmarkRawRunscCheckpointRestore(b *testing.B) {
	rt := newRawRuntime(b, filepath.Join(binDir, "runsc"), []string{"--platform=systrap", "--network=none", "--overlay2=root:memory"})
	run, dir := rt.run, rt.bundle
	run("run", "--detach", "--bundle", dir, "src")
	defer run("delete", "--force", "src")
	var ckpts, restores []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		img := filepath.Join(dir, fmt.Sprintf("img%d", i))
		id := fmt.Sprintf("copy%d", i)
		start := time.Now()
		run("checkpoint", "--leave-running", "--image-path", img, "src")
		mid := time.Now()
		run("create", "--bundle", dir, id)
		run("restore", "--detach", "--bundle", dir, "--image-path", img, id)
		restores = append(restores, time.Since(mid))
		ckpts = append(ckpts, mid.Sub(start))
		b.StopTimer()
		run("delete", "--force", id)
		os.RemoveAll(img)
		b.StartTimer()
	}
	b.StopTimer()
	reportLatencies(b, ckpts)
	reportNamed(b, "restore", restores)
}
