package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// TestVolumeMounts: volumes mounted into real sandboxes. Two sandboxes
// share one volume (one read-only), a file held open survives a pause to
// disk, fork children mount the parent's volume, a mounted volume cannot
// be deleted, and bad mounts are refused before anything is made.
func TestVolumeMounts(t *testing.T) {
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
	if res := s.exec(b, client.ExecuteRequest{Command: "sudo -n touch /data/b 2>&1 || su -c 'touch /data/b' root 2>&1; ls /data"}); strings.Contains(res.Stdout, "\nb\n") {
		t.Errorf("root wrote to a read-only mount: %+v", res)
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
	// other's writes; copy mode and snapshots are refused, not faked.
	s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/fork", map[string]any{"count": 1,
		"volumes": map[string]string{"/mnt/work": "copy"}}), 501, "fork in copy mode")
	s.expect(s.do("POST", "/sandboxes/"+a.SandboxID+"/snapshots", map[string]any{}), 409, "snapshot with volumes")
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
	s.cliOK("volume", "rm", "work")
	if _, err := os.Stat(filepath.Join(s.dataDir, "volumes", v.VolumeID)); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's files: %v", err)
	}
}
