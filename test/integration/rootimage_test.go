package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
)

// goferOf tells whether sandbox id has a gofer process (runsc-gofer with
// the sandbox's bundle).
func (s *server) goferOf(id string) bool {
	s.t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		s.t.Fatal(err)
	}
	bundle := []byte(filepath.Join(s.dataDir, "runtime", "sandboxes", id) + "\x00")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && bytes.Contains(cmdline, []byte("\x00gofer\x00")) && bytes.Contains(cmdline, bundle) {
			return true
		}
	}
	return false
}

// With --root-image (the default) a sandbox's root file system is an EROFS
// image of its template and envd is another, which the sentry reads
// itself: no gofer process. Everything that checkpoints works over them
// (snapshots, forks, pause to disk), volumes still mount, and checkpoints
// taken with either form restore on a server set either way: a restore
// takes the form its checkpoint was taken with. A checkpoint over an image
// the node cannot make again exactly is refused with the reason, not
// restored over other files.
func TestRootImage(t *testing.T) {
	t.Parallel()
	images := t.TempDir()
	withImage := []string{"--root-image", "--root-image-dir", images}
	// Paused sandboxes outlive the restarts: no kill on exit until the last.
	s := newServer(t, append(withImage, "--kill-on-exit=false")...)
	s.start()
	check := "cat /tmp/state; pgrep -x sleep >/dev/null && echo sleeper"
	prepare := func(id, content string) {
		s.expect(s.do("POST", "/sandboxes/"+id+"/files/write",
			map[string]string{"path": "/tmp/state", "content": content}), 200, "write")
		s.exec(id, client.ExecuteRequest{Command: "nohup sleep 1000 >/dev/null 2>&1 &"})
	}
	expectState := func(id, content, what string) {
		t.Helper()
		if res := s.exec(id, client.ExecuteRequest{Command: check}); res.Stdout != content+"sleeper\n" {
			t.Errorf("%s: %+v, want %q and the sleeper", what, res, content)
		}
	}
	snapshot := func(id string) string {
		var snap struct {
			SnapshotID string `json:"snapshotID"`
		}
		json.Unmarshal(s.expect(s.do("POST", "/sandboxes/"+id+"/snapshots", map[string]string{}), 201, "snapshot").body, &snap)
		return snap.SnapshotID
	}

	sb := s.create(map[string]any{"templateID": "base", "timeout": 600})
	if s.goferOf(sb.SandboxID) {
		t.Errorf("sandbox over a root image has a gofer")
	}
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "test -x /.aenv/envd && cat /etc/debian_version >/dev/null && echo ok"}); res.Stdout != "ok\n" {
		t.Errorf("root image's files: %+v", res)
	}
	// envd is read-only even to the sandbox's root, as its bind mount was.
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: "echo x > /.aenv/envd || rm -f /.aenv/envd || echo refused", User: "root"}); res.Stdout != "refused\n" {
		t.Errorf("root writing envd over a root image: %+v", res)
	}
	prepare(sb.SandboxID, "image\n")
	imageSnap := snapshot(sb.SandboxID)
	for _, child := range s.fork("/sandboxes/"+sb.SandboxID+"/fork", 2) {
		expectState(child, "image\n", "fork child over a root image")
		if s.goferOf(child) {
			t.Errorf("fork child over a root image has a gofer")
		}
	}
	expectState(sb.SandboxID, "image\n", "fork parent")
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/resume", map[string]any{}), 201, "resume")
	expectState(sb.SandboxID, "image\n", "resumed from disk")

	// A volume is a bind mount: a gofer serves it, and it alone.
	s.expect(s.do("POST", "/volumes", map[string]string{"name": "work"}), 201, "volume")
	withVol := s.create(map[string]any{"templateID": "base",
		"volumeMounts": []map[string]any{{"name": "work", "path": "/mnt/work"}}})
	if res := s.exec(withVol.SandboxID, client.ExecuteRequest{Command: "echo v > /mnt/work/f && cat /mnt/work/f"}); res.Stdout != "v\n" {
		t.Errorf("volume beside a root image: %+v", res)
	}
	if !s.goferOf(withVol.SandboxID) {
		t.Errorf("sandbox with a volume over a root image has no gofer for the volume")
	}
	s.expect(s.do("DELETE", "/sandboxes/"+withVol.SandboxID, nil), 204, "delete")

	paused := s.create(map[string]any{"templateID": "base", "timeout": 600})
	prepare(paused.SandboxID, "paused over image\n")
	s.expect(s.do("POST", "/sandboxes/"+paused.SandboxID+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	s.stop(syscall.SIGTERM)

	// The same data dir on a server that boots over the directory: what
	// was taken over the image restores over it.
	s.extra = []string{"--root-image=false", "--root-image-dir", images, "--kill-on-exit=false"}
	s.start()
	s.expect(s.do("POST", "/sandboxes/"+paused.SandboxID+"/resume", map[string]any{}), 201, "resume")
	expectState(paused.SandboxID, "paused over image\n", "resumed from disk on a directory server")
	fromImage := s.create(map[string]any{"templateID": imageSnap})
	expectState(fromImage.SandboxID, "image\n", "created from an image snapshot on a directory server")
	if s.goferOf(fromImage.SandboxID) {
		t.Errorf("sandbox restored over a root image has a gofer")
	}
	dir := s.create(map[string]any{"templateID": "base", "timeout": 600})
	if !s.goferOf(dir.SandboxID) {
		t.Errorf("sandbox over the directory has no gofer")
	}
	prepare(dir.SandboxID, "directory\n")
	dirSnap := snapshot(dir.SandboxID)
	s.expect(s.do("POST", "/sandboxes/"+dir.SandboxID+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	s.stop(syscall.SIGTERM)

	// And back: what was taken over the directory restores over it.
	s.extra = withImage
	s.start()
	s.expect(s.do("POST", "/sandboxes/"+dir.SandboxID+"/resume", map[string]any{}), 201, "resume")
	expectState(dir.SandboxID, "directory\n", "resumed from disk on an image server")
	for _, child := range s.fork("/snapshots/"+dirSnap+"/fork", 2) {
		expectState(child, "directory\n", "fork of a directory snapshot on an image server")
	}

	// A checkpoint that names an image this node makes otherwise (its
	// template's files or envd differ) is refused, saying so.
	record := filepath.Join(s.dataDir, "images", imageSnap, "rootfs-image")
	imageDigest, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("sha256:"+strings.Repeat("0", 64)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := s.doNoFail("POST", "/sandboxes", map[string]any{"templateID": imageSnap})
	if r.status != 409 || !strings.Contains(string(r.body), "checkpoint was taken over sha256:0000") {
		t.Errorf("create from a snapshot over another image: %d %s", r.status, r.body)
	}
	// So is one whose envd image differs from the one this node makes
	// of the same envd (another erofs-utils).
	if err := os.WriteFile(record, []byte(imageDigest), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "images", imageSnap, "envd-image")); err != nil {
		t.Fatalf("the snapshot over images records no envd image: %v", err)
	}
	if err := os.WriteFile(filepath.Join(s.dataDir, "images", imageSnap, "envd-image"), []byte("sha256:"+strings.Repeat("1", 64)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = s.doNoFail("POST", "/sandboxes", map[string]any{"templateID": imageSnap})
	if r.status != 409 || !strings.Contains(string(r.body), "envd image sha256:1111") {
		t.Errorf("create from a snapshot over another envd image: %d %s", r.status, r.body)
	}
	s.expect(s.do("GET", "/health", nil), 200, "health")

	// The image directory holds images and their index, nothing half made.
	for _, dir := range []string{images, filepath.Join(images, "envd")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != "index" && e.Name() != "envd" && (!strings.HasSuffix(e.Name(), ".erofs") || strings.HasPrefix(e.Name(), ".")) {
				t.Errorf("stray entry in the root image directory: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}
