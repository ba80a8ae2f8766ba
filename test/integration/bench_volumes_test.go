package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// Benchmarks of volumes (make bench-volumes): a create with a volume next
// to one without, a fork of 8 sharing a 1 GB volume next to one copying it
// (and the disk the copies take before any write), and file throughput on
// a volume next to the sandbox's own root file system.

// benchVolume makes volume name on s and returns its ID and host files.
func benchVolume(b *testing.B, s *server, name string) (id, dir string) {
	b.Helper()
	var v struct{ VolumeID string }
	if err := json.Unmarshal([]byte(s.cliOK("volume", "create", name, "-o", "json")), &v); err != nil {
		b.Fatal(err)
	}
	return v.VolumeID, filepath.Join(s.dataDir, "volumes", v.VolumeID, "data")
}

// BenchmarkVolumeCreate: create until the first exec, with one volume
// mounted and without (both boots: a sandbox with volumes takes no pooled
// one, and the server is started with no pools).
func BenchmarkVolumeCreate(b *testing.B) {
	s := newServer(b, "--warm-sandboxes", "0", "--prepared-sandboxes", "0")
	s.start()
	benchVolume(b, s, "bench")
	var plain, mounted []time.Duration
	run := func(body map[string]any) time.Duration {
		start := time.Now()
		sb := s.create(body)
		s.exec(sb.SandboxID, client.ExecuteRequest{Command: "true"})
		took := time.Since(start)
		b.StopTimer()
		s.api.DeleteSandbox(b.Context(), sb.SandboxID)
		b.StartTimer()
		return took
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plain = append(plain, run(map[string]any{"templateID": "base"}))
		mounted = append(mounted, run(map[string]any{"templateID": "base",
			"volumeMounts": []map[string]any{{"name": "bench", "path": "/mnt/data"}}}))
	}
	b.StopTimer()
	reportNamed(b, "without", plain)
	reportNamed(b, "with-volume", mounted)
	p, _ := percentiles(plain)
	m, _ := percentiles(mounted)
	b.ReportMetric(m/p, "ratio-p50")
}

// BenchmarkVolumeFork8: a fork of 8 of a parent mounting a 1 GB volume,
// until every child answers an exec: shared, then with copies, next to
// the same fork of a parent without a volume; and the disk the 8 copies
// take before any write. Volumes as directories (copies are overlays),
// then in a volume pool (copies are snapshots).
func BenchmarkVolumeFork8(b *testing.B) {
	b.Run("directory", func(b *testing.B) { benchVolumeFork8(b, false) })
	b.Run("pool", func(b *testing.B) { benchVolumeFork8(b, true) })
}

// poolFlags are the flags of a server keeping volumes in a pool of gb
// GiB, or none.
func poolFlags(pool bool, gb int) []string {
	if !pool {
		return nil
	}
	return []string{"--volume-pool-gb", strconv.Itoa(gb)}
}

// poolUsed is the disk the volume pool of s uses, synced.
func poolUsed(b *testing.B, s *server) int64 {
	b.Helper()
	dir := filepath.Join(s.dataDir, "volumes")
	if out, err := exec.Command("sync", "-f", dir).CombinedOutput(); err != nil {
		b.Fatalf("sync: %v %s", err, out)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

func benchVolumeFork8(b *testing.B, pool bool) {
	s := newServer(b, append([]string{"--warm-sandboxes", "0", "--prepared-sandboxes", "0"}, poolFlags(pool, 3)...)...)
	s.start()
	_, dir := benchVolume(b, s, "gigabyte")
	// 1 GB of data in 16 files, written on the host.
	fillRandom(b, dir, 16, 64)
	bare := s.create(map[string]any{"templateID": "base"}).SandboxID
	parent := s.create(map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "gigabyte", "path": "/data"}}}).SandboxID
	fork := func(id string, body map[string]any) ([]string, time.Duration) {
		start := time.Now()
		var items []client.ForkResult
		s.expect(s.do("POST", "/sandboxes/"+id+"/fork", body), 201, "fork").json(b, &items)
		var kids []string
		for _, it := range items {
			if it.Error != nil || it.Sandbox == nil {
				b.Fatalf("fork child failed: %+v", it.Error)
			}
			kids = append(kids, it.Sandbox.SandboxID)
			s.exec(it.Sandbox.SandboxID, client.ExecuteRequest{Command: "true"})
		}
		return kids, time.Since(start)
	}
	var without, shared, copied []time.Duration
	var copyBytes int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		kids, took := fork(bare, map[string]any{"count": 8})
		without = append(without, took)
		kids2, took := fork(parent, map[string]any{"count": 8})
		shared = append(shared, took)
		// A copy is made of a volume only its parent mounts: the shared
		// children go first.
		b.StopTimer()
		for _, k := range kids2 {
			s.api.DeleteSandbox(b.Context(), k)
		}
		var before int64
		if pool {
			before = poolUsed(b, s)
		}
		b.StartTimer()
		kids3, took := fork(parent, map[string]any{"count": 8, "volumes": map[string]string{"/data": "copy"}})
		copied = append(copied, took)
		b.StopTimer()
		copyBytes = 0
		if pool {
			// Snapshots share every block: what they cost is what the
			// pool took beside them (a copy's files would count whole).
			copyBytes = max(0, poolUsed(b, s)-before)
		}
		for _, k := range kids3 {
			if pool {
				break
			}
			var info client.Sandbox
			s.expect(s.do("GET", "/sandboxes/"+k, nil), 200, "get").json(b, &info)
			copyBytes += diskUsed(b, s, info.VolumeMounts[0].Name)
		}
		for _, k := range append(kids, kids3...) {
			s.api.DeleteSandbox(b.Context(), k)
		}
		// The copies go too, and with them the layers they alone hold.
		var listed []struct{ Name string }
		s.expect(s.do("GET", "/volumes", nil), 200, "list").json(b, &listed)
		for _, l := range listed {
			if strings.Contains(l.Name, "-copy-") {
				s.cliOK("volume", "rm", l.Name)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportNamed(b, "no-volume", without)
	reportNamed(b, "shared", shared)
	reportNamed(b, "copy", copied)
	w, _ := percentiles(without)
	c, _ := percentiles(copied)
	b.ReportMetric(c/w, "copy-ratio-p50")
	b.ReportMetric(float64(copyBytes)/(1<<20), "copies-disk-MiB")
	b.ReportMetric(100*float64(copyBytes)/float64(8<<30), "copies-disk-%-of-8GB")
}

// diskUsed is the disk a volume's own files take (its upper directory for
// a copy), by name.
func diskUsed(b *testing.B, s *server, name string) int64 {
	b.Helper()
	var v struct{ VolumeID string }
	if err := json.Unmarshal([]byte(s.cliOK("volume", "inspect", name, "-o", "json")), &v); err != nil {
		b.Fatal(err)
	}
	var total int64
	err := filepath.Walk(filepath.Join(s.dataDir, "volumes", v.VolumeID, "data"), func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		b.Fatalf("disk used by %s: %v", name, err)
	}
	return total
}

// BenchmarkVolumeThroughput: inside one sandbox, write then read 100 MB
// (synced) and make then read 10,000 small files, on a volume and on the
// sandbox's own root file system (its memory overlay); the volume a
// directory, then in a volume pool.
func BenchmarkVolumeThroughput(b *testing.B) {
	b.Run("directory", func(b *testing.B) { benchVolumeThroughput(b, false) })
	b.Run("pool", func(b *testing.B) { benchVolumeThroughput(b, true) })
}

func benchVolumeThroughput(b *testing.B, pool bool) {
	s := newServer(b, poolFlags(pool, 1)...)
	s.start()
	benchVolume(b, s, "speed")
	id := s.create(map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "speed", "path": "/mnt/vol"}}}).SandboxID
	// Seconds, by the sandbox's clock, of each step at dir.
	script := `d=%s; s=$(date +%%s.%%N); dd if=/dev/zero of=$d/big bs=1M count=100 conv=fsync status=none;
m=$(date +%%s.%%N); cat $d/big > /dev/null; e=$(date +%%s.%%N);
mkdir -p $d/small; for i in $(seq 10000); do echo $i > $d/small/$i; done; f=$(date +%%s.%%N);
cat $d/small/* > /dev/null; g=$(date +%%s.%%N); rm -rf $d/big $d/small; echo $s $m $e $f $g`
	measure := func(dir string) [4]float64 {
		res := s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf(script, dir), Timeout: 600})
		f := strings.Fields(res.Stdout)
		if res.ExitCode != 0 || len(f) != 5 {
			b.Fatalf("throughput script at %s: %+v", dir, res)
		}
		var t [5]float64
		for i := range f {
			t[i], _ = strconv.ParseFloat(f[i], 64)
		}
		return [4]float64{100 / (t[1] - t[0]), 100 / (t[2] - t[1]), 10000 / (t[3] - t[2]), 10000 / (t[4] - t[3])}
	}
	var vol, root [4]float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		vol = measure("/mnt/vol")
		root = measure("/home/user")
	}
	b.StopTimer()
	names := []string{"write-MBps", "read-MBps", "create-files-per-s", "read-files-per-s"}
	for i, n := range names {
		b.ReportMetric(vol[i], "volume-"+n)
		b.ReportMetric(root[i], "rootfs-"+n)
	}
}

// BenchmarkVolumeMove: a volume of 1 GiB in 16 files and 10,000 small
// ones moved between two nodes with volume pools through a gateway (POST
// /volumes/{id}/move, both ways in turn), next to the raw copy of the
// same tree on this machine: tar into tar, from one node's pool into the
// other's.
func BenchmarkVolumeMove(b *testing.B) {
	c := newCluster(b)
	nodes := map[string]*server{
		"node-a": c.addNode("node-a", "--volume-pool-gb", "4", "--warm-sandboxes", "0", "--prepared-sandboxes", "0"),
		"node-b": c.addNode("node-b", "--volume-pool-gb", "4", "--warm-sandboxes", "0", "--prepared-sandboxes", "0"),
	}
	g := c.addGateway()
	g.waitReady(b, "node-a", "node-b")
	gw := &server{t: b, url: g.url, checked: client.NewHTTPClient(4)}
	var v struct {
		VolumeID, NodeID string
	}
	gw.expect(gw.do("POST", "/volumes", map[string]any{"name": "moving", "sizeMB": 2048}), 201, "create").json(b, &v)
	dir := filepath.Join(nodes[v.NodeID].dataDir, "volumes", v.VolumeID, "data")
	fillRandom(b, dir, 16, 64)
	small := make([]byte, 4096)
	for i := range 10_000 {
		sub := filepath.Join(dir, "small", strconv.Itoa(i/100))
		if i%100 == 0 {
			must(b, os.MkdirAll(sub, 0o755))
		}
		small[0] = byte(i)
		must(b, os.WriteFile(filepath.Join(sub, strconv.Itoa(i)), small, 0o644))
	}
	const bytes = 16*64<<20 + 10_000*4096
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}
	raw := func(from string) time.Duration {
		src := filepath.Join(nodes[from].dataDir, "volumes", v.VolumeID, "data")
		dst := filepath.Join(nodes[other[from]].dataDir, "volumes", "raw-copy")
		must(b, os.Mkdir(dst, 0o700))
		defer os.RemoveAll(dst)
		start := time.Now()
		cmd := exec.Command("sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xf - && sync -f "$2"`, "sh", src, dst)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("tar: %v %s", err, out)
		}
		return time.Since(start)
	}
	var moves, raws []time.Duration
	at := v.NodeID
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		raws = append(raws, raw(at))
		b.StartTimer()
		start := time.Now()
		gw.expect(gw.do("POST", "/volumes/moving/move", nil), 200, "move").json(b, &v)
		moves = append(moves, time.Since(start))
		if v.NodeID != other[at] {
			b.Fatalf("moved to %s, want %s", v.NodeID, other[at])
		}
		at = v.NodeID
	}
	b.StopTimer()
	reportNamed(b, "move", moves)
	reportNamed(b, "raw-tar", raws)
	m, _ := percentiles(moves)
	r, _ := percentiles(raws)
	b.ReportMetric(bytes/(1<<20)/(m/1000), "move-MiB/s")
	b.ReportMetric(bytes/(1<<20)/(r/1000), "raw-MiB/s")
	b.ReportMetric(m/r, "ratio-p50")
}

// BenchmarkVolumeForkAcrossNodes: through a gateway, a fork of 8 from an
// uploaded snapshot whose 1 GiB volume (16 files of 64 MiB) each child
// copies, spread over two nodes with volume pools (the gateway moves one
// copy to the node without the volume), next to the same fork of a
// snapshot without a volume in the same run.
func BenchmarkVolumeForkAcrossNodes(b *testing.B) {
	srv := s3test.Start(b)
	c := newCluster(b)
	nodes := map[string]*server{}
	for _, id := range []string{"node-a", "node-b"} {
		nodes[id] = c.sharedNode(id, srv, "--volume-pool-gb", "4", "--warm-sandboxes", "0", "--prepared-sandboxes", "0")
	}
	g := c.addGateway()
	g.waitReady(b, "node-a", "node-b")
	gw := &server{t: b, url: g.url, checked: client.NewHTTPClient(4)}
	var v struct{ VolumeID, NodeID string }
	gw.expect(gw.do("POST", "/volumes", map[string]any{"name": "dataset", "sizeMB": 2048}), 201, "create").json(b, &v)
	dir := filepath.Join(nodes[v.NodeID].dataDir, "volumes", v.VolumeID, "data")
	fillRandom(b, dir, 16, 64)
	snapshot := func(name string, mounts []map[string]any) {
		var sb client.Sandbox
		gw.expect(gw.do("POST", "/sandboxes", map[string]any{"templateID": "base", "volumeMounts": mounts}), 201, "create").json(b, &sb)
		snap, err := g.api.CreateSnapshot(b.Context(), sb.SandboxID, name)
		if err != nil {
			b.Fatal(err)
		}
		gw.expect(gw.do("DELETE", "/sandboxes/"+sb.SandboxID, nil), 204, "kill")
		waitFor(b, 3*time.Minute, name+" uploaded", func() bool {
			state, _ := templateUpload(b, g, snap.SnapshotID)
			return state == "uploaded"
		})
	}
	snapshot("with-volume", []map[string]any{{"name": "dataset", "path": "/data"}})
	snapshot("without", nil)
	fork := func(name string, body map[string]any) time.Duration {
		var items []client.ForkResult
		start := time.Now()
		gw.expect(gw.do("POST", "/snapshots/"+name+"/fork", body), 201, "fork").json(b, &items)
		took := time.Since(start)
		nodesUsed := map[string]bool{}
		for _, it := range items {
			if it.Error != nil || it.Sandbox == nil {
				b.Fatalf("fork child: %+v", it.Error)
			}
			node, _ := g.sandboxNode(b, it.Sandbox.SandboxID)
			nodesUsed[node] = true
			var info client.Sandbox
			gw.expect(gw.do("GET", "/sandboxes/"+it.Sandbox.SandboxID, nil), 200, "get").json(b, &info)
			gw.expect(gw.do("DELETE", "/sandboxes/"+it.Sandbox.SandboxID, nil), 204, "kill")
			for _, m := range info.VolumeMounts {
				gw.expect(gw.do("DELETE", "/volumes/"+m.Name, nil), 204, "delete a copy")
			}
		}
		if len(nodesUsed) != 2 {
			b.Fatalf("fork of %s on nodes %v, want both", name, nodesUsed)
		}
		return took
	}
	var copies, plain []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copies = append(copies, fork("with-volume", map[string]any{"count": 8, "volumes": map[string]string{"/data": "copy"}}))
		plain = append(plain, fork("without", map[string]any{"count": 8}))
	}
	b.StopTimer()
	reportNamed(b, "fork8-copies", copies)
	reportNamed(b, "fork8-plain", plain)
	cp, _ := percentiles(copies)
	pl, _ := percentiles(plain)
	b.ReportMetric(cp/pl, "ratio-p50")
}

// fillRandom writes files files of random bytes, of mb MiB each, into dir.
func fillRandom(b *testing.B, dir string, files, mb int) {
	b.Helper()
	for i := range files {
		out, err := exec.Command("dd", "if=/dev/urandom", "of="+filepath.Join(dir, fmt.Sprintf("part-%02d", i)),
			"bs=1M", "count="+strconv.Itoa(mb), "status=none").CombinedOutput()
		if err != nil {
			b.Fatalf("dd: %v %s", err, out)
		}
	}
}
