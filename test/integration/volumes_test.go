package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Volumes with the real server and the aenv CLI: made, filled through the
// content API, kept across a restart (a SIGKILL, even), refused bad paths
// and oversized uploads, and removed with their files.
func TestVolumesCLIAndRestart(t *testing.T) {
	t.Parallel()
	s := newServer(t, "--max-file-upload-mb", "1")
	s.start()
	var v struct {
		VolumeID, Name, Token string
	}
	if err := json.Unmarshal([]byte(s.cliOK("volume", "create", "data", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.VolumeID, "vol-") || v.Name != "data" || v.Token == "" {
		t.Fatalf("created %+v", v)
	}
	if out, code := s.cli("volume", "create", "data"); code == 0 || !strings.Contains(out, "already") {
		t.Errorf("a second volume named data: exit %d, %s", code, out)
	}
	bearer := []string{"Authorization", "Bearer " + v.Token, "X-API-Key", ""}
	content := "/volumecontent/" + v.VolumeID
	s.expect(s.do("PUT", content+"/file?path=/a/b.txt&force=true", "kept across restarts\n", bearer...), 200, "write")

	for _, tc := range []struct {
		what, method, path string
		body               string
		headers            []string
		want               int
	}{
		{"traversal", "GET", content + "/file?path=../../../etc/passwd", "", bearer, 400},
		{"traversal in a directory", "GET", content + "/dir?path=/a/../../..", "", bearer, 400},
		{"no path", "GET", content + "/file", "", bearer, 400},
		{"a directory read as a file", "GET", content + "/file?path=/a", "", bearer, 400},
		{"a missing file", "GET", content + "/file?path=/nope", "", bearer, 404},
		{"no token", "GET", content + "/file?path=/a/b.txt", "", []string{"X-API-Key", ""}, 401},
		{"the API key instead of the token", "GET", content + "/file?path=/a/b.txt", "", nil, 401},
		{"a wrong token", "GET", content + "/file?path=/a/b.txt", "", []string{"Authorization", "Bearer vtok_WRONG", "X-API-Key", ""}, 401},
		{"an upload past --max-file-upload-mb", "PUT", content + "/file?path=/big", strings.Repeat("x", 2<<20), bearer, 413},
		{"a bad mode", "PUT", content + "/file?path=/m&mode=99999", "x", bearer, 400},
	} {
		r := s.do(tc.method, tc.path, tc.body, tc.headers...)
		if r.status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.what, r.status, r.body, tc.want)
		}
	}
	// A refused upload leaves nothing behind.
	dir := filepath.Join(s.dataDir, "volumes", v.VolumeID, "data")
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != "a" {
		t.Errorf("the volume holds %v after refused uploads, want only a/", entries)
	}

	s.stop(syscall.SIGKILL)
	s.start()
	if got := s.expect(s.do("GET", content+"/file?path=/a/b.txt", nil, bearer...), 200, "read after a restart"); string(got.body) != "kept across restarts\n" {
		t.Errorf("after a restart: %q", got.body)
	}
	if out := s.cliOK("volume", "ls"); !strings.Contains(out, v.VolumeID) || !strings.Contains(out, "data") {
		t.Errorf("volume ls: %s", out)
	}
	if out := s.cliOK("volume", "inspect", "data"); !strings.Contains(out, v.Token) {
		t.Errorf("volume inspect: %s", out)
	}
	s.cliOK("volume", "rm", "data")
	if _, err := os.Stat(filepath.Join(s.dataDir, "volumes", v.VolumeID)); !os.IsNotExist(err) {
		t.Errorf("a removed volume's files: %v", err)
	}
	s.expect(s.do("GET", content+"/file?path=/a/b.txt", nil, bearer...), 401, "a removed volume's token")
	if out, code := s.cli("volume", "inspect", "data"); code == 0 {
		t.Errorf("inspect a removed volume: exit 0, %s", out)
	}
}

// TestVolumeCp: aenv volume cp copies a tree up and down whole, keeps
// modes, goes inside an existing directory as cp does, and skips links.
func TestVolumeCp(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	s.cliOK("volume", "create", "trees")
	src := t.TempDir()
	files := map[string]string{
		"top.txt":         "top\n",
		"a/b/deep.txt":    "deep\n",
		"a/big.bin":       strings.Repeat("0123456789", 300_000),
		"a/empty-dir/.gk": "",
	}
	for name, content := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "a", "link")); err != nil {
		t.Fatal(err)
	}
	out, code := s.cli("volume", "cp", src, "trees:/up")
	if code != 0 || !strings.Contains(out, "copied 4 file(s)") || !strings.Contains(out, "skipped") {
		t.Fatalf("cp up: exit %d, %s", code, out)
	}
	down := t.TempDir()
	s.cliOK("volume", "cp", "trees:/up", down)
	for name, content := range files {
		p := filepath.Join(down, "up", name)
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Errorf("%s after the round trip: %d bytes, %v", name, len(got), err)
			continue
		}
		if info, _ := os.Stat(p); info.Mode().Perm() != 0o640 {
			t.Errorf("%s mode %v, want 0640", name, info.Mode().Perm())
		}
	}
	if _, err := os.Lstat(filepath.Join(down, "up", "a", "link")); !os.IsNotExist(err) {
		t.Errorf("a link was copied: %v", err)
	}
	// A file onto an existing volume directory goes inside it.
	s.cliOK("volume", "cp", filepath.Join(src, "top.txt"), "trees:/up/a")
	s.cliOK("volume", "cp", "trees:/up/a/top.txt", filepath.Join(down, "again.txt"))
	if got, err := os.ReadFile(filepath.Join(down, "again.txt")); err != nil || string(got) != "top\n" {
		t.Errorf("a file copied into a directory and back: %q %v", got, err)
	}
	for _, bad := range [][]string{{"a", "b"}, {"trees:/x", "trees:/y"}} {
		if out, code := s.cli(append([]string{"volume", "cp"}, bad...)...); code != 2 {
			t.Errorf("cp %v: exit %d, %s; want 2 (usage)", bad, code, out)
		}
	}
	if out, code := s.cli("volume", "cp", "nope:/x", down); code == 0 {
		t.Errorf("cp from an unknown volume: exit 0, %s", out)
	}
}
