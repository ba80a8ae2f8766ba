package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// The object store in a cluster of three nodes on this machine with a real
// S3 server (weed). These are slow (minutes per iteration) and run on their
// own: `make bench-shared`, beside raw runsc's checkpoint and restore.

// sharedBenchCluster starts the S3 server, three nodes sharing it (node-b
// restores lazily, as nodes do by default, the others fetch images whole
// first) and a gateway;
// extra are more flags for every node.
func sharedBenchCluster(b *testing.B, extra ...string) (na, nb, nc *server, g *gateway) {
	srv := s3test.Start(b)
	c := newCluster(b)
	// /22s: a fork of 64 on one node needs more slots than a /24 has.
	na = c.sharedNode("node-a", srv, append([]string{"--sandbox-cidr", "10.236.0.0/22", "--lazy-restore=false"}, extra...)...)
	nb = c.sharedNode("node-b", srv, append([]string{"--sandbox-cidr", "10.236.4.0/22", "--lazy-restore"}, extra...)...)
	nc = c.sharedNode("node-c", srv, append([]string{"--sandbox-cidr", "10.236.8.0/22", "--lazy-restore=false"}, extra...)...)
	g = c.addGateway()
	g.waitReady(b, "node-a", "node-b", "node-c")
	return na, nb, nc, g
}

// BenchmarkClusterColdCreate measures, per iteration:
//
//   - upload: a snapshot of a sandbox holding 300 MB of random memory,
//     new each iteration, from the snapshot's answer until its record says
//     uploaded (its root filesystem is in the store from the first
//     iteration on);
//   - cold / warm: create from it on another node until a command answers,
//     the first fetching the image into that node's cache (its memory
//     still arriving while it restores: --lazy-restore), the second, once
//     the image is whole in the cache, restoring from it; cold-whole: the
//     same cold create on a node that fetches the whole image first
//     (--lazy-restore=false).
//
// The nodes keep no warm snapshots: a create from the pool is a resume,
// not a restore, and the pool's own restores would compete with the
// creates measured.
func BenchmarkClusterColdCreate(b *testing.B) {
	na, nb, nc, g := sharedBenchCluster(b, "--warm-snapshots", "0")
	ctx := context.Background()
	arrived := func() int { return strings.Count(nb.logs.String(), "memory file arrived") }

	big := na.create(map[string]any{"templateID": "base", "memoryMB": 1024, "timeout": 3600}).SandboxID
	// 300 MB of random memory, made anew each time /tmp/again is written
	// to: every iteration's snapshot shares none of those pages with the
	// last (a cold create has none of their packs; the rest of the
	// sandbox's memory, a few MB, it may have), and its upload is of
	// 300 MB.
	na.exec(big, client.ExecuteRequest{Command: `mkfifo /tmp/again && nohup python3 -c '
import os
n = 0
while True:
    buf = os.urandom(300 << 20)
    open("/tmp/ready", "w").write(str(n))
    open("/tmp/again").read()
    n += 1
' >/dev/null 2>&1 &`})
	fresh := func(n int) {
		if n > 0 {
			na.exec(big, client.ExecuteRequest{Command: "echo > /tmp/again"})
		}
		waitFor(b, 2*time.Minute, "300 MB in memory", func() bool {
			res, err := na.api.Execute(ctx, big, client.ExecuteRequest{Command: "cat /tmp/ready"})
			return err == nil && res.Stdout == strconv.Itoa(n)
		})
	}

	var upload, cold, warm, coldWhole []time.Duration
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		fresh(n)
		b.StartTimer()
		snap, err := g.api.CreateSnapshot(ctx, big, "")
		if err != nil {
			b.Fatal(err)
		}
		answered := time.Now()
		waitUploaded(b, g, snap.SnapshotID)
		upload = append(upload, time.Since(answered))
		before := arrived()
		for i := range 2 {
			if i == 1 { // the warm create: the image whole in the cache
				waitFor(b, time.Minute, "the memory file in node-b's cache", func() bool { return arrived() > before })
			}
			t0 := time.Now()
			id := nb.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
			nb.exec(id, client.ExecuteRequest{Command: "true"})
			if i == 0 {
				cold = append(cold, time.Since(t0))
			} else {
				warm = append(warm, time.Since(t0))
			}
			nb.api.DeleteSandbox(ctx, id)
		}
		t0 := time.Now()
		id := nc.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
		nc.exec(id, client.ExecuteRequest{Command: "true"})
		coldWhole = append(coldWhole, time.Since(t0))
		nc.api.DeleteSandbox(ctx, id)
		g.api.DeleteTemplate(ctx, snap.SnapshotID)
		b.Logf("create from 300 MB: cold %v, warm %v, cold fetching the whole image first %v",
			cold[len(cold)-1].Round(time.Millisecond), warm[len(warm)-1].Round(time.Millisecond), coldWhole[len(coldWhole)-1].Round(time.Millisecond))
	}
	b.StopTimer()
	// Where the cold creates' time went, as the nodes logged it.
	for _, n := range []*server{nb, nc} {
		for _, line := range strings.Split(n.logs.String(), "\n") {
			if strings.Contains(line, "image ready to restore from") || strings.Contains(line, "memory file arrived") ||
				strings.Contains(line, "root filesystem fetched") {
				b.Logf("%s: %s", n.cluster.id, line)
			}
		}
	}
	reportNamed(b, "upload-300MB", upload)
	reportNamed(b, "create-cold-300MB", cold)
	reportNamed(b, "create-warm-300MB", warm)
	reportNamed(b, "create-cold-whole-300MB", coldWhole)
	pc, _ := percentiles(cold)
	pw, _ := percentiles(warm)
	pcw, _ := percentiles(coldWhole)
	b.ReportMetric(pc/pw, "cold/warm")
	b.ReportMetric(pcw/pw, "cold-whole/warm")
}

// BenchmarkClusterFork64 measures a fork of 64 children from a small
// snapshot through the gateway, split over the three nodes, against the
// same fork on one node, until every child answers a command.
func BenchmarkClusterFork64(b *testing.B) {
	na, _, _, g := sharedBenchCluster(b)
	ctx := context.Background()
	small := na.create(map[string]any{"templateID": "base", "memoryMB": 256, "timeout": 3600}).SandboxID
	smallSnap, err := g.api.CreateSnapshot(ctx, small, "")
	if err != nil {
		b.Fatal(err)
	}
	waitUploaded(b, g, smallSnap.SnapshotID)
	// Every node's cache gets the small image before the forks are timed.
	for _, id := range g.fork(b, smallSnap.SnapshotID, 3) {
		g.api.DeleteSandbox(ctx, id)
	}

	var forkCluster, forkOne []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		children := g.fork(b, smallSnap.SnapshotID, 64)
		forkCluster = append(forkCluster, time.Since(t0))
		deleteAll(g.api, children)
		t0 = time.Now()
		children = na.fork("/snapshots/"+smallSnap.SnapshotID+"/fork", 64)
		execAll(b, na.api, children)
		forkOne = append(forkOne, time.Since(t0))
		deleteAll(na.api, children)
	}
	b.StopTimer()
	reportNamed(b, "fork64-3-nodes", forkCluster)
	reportNamed(b, "fork64-1-node", forkOne)
	p3, _ := percentiles(forkCluster)
	p1, _ := percentiles(forkOne)
	b.ReportMetric(p3/64, "fork64-3-nodes-per-child-ms")
	b.ReportMetric(p1/64, "fork64-1-node-per-child-ms")
}

// waitUploaded waits until the gateway lists template id as uploaded.
func waitUploaded(tb testing.TB, g *gateway, id string) {
	tb.Helper()
	waitFor(tb, 5*time.Minute, "template "+id+" uploaded", func() bool {
		state, _ := templateUpload(tb, g, id)
		return state == "uploaded"
	})
}

// fork forks a snapshot through the gateway and waits until every child
// answers a command.
func (g *gateway) fork(tb testing.TB, snapshot string, count int) []string {
	tb.Helper()
	items, err := g.api.ForkSnapshot(context.Background(), snapshot, count)
	if err != nil {
		tb.Fatalf("fork %d of %s: %v", count, snapshot, err)
	}
	var ids []string
	for _, it := range items {
		if it.Error != nil {
			tb.Fatalf("fork child failed: %d %s", it.Error.Code, it.Error.Message)
		}
		ids = append(ids, it.Sandbox.SandboxID)
	}
	execAll(tb, g.api, ids)
	return ids
}

// execAll runs `true` in every sandbox, a few at a time.
func execAll(tb testing.TB, api *client.Client, ids []string) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	sem := make(chan struct{}, 8)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := api.Execute(context.Background(), id, client.ExecuteRequest{Command: "true"}); err != nil {
				errs <- fmt.Errorf("%s: %w", id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

func deleteAll(api *client.Client, ids []string) {
	for _, id := range ids {
		api.DeleteSandbox(context.Background(), id)
	}
}
