package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestVolumePool: a server with a volume pool bounds each volume to its
// size (EDQUOT inside a sandbox, 507 on the content API), copies volumes
// for forks as snapshots (even one another sandbox mounts), keeps them
// across a SIGKILL, and unmounts the pool when it stops with nothing
// left (checkNoLeaks: no mount, no loop device).
func TestVolumePool(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--volume-pool-gb", "1", "--volume-size-mb", "64")
	s.start()

	type volumeInfo struct {
		VolumeID, Name, Token string
		SizeMB                int64
	}
	var small, repo volumeInfo
	s.expect(s.do("POST", "/volumes", map[string]any{"name": "small", "sizeMB": 32}), 201, "a 32 MiB volume").json(t, &small)
	if small.SizeMB != 32 {
		t.Fatalf("small: %+v, want sizeMB 32", small)
	}
	s.expect(s.do("POST", "/volumes", map[string]any{"name": "repo"}), 201, "a volume of the default size").json(t, &repo)
	if repo.SizeMB != 64 {
		t.Fatalf("repo: %+v, want the default, 64", repo)
	}
	s.expect(s.do("POST", "/volumes", map[string]any{"name": "huge", "sizeMB": 4096}), 400, "larger than the pool")
	s.expect(s.do("POST", "/volumes", map[string]any{"name": "none", "sizeMB": 0}), 400, "size 0")
	var got volumeInfo
	s.expect(s.do("GET", "/volumes/small", nil), 200, "get small").json(t, &got)
	if got.SizeMB != 32 {
		t.Errorf("GET small: %+v", got)
	}

	// The bound inside a sandbox, whatever the user.
	sb := s.create(map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "small", "path": "/data"}}})
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "dd if=/dev/zero of=/data/fits bs=1M count=16 conv=fsync 2>&1"}); res.ExitCode != 0 {
		t.Fatalf("16 MiB in a 32 MiB volume: %+v", res)
	}
	res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "dd if=/dev/zero of=/data/too-much bs=1M count=48 conv=fsync 2>&1", User: "root"})
	if res.ExitCode == 0 || !strings.Contains(res.Stdout, "quota") {
		t.Fatalf("48 MiB more in a 32 MiB volume: %+v, want dd to fail on the quota", res)
	}
	s.exec(sb.SandboxID, client.ExecuteRequest{Command: "rm -f /data/too-much", User: "root"})
	// The content API: 507, and the file it would have replaced stays.
	bearer := []string{"Authorization", "Bearer " + small.Token, "X-API-Key", ""}
	s.expect(s.do("PUT", "/volumecontent/"+small.VolumeID+"/file?path=/fits", strings.Repeat("x", 24<<20), bearer...), 507, "an upload past the size")
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "wc -c < /data/fits"}); strings.TrimSpace(res.Stdout) != "16777216" {
		t.Errorf("the file after a refused upload: %+v", res)
	}

	// Copies for a fork: snapshots, each bounded as its source, even
	// while another sandbox mounts the volume.
	rb := []string{"Authorization", "Bearer " + repo.Token, "X-API-Key", ""}
	s.expect(s.do("PUT", "/volumecontent/"+repo.VolumeID+"/file?path=/src/main.txt&force=true&uid=1000&gid=1000", "base\n", rb...), 200, "seed")
	s.expect(s.do("PUT", "/volumecontent/"+repo.VolumeID+"/file?path=/big.bin", strings.Repeat("x", 16<<20), rb...), 200, "seed a big file")
	parent := s.create(map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "repo", "path": "/repo"}}})
	reader := s.create(map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "repo", "path": "/r"}}})
	s.exec(parent.SandboxID, client.ExecuteRequest{Command: "echo parent-state > /tmp/state"})
	var items []client.ForkResult
	s.expect(s.do("POST", "/sandboxes/"+parent.SandboxID+"/fork", map[string]any{"count": 2, "volumes": map[string]string{"/repo": "copy"}}), 201,
		"fork with copies of a volume two sandboxes mount").json(t, &items)
	var kids []string
	copies := map[string]string{}
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("fork child failed: %+v", it.Error)
		}
		id := it.Sandbox.SandboxID
		kids = append(kids, id)
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get child").json(t, &info)
		if len(info.VolumeMounts) != 1 || !strings.HasPrefix(info.VolumeMounts[0].Name, "repo-copy-") {
			t.Fatalf("child %s mounts %+v, want its own copy of repo", id, info.VolumeMounts)
		}
		copies[id] = info.VolumeMounts[0].Name
		var c volumeInfo
		s.expect(s.do("GET", "/volumes/"+copies[id], nil), 200, "get a copy").json(t, &c)
		if c.SizeMB != 64 {
			t.Errorf("copy %+v, want its source's size", c)
		}
		// A subvolume of its own: its top directory is inode 256.
		info2, err := os.Stat(filepath.Join(s.dataDir, "volumes", c.VolumeID, "data"))
		if err != nil || info2.Sys().(*syscall.Stat_t).Ino != 256 {
			t.Errorf("copy %s is not a subvolume: %v", c.Name, err)
		}
	}
	for _, kid := range kids {
		s.exec(kid, client.ExecuteRequest{Command: "echo " + kid + " > /repo/src/main.txt"})
	}
	s.exec(reader.SandboxID, client.ExecuteRequest{Command: "echo reader > /r/src/main.txt"})
	for _, kid := range kids {
		if res := s.exec(kid, client.ExecuteRequest{Command: "cat /tmp/state /repo/src/main.txt; wc -c < /repo/big.bin"}); res.Stdout != "parent-state\n"+kid+"\n16777216\n" {
			t.Errorf("child %s sees %q", kid, res.Stdout)
		}
	}
	if res := s.exec(parent.SandboxID, client.ExecuteRequest{Command: "cat /repo/src/main.txt"}); res.Stdout != "reader\n" {
		t.Errorf("the parent sees %q, want what the other sandbox mounting repo wrote", res.Stdout)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.dataDir, "volumes", ".layers")); len(entries) != 0 {
		t.Errorf("frozen snapshots left after the fork: %d", len(entries))
	}

	// A snapshot's fork copies the volume as it is now, in a pool even
	// while sandboxes mount it.
	s.expect(s.do("POST", "/sandboxes/"+parent.SandboxID+"/snapshots", map[string]any{"name": "prep"}), 201, "snapshot the parent")
	items = nil
	s.expect(s.do("POST", "/snapshots/prep/fork", map[string]any{"count": 2, "volumes": map[string]string{"/repo": "copy"}}), 201,
		"a snapshot's fork with copies of a mounted volume").json(t, &items)
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("snapshot fork child failed: %+v", it.Error)
		}
		id := it.Sandbox.SandboxID
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get a snapshot's child").json(t, &info)
		if len(info.VolumeMounts) != 1 || !strings.HasPrefix(info.VolumeMounts[0].Name, "repo-copy-") {
			t.Fatalf("snapshot child %s mounts %+v, want its own copy of repo", id, info.VolumeMounts)
		}
		if res := s.exec(id, client.ExecuteRequest{Command: "cat /tmp/state /repo/src/main.txt && echo mine > /repo/src/main.txt"}); res.Stdout != "parent-state\nreader\n" {
			t.Errorf("snapshot child %s sees %q, want the snapshot's memory and the volume's files now", id, res.Stdout)
		}
		s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
		s.cliOK("volume", "rm", info.VolumeMounts[0].Name)
	}
	if res := s.exec(parent.SandboxID, client.ExecuteRequest{Command: "cat /repo/src/main.txt"}); res.Stdout != "reader\n" {
		t.Errorf("the parent sees %q after the snapshot's children wrote their copies", res.Stdout)
	}
	s.expect(s.do("DELETE", "/templates/prep", nil), 204, "delete the snapshot")
	if entries, _ := os.ReadDir(filepath.Join(s.dataDir, "volumes", ".layers")); len(entries) != 0 {
		t.Errorf("frozen snapshots left after the snapshot's fork: %d", len(entries))
	}

	// Across a SIGKILL: the pool stays mounted for the running sandboxes.
	s.stop(syscall.SIGKILL)
	s.start()
	for _, kid := range kids {
		if res := s.exec(kid, client.ExecuteRequest{Command: "cat /repo/src/main.txt"}); res.Stdout != kid+"\n" {
			t.Errorf("child %s after a restart: %+v", kid, res)
		}
	}
	for _, id := range append(kids, parent.SandboxID, reader.SandboxID, sb.SandboxID) {
		s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
	}
	for _, name := range []string{"small", "repo", copies[kids[0]], copies[kids[1]]} {
		s.cliOK("volume", "rm", name)
	}
}
