package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestVolumeMounts: volumes mounted into real sandboxes. Two sandboxes
// share one volume (one read-only), a file held open survives a pause to
// disk, fork children mount the parent's volume, a mounted volume cannot
// be deleted, and bad mounts are refused before anything is made.
func TestVolumeMounts(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	var v struct{ VolumeID, Name, Token string }
	if err := json.Unmarshal([]byte(s.cliOK("volume", "create", "work", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	bearer := []string{"Authorization", "Bearer " + v.Token, "X-API-Key", ""}
	content := "/volumecontent/" + v.VolumeID
	s.expect(s.do("PUT", content+"/file?path=/seed.txt", "seeded\n", bearer...), 200, "seed the volume")

	// Bad mounts are refused before any sandbox is made.
	listed := func() int {
		var all []client.Sandbox
		s.expect(s.do("GET", "/sandboxes", nil), 200, "list").json(t, &all)
		return len(all)
	}
	before := listed()
	for _, tc := range []struct {
		what   string
		mounts []map[string]any
		want   int
	}{
		{"an unknown volume", []map[string]any{{"name": "nope", "path": "/mnt/x"}}, 404},
		{"a relative path", []map[string]any{{"name": "work", "path": "mnt/x"}}, 400},
		{"a system path", []map[string]any{{"name": "work", "path": "/etc"}}, 400},
		{"under /proc", []map[string]any{{"name": "work", "path": "/proc/x"}}, 400},
		{"a path given twice", []map[string]any{{"name": "work", "path": "/a"}, {"name": "work", "path": "/a/"}}, 400},
		{"nested paths", []map[string]any{{"name": "work", "path": "/a"}, {"name": "work", "path": "/a/b"}}, 400},
	} {
		r := s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "volumeMounts": tc.mounts})
		if r.status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.what, r.status, r.body, tc.want)
		}
	}
	if after := listed(); after != before {
		t.Fatalf("refused creates left sandboxes: %d then %d", before, after)
	}
	// Another team's volume is not mounted, by name or ID, even by an
	// admin: the sandbox (and any snapshot of it) would lend it out.
	e := newEndpoint(t, s.url)
	labKey, _ := e.makeTeam("lab")
	var labVol struct{ VolumeID string }
	e.want(201, labKey, "POST", "/volumes", map[string]string{"name": "lab-data"}).json(t, &labVol)
	for _, name := range []string{labVol.VolumeID, "lab-data"} {
		e.want(404, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base",
			"volumeMounts": []map[string]any{{"name": name, "path": "/x"}}})
	}
	e.want(404, labKey, "POST", "/sandboxes", map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": v.VolumeID, "path": "/x"}}})
	e.want(204, labKey, "DELETE", "/volumes/lab-data", nil)

	// A reads and writes; B, read-only, sees A's writes and cannot write.
	a := s.create(map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "work", "path": "/mnt/work"}}})
	var info client.Sandbox
	s.expect(s.do("GET", "/sandboxes/"+a.SandboxID, nil), 200, "get").json(t, &info)
	if len(info.VolumeMounts) != 1 || info.VolumeMounts[0] != (client.VolumeMount{Name: "work", Path: "/mnt/work"}) {
		t.Errorf("GET shows mounts %+v", info.VolumeMounts)
	}
	if res := s.exec(a.SandboxID, client.ExecuteRequest{Command: "cat /mnt/work/seed.txt && echo from-a > /mnt/work/a.txt"}); res.ExitCode != 0 || res.Stdout != "seeded\n" {
		t.Fatalf("in A: %+v", res)
	}
	if got := s.expect(s.do("GET", content+"/file?path=/a.txt", nil, bearer...), 200, "read A's write"); string(got.body) != "from-a\n" {
		t.Errorf("the content API reads %q", got.body)
	}
	if data, err := os.ReadFile(filepath.Join(s.dataDir, "volumes", v.VolumeID, "data", "a.txt")); err != nil || string(data) != "from-a\n" {
		t.Errorf("on the host: %q %v", data, err)
	}
	b := strings.TrimSpace(s.cliOK("start", "base", "-d", "-v", "work:/data:ro"))
	if res := s.exec(b, client.ExecuteRequest{Command: "cat /data/a.txt; touch /data/b 2>&1; echo exit=$?"}); !strings.HasPrefix(res.Stdout, "from-a\n") ||
		!strings.Contains(res.Stdout, "Read-only file system") || strings.Contains(res.Stdout, "exit=0") {
		t.Errorf("in read-only B: %+v", res)
	}
	if res := s.exec(b, client.ExecuteRequest{Command: "sudo -n id -u && sudo -n touch /data/b 2>&1; ls /data"}); !strings.HasPrefix(res.Stdout, "0\n") ||
		!strings.Contains(res.Stdout, "Read-only file system") || strings.Contains(res.Stdout, "\nb\n") {
		t.Errorf("root in a read-only mount: %+v", res)
	}

	// A mounted volume cannot be deleted; the answer names its sandboxes.
	r := s.expect(s.do("DELETE", "/volumes/work", nil), 409, "delete a mounted volume")
	if !strings.Contains(string(r.body), a.SandboxID) || !strings.Contains(string(r.body), b) {
		t.Errorf("the refusal names neither sandbox: %s", r.body)
	}
	if out, code := s.cli("volume", "rm", "work"); code == 0 {
		t.Errorf("volume rm of a mounted volume: exit 0, %s", out)
	}

	// A file held open across a pause to disk and a resume.
	s.exec(a.SandboxID, client.ExecuteRequest{Command: "nohup sh -c 'exec 3>>/mnt/work/held; echo before >&3; " +
		"while [ ! -e /mnt/work/go ]; do sleep 0.1; done; echo after >&3' >/dev/null 2>&1 &"})
	waitFor(t, 10*time.Second, "the held file written", func() bool {
		data, _ := os.ReadFile(filepath.Join(s.dataDir, "volumes", v.VolumeID, "data", "held"))
		return string(data) == "before\n"
	})
	s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/pause", map[string]bool{"toDisk": true}), 204, "pause to disk")
	s.expect(s.do("PUT", content+"/file?path=/while-paused", "x", bearer...), 200, "write while paused")
	s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/resume", nil), 201, "resume")
	if res := s.exec(a.SandboxID, client.ExecuteRequest{Command: "cat /mnt/work/while-paused && touch /mnt/work/go"}); res.Stdout != "x" {
		t.Errorf("after resume: %+v", res)
	}
	waitFor(t, 10*time.Second, "the held file written after resume", func() bool {
		data, _ := os.ReadFile(filepath.Join(s.dataDir, "volumes", v.VolumeID, "data", "held"))
		return string(data) == "before\nafter\n"
	})

	// Fork children mount the parent's volume (shared) and see each
	// other's writes. A copy is refused while B mounts the volume too.
	r = s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/fork", map[string]any{"count": 1,
		"volumes": map[string]string{"/mnt/work": "copy"}}), 409, "fork in copy mode of a volume B mounts too")
	if !strings.Contains(string(r.body), b) {
		t.Errorf("the refusal does not name B: %s", r.body)
	}
	// A snapshot records the mount (not the files): its sandboxes mount
	// the volume again, as it is when they start.
	s.exec(a.SandboxID, client.ExecuteRequest{Command: "echo in-memory > /tmp/mem-state"})
	var snap client.Snapshot
	s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/snapshots", map[string]any{"name": "with-volume"}), 201, "snapshot with a volume").json(t, &snap)
	s.expect(s.do("PUT", content+"/file?path=/after-snapshot", "later", bearer...), 200, "write after the snapshot")
	s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "with-volume",
		"volumeMounts": []map[string]any{{"name": "work", "path": "/other"}}}), 400, "more mounts on a snapshot's sandbox")
	fromSnap := s.create(map[string]any{"templateID": "with-volume"}).SandboxID
	if res := s.exec(fromSnap, client.ExecuteRequest{Command: "cat /tmp/mem-state /mnt/work/a.txt /mnt/work/after-snapshot"}); res.Stdout != "in-memory\nfrom-a\nlater" {
		t.Errorf("a sandbox of the snapshot sees %+v", res)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+fromSnap, nil), 204, "kill the snapshot's sandbox")
	for _, k := range s.fork("/snapshots/with-volume/fork", 1) {
		if res := s.exec(k, client.ExecuteRequest{Command: "cat /mnt/work/after-snapshot"}); res.Stdout != "later" {
			t.Errorf("a fork of the snapshot sees %+v", res)
		}
		s.expect(s.do("DELETE", "/sandboxes/"+k, nil), 204, "kill the snapshot's child")
	}
	kids := s.fork("/sandboxes/"+a.SandboxID+"/fork", 2)
	for i, k := range kids {
		s.exec(k, client.ExecuteRequest{Command: "echo child > /mnt/work/child-" + kids[i]})
	}
	if res := s.exec(a.SandboxID, client.ExecuteRequest{Command: "cat /mnt/work/child-" + kids[0] + " /mnt/work/child-" + kids[1]}); res.Stdout != "child\nchild\n" {
		t.Errorf("the parent does not see its children's writes: %+v", res)
	}

	for _, id := range append(kids, a.SandboxID, b) {
		s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
	}
	// The snapshot still holds the volume.
	r = s.expect(s.do("DELETE", "/volumes/work", nil), 409, "delete a volume a snapshot holds")
	if !strings.Contains(string(r.body), "snapshot "+snap.SnapshotID) {
		t.Errorf("the refusal does not name the snapshot: %s", r.body)
	}
	s.expect(s.do("DELETE", "/templates/"+snap.SnapshotID, nil), 204, "delete the snapshot")
	s.cliOK("volume", "rm", "work")
	if _, err := os.Stat(filepath.Join(s.dataDir, "volumes", v.VolumeID)); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's files: %v", err)
	}
}

// TestVolumeCopyFork: a fork in copy mode gives each child its own
// copy-on-write copy of the parent's volume: the children and the parent
// diverge, a copy costs no file before it is written, the copies survive
// a server restart (SIGKILL), and the shared layer goes with the last
// volume that holds it.
func TestVolumeCopyFork(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	var v struct{ VolumeID, Name, Token string }
	if err := json.Unmarshal([]byte(s.cliOK("volume", "create", "repo", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	bearer := []string{"Authorization", "Bearer " + v.Token, "X-API-Key", ""}
	// Owned by the template's user, who runs the commands below.
	s.expect(s.do("PUT", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt&force=true&uid=1000&gid=1000", "base\n", bearer...), 200, "seed")
	s.expect(s.do("PUT", "/volumecontent/"+v.VolumeID+"/file?path=/big.bin", strings.Repeat("x", 4<<20), bearer...), 200, "seed a big file")

	parent := s.create(map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "repo", "path": "/repo"}}})
	p := parent.SandboxID
	s.exec(p, client.ExecuteRequest{Command: "echo parent-state > /tmp/state"})

	s.expect(s.do("POST", "/sandboxes/"+p+"/fork", map[string]any{"count": 1, "volumes": map[string]string{"/elsewhere": "copy"}}), 400, "copy of a path not mounted")
	s.expect(s.do("POST", "/sandboxes/"+p+"/fork", map[string]any{"count": 1, "volumes": map[string]string{"/repo": "mine"}}), 400, "a bad mode")

	var items []client.ForkResult
	s.expect(s.do("POST", "/sandboxes/"+p+"/fork", map[string]any{"count": 2, "volumes": map[string]string{"/repo": "copy"}}), 201, "fork with copies").json(t, &items)
	var kids []string
	copies := map[string]string{} // child -> its copy's name
	for _, it := range items {
		if it.Error != nil || it.Sandbox == nil {
			t.Fatalf("fork child failed: %+v", it.Error)
		}
		id := it.Sandbox.SandboxID
		kids = append(kids, id)
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get child").json(t, &info)
		if len(info.VolumeMounts) != 1 || info.VolumeMounts[0].Path != "/repo" || !strings.HasPrefix(info.VolumeMounts[0].Name, "repo-copy-") {
			t.Fatalf("child %s mounts %+v, want its own copy of repo at /repo", id, info.VolumeMounts)
		}
		copies[id] = info.VolumeMounts[0].Name
	}
	if st := s.state(p); st != "running" {
		t.Errorf("the parent is %s after the fork, want running again", st)
	}
	if res := s.exec(p, client.ExecuteRequest{Command: "cat /tmp/state /repo/src/main.txt"}); res.Stdout != "parent-state\nbase\n" {
		t.Errorf("the parent after the fork: %+v", res)
	}

	// A copy costs no file until one is written: its own files are none.
	var listed []struct{ VolumeID, Name string }
	s.expect(s.do("GET", "/volumes", nil), 200, "list volumes").json(t, &listed)
	ids := map[string]string{}
	for _, l := range listed {
		ids[l.Name] = l.VolumeID
	}
	for _, kid := range kids {
		own, err := os.ReadDir(filepath.Join(s.dataDir, "volumes", ids[copies[kid]], "data"))
		if err != nil || len(own) != 0 {
			t.Errorf("the copy of %s holds %d files of its own before any write (%v), want none", kid, len(own), err)
		}
	}

	// They diverge: each sees its own writes only.
	for _, kid := range kids {
		s.exec(kid, client.ExecuteRequest{Command: "echo " + kid + " > /repo/src/main.txt"})
	}
	s.exec(p, client.ExecuteRequest{Command: "echo parent > /repo/src/main.txt && echo new > /repo/parent-only"})
	for _, kid := range kids {
		if res := s.exec(kid, client.ExecuteRequest{Command: "cat /repo/src/main.txt; ls /repo; wc -c < /repo/big.bin"}); res.Stdout != kid+"\nbig.bin\nsrc\n4194304\n" {
			t.Errorf("child %s sees %q", kid, res.Stdout)
		}
	}
	if got := s.expect(s.do("GET", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", nil, bearer...), 200, "read repo"); string(got.body) != "parent\n" {
		t.Errorf("repo reads %q after the children wrote, want the parent's", got.body)
	}

	// A copy of a volume another sandbox mounts too is refused: that
	// sandbox would go on writing into the frozen layer.
	other := s.create(map[string]any{"templateID": "base", "volumeMounts": []map[string]any{{"name": "repo", "path": "/r"}}})
	s.expect(s.do("POST", "/sandboxes/"+p+"/fork", map[string]any{"count": 1, "volumes": map[string]string{"/repo": "copy"}}), 409, "copy of a volume two sandboxes mount")
	if st := s.state(p); st != "running" {
		t.Errorf("the parent is %s after a refused copy fork, want running", st)
	}
	s.expect(s.do("DELETE", "/sandboxes/"+other.SandboxID, nil), 204, "kill")

	// A snapshot of the parent records its mount; a fork of it copies the
	// volume only once no sandbox mounts it (without a pool).
	s.expect(s.do("POST", "/sandboxes/"+p+"/snapshots", map[string]any{"name": "prep"}), 201, "snapshot the parent")
	r := s.expect(s.do("POST", "/snapshots/prep/fork", map[string]any{"count": 1, "volumes": map[string]string{"/repo": "copy"}}),
		409, "a snapshot's copy of a volume its sandbox mounts")
	if !strings.Contains(string(r.body), p) {
		t.Errorf("the refusal does not name the sandbox that mounts the volume: %s", r.body)
	}
	s.expect(s.do("POST", "/snapshots/prep/fork", map[string]any{"count": 1, "volumes": map[string]string{"/nowhere": "copy"}}),
		400, "a snapshot's copy of a path it does not mount")

	// The copies' mounts outlive a SIGKILL of the server.
	s.stop(syscall.SIGKILL)
	s.start()
	for _, kid := range kids {
		if res := s.exec(kid, client.ExecuteRequest{Command: "cat /repo/src/main.txt"}); res.Stdout != kid+"\n" {
			t.Errorf("child %s after a restart: %+v", kid, res)
		}
	}

	for _, id := range append(kids, p) {
		s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
	}
	// With no sandbox mounting it, the snapshot's children each get a copy
	// of the volume as it is now (the parent's last write), and diverge.
	var snapKids []string
	for _, id := range strings.Fields(s.cliOK("snapshot", "fork", "prep", "-n", "2", "--volume-copy", "/repo")) {
		snapKids = append(snapKids, id)
		var info client.Sandbox
		s.expect(s.do("GET", "/sandboxes/"+id, nil), 200, "get a snapshot's child").json(t, &info)
		if len(info.VolumeMounts) != 1 || !strings.HasPrefix(info.VolumeMounts[0].Name, "repo-copy-") {
			t.Fatalf("snapshot child %s mounts %+v, want its own copy of repo", id, info.VolumeMounts)
		}
		if res := s.exec(id, client.ExecuteRequest{Command: "cat /tmp/state /repo/src/main.txt && echo " + id + " > /repo/src/main.txt"}); res.Stdout != "parent-state\nparent\n" {
			t.Errorf("snapshot child %s sees %q, want the snapshot's memory and the volume's files now", id, res.Stdout)
		}
		copies[id] = info.VolumeMounts[0].Name
	}
	if len(snapKids) != 2 {
		t.Fatalf("snapshot fork made %v, want 2 children", snapKids)
	}
	for _, id := range snapKids {
		if res := s.exec(id, client.ExecuteRequest{Command: "cat /repo/src/main.txt"}); res.Stdout != id+"\n" {
			t.Errorf("snapshot child %s reads %q after the other wrote, want its own", id, res.Stdout)
		}
	}
	if got := s.expect(s.do("GET", "/volumecontent/"+v.VolumeID+"/file?path=/src/main.txt", nil, bearer...), 200, "read repo"); string(got.body) != "parent\n" {
		t.Errorf("repo reads %q after the snapshot's children wrote, want the parent's", got.body)
	}
	for _, id := range snapKids {
		s.expect(s.do("DELETE", "/sandboxes/"+id, nil), 204, "kill")
		s.cliOK("volume", "rm", copies[id])
	}
	s.expect(s.do("DELETE", "/templates/prep", nil), 204, "delete the snapshot")
	// The original goes; its copies keep the layer they share.
	s.cliOK("volume", "rm", "repo")
	for _, kid := range kids {
		if out := s.cliOK("volume", "inspect", copies[kid], "-o", "json"); !strings.Contains(out, copies[kid]) {
			t.Errorf("inspect %s: %s", copies[kid], out)
		}
	}
	layers := filepath.Join(s.dataDir, "volumes", ".layers")
	if entries, err := os.ReadDir(layers); err != nil || len(entries) != 1 {
		t.Errorf("%d layers while the copies live (%v), want 1", len(entries), err)
	}
	for _, kid := range kids {
		s.cliOK("volume", "rm", copies[kid])
	}
	if entries, err := os.ReadDir(layers); err != nil || len(entries) != 0 {
		t.Errorf("layers left once every volume is gone: %d (%v)", len(entries), err)
	}
}
