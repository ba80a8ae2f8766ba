package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// BenchmarkClusterIncrementalSnapshot measures snapshots stored as the
// pages that changed, in a cluster of two nodes with a real S3 server:
//
//   - big: a sandbox holding 1 GiB of random memory is snapshotted, 10 MiB
//     of that memory is rewritten, and it is snapshotted again. For each:
//     the snapshot call, the time until its record says uploaded, and the
//     bytes its upload stored; then the second's total over the first's.
//   - trajectory: an agent's ten steps in a git repository (files edited
//     and committed between snapshots) snapshotted after each step: the
//     bytes the ten stored together over what the first stored alone.
//   - cold / warm: create from the second big snapshot on the other node,
//     which has none of its pages, then again with them in its cache.
//
// `make bench-shared` runs it beside the rest of the object store's
// benchmarks.
func BenchmarkClusterIncrementalSnapshot(b *testing.B) {
	srv := s3test.Start(b)
	c := newCluster(b)
	na := c.sharedNode("node-a", srv)
	nb := c.sharedNode("node-b", srv)
	g := c.addGateway()
	g.waitReady(b, "node-a", "node-b")
	ctx := context.Background()

	// The holder rewrites 10 MiB of its buffer at each /tmp/go-N.
	big := na.create(map[string]any{"templateID": "base", "memoryMB": 2048, "timeout": 3600}).SandboxID
	na.exec(big, client.ExecuteRequest{Command: `nohup python3 -c '
import os, time
buf = bytearray(1 << 30)
for i in range(0, len(buf), 1 << 24):
    buf[i:i + (1 << 24)] = os.urandom(1 << 24)
open("/tmp/ready", "w").write("ok")
n = 0
while True:
    if os.path.exists("/tmp/go-%d" % n):
        off = (n * 10 << 20) % (len(buf) - (10 << 20))
        buf[off:off + (10 << 20)] = os.urandom(10 << 20)
        open("/tmp/done-%d" % n, "w").write("ok")
        n += 1
    time.sleep(0.01)
' >/dev/null 2>&1 &`})
	waitFor(b, 5*time.Minute, "1 GiB in memory", func() bool {
		res, err := na.api.Execute(ctx, big, client.ExecuteRequest{Command: "cat /tmp/ready"})
		return err == nil && res.Stdout == "ok"
	})
	snapshot := func(id string) (call, upload time.Duration, snap client.Snapshot) {
		b.Helper()
		t0 := time.Now()
		s, err := g.api.CreateSnapshot(ctx, id, "")
		if err != nil {
			b.Fatal(err)
		}
		call = time.Since(t0)
		waitUploaded(b, g, s.SnapshotID)
		upload = time.Since(t0) - call
		if snap, err = g.api.GetSnapshot(ctx, s.SnapshotID); err != nil {
			b.Fatal(err)
		}
		return call, upload, snap
	}
	var (
		firstCall, firstUpload, secondCall, secondUpload, cold, warm []time.Duration
		firstMiB, secondMiB, trajectoryRatio                         float64
	)
	step := 0
	b.ResetTimer()
	for range b.N {
		call, upload, first := snapshot(big)
		firstCall, firstUpload = append(firstCall, call), append(firstUpload, upload)
		firstMiB = float64(first.StoredBytes) / (1 << 20)
		na.exec(big, client.ExecuteRequest{Command: fmt.Sprintf("touch /tmp/go-%d", step)})
		waitFor(b, time.Minute, "10 MiB rewritten", func() bool {
			res, err := na.api.Execute(ctx, big, client.ExecuteRequest{Command: fmt.Sprintf("cat /tmp/done-%d", step)})
			return err == nil && res.Stdout == "ok"
		})
		step++
		call, upload, second := snapshot(big)
		secondCall, secondUpload = append(secondCall, call), append(secondUpload, upload)
		secondMiB = float64(second.StoredBytes) / (1 << 20)
		if second.ParentID != first.SnapshotID {
			b.Fatalf("second snapshot shares with %q, want the first %s", second.ParentID, first.SnapshotID)
		}
		for i := range 2 {
			t0 := time.Now()
			id := nb.create(map[string]any{"templateID": second.SnapshotID}).SandboxID
			nb.exec(id, client.ExecuteRequest{Command: "true"})
			if i == 0 {
				cold = append(cold, time.Since(t0))
			} else {
				warm = append(warm, time.Since(t0))
			}
			nb.api.DeleteSandbox(ctx, id)
		}
		g.api.DeleteTemplate(ctx, first.SnapshotID)
		g.api.DeleteTemplate(ctx, second.SnapshotID)

		trajectoryRatio = trajectory(b, na, g)
	}
	b.StopTimer()
	reportNamed(b, "snapshot-1GiB", firstCall)
	reportNamed(b, "upload-1GiB", firstUpload)
	reportNamed(b, "snapshot-10MiB-changed", secondCall)
	reportNamed(b, "upload-10MiB-changed", secondUpload)
	reportNamed(b, "create-cold-1GiB", cold)
	reportNamed(b, "create-warm-1GiB", warm)
	b.ReportMetric(firstMiB, "first-stored-MiB")
	b.ReportMetric(secondMiB, "second-stored-MiB")
	p1, _ := percentiles(firstUpload)
	p2, _ := percentiles(secondUpload)
	c1, _ := percentiles(firstCall)
	c2, _ := percentiles(secondCall)
	b.ReportMetric((c2+p2)/(c1+p1), "second/first")
	pc, _ := percentiles(cold)
	pw, _ := percentiles(warm)
	b.ReportMetric(pc/pw, "cold/warm")
	b.ReportMetric(trajectoryRatio, "trajectory-10-stored/first")
}

// trajectory runs ten steps of an agent editing a git repository in a new
// sandbox, snapshotting after each, and returns the bytes the ten stored
// over what the first stored.
func trajectory(b *testing.B, s *server, g *gateway) float64 {
	b.Helper()
	ctx := context.Background()
	id := s.create(map[string]any{"templateID": "base", "timeout": 3600}).SandboxID
	s.exec(id, client.ExecuteRequest{Command: `set -e; mkdir -p /work/repo; cd /work/repo; git init -q .
git config user.email agent@example.com; git config user.name agent
for i in $(seq 1 200); do head -c 2000 /dev/urandom | base64 > src_$i.py; done
git add -A; git commit -qm start`})
	var total, first int64
	var snaps []string
	for i := range 10 {
		if i > 0 {
			s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf(`set -e; cd /work/repo
for j in 1 2 3 4 5; do head -c 500 /dev/urandom | base64 >> src_$(( (%d * 37 + j * 13) %% 200 + 1 )).py; done
echo "step %d" >> NOTES.md; git add -A; git commit -qm "step %d"; python3 -c 'print(sum(range(10**6)))'`, i, i, i)})
		}
		snap, err := g.api.CreateSnapshot(ctx, id, "")
		if err != nil {
			b.Fatal(err)
		}
		waitUploaded(b, g, snap.SnapshotID)
		got, err := g.api.GetSnapshot(ctx, snap.SnapshotID)
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			first = got.StoredBytes
		}
		total += got.StoredBytes
		snaps = append(snaps, snap.SnapshotID)
	}
	for _, sn := range snaps {
		g.api.DeleteTemplate(ctx, sn)
	}
	s.api.DeleteSandbox(ctx, id)
	return float64(total) / float64(first)
}
