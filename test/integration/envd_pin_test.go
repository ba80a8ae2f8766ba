package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// A checkpoint holds envd's code by reference to its binary: restored over
// another build, a sandbox crashed. The server runs a copy of envd named by
// its digest, and images keep the copy they were taken with, so that
// replacing the binary in place (an installer's cp, a rebuild) and
// restarting leaves a sandbox paused to disk and a snapshot restoring with
// their own build, while new sandboxes run the new one. The old build's
// pinned copy, once unused for a day, is removed (one would stay at every
// upgrade), and the restores of its images pin it again.
func TestImagesKeepTheirEnvd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	envd := filepath.Join(dir, "envd")
	// The first build is another build of the same source, unoptimised:
	// its code is laid out otherwise throughout.
	build := exec.Command("go", "build", "-gcflags=all=-N -l", "-o", envd, "./cmd/envd")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build another envd: %v\n%s", err, out)
	}
	oldDigest, err := fileDigest(envd)
	if err != nil {
		t.Fatal(err)
	}

	s := newServer(t, "--envd", envd, "--kill-on-exit=false")
	s.start()
	sb := s.create(map[string]any{"templateID": "base", "timeout": 600})
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/files/write",
		map[string]string{"path": "/tmp/state", "content": "kept\n"}), 200, "write")
	s.exec(sb.SandboxID, client.ExecuteRequest{Command: "nohup sleep 1000 >/dev/null 2>&1 &"})
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]string{}), 201, "snapshot").body, &snap)
	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	// A code interpreter sandbox, from the warm snapshot this build makes,
	// with state in its kernel.
	ci := createCodeInterpreter(t, s)
	if _, err := s.api.CodeInterpreter(ci.SandboxID, ci.EnvdAccessToken).RunCode(t.Context(),
		client.RunCodeRequest{Code: "x = 5"}, nil); err != nil {
		t.Fatal(err)
	}
	s.expect(s.do("POST", "/sandboxes/"+ci.SandboxID+"/pause", map[string]any{"toDisk": true}), 204, "pause to disk")
	s.stop(syscall.SIGTERM)

	// The binary replaced in place (same file, new content), as cp does.
	newBuild, err := os.ReadFile(filepath.Join(binDir, "envd"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(envd, newBuild, 0o755); err != nil {
		t.Fatal(err)
	}
	// The old build unused for two days: its pinned copy goes as the
	// server starts, as no sandbox runs it.
	oldPinned := filepath.Join(s.dataDir, "envd", oldDigest)
	twoDaysAgo := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(oldPinned, twoDaysAgo, twoDaysAgo); err != nil {
		t.Fatal(err)
	}
	s.extra = []string{"--envd", envd} // the next stop (cleanup) kills everything
	s.start()
	waitFor(t, time.Minute, "the old envd build's pinned copy removed", func() bool {
		_, err := os.Stat(oldPinned)
		return errors.Is(err, fs.ErrNotExist)
	})

	s.expect(s.do("POST", "/sandboxes/"+sb.SandboxID+"/resume", map[string]any{}), 201, "resume")
	check := "cat /tmp/state; pgrep -x sleep >/dev/null && echo sleeper"
	if res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: check}); res.Stdout != "kept\nsleeper\n" {
		t.Errorf("resumed from disk after envd changed: %+v", res)
	}
	restored := s.create(map[string]any{"templateID": snap.SnapshotID})
	if res := s.exec(restored.SandboxID, client.ExecuteRequest{Command: check}); res.Stdout != "kept\nsleeper\n" {
		t.Errorf("created from the snapshot after envd changed: %+v", res)
	}
	fresh := s.create(nil)
	if res := s.exec(fresh.SandboxID, client.ExecuteRequest{Command: "echo new"}); res.Stdout != "new\n" {
		t.Errorf("a new sandbox on the new envd: %+v", res)
	}

	// The warm snapshot of the old build is retired and another made with
	// the new one; the sandbox made from the old one resumes with its kernel.
	ci2 := createCodeInterpreter(t, s)
	ex, err := s.api.CodeInterpreter(ci2.SandboxID, ci2.EnvdAccessToken).RunCode(t.Context(),
		client.RunCodeRequest{Code: "'pandas' in __import__('sys').modules"}, nil)
	if err != nil || ex.Text() != "True" {
		t.Errorf("a code interpreter sandbox after the upgrade: %+v, %v", ex, err)
	}
	s.expect(s.do("POST", "/sandboxes/"+ci.SandboxID+"/resume", map[string]any{}), 201, "resume")
	ex, err = s.api.CodeInterpreter(ci.SandboxID, ci.EnvdAccessToken).RunCode(t.Context(),
		client.RunCodeRequest{Code: "x"}, nil)
	if err != nil || ex.Text() != "5" {
		t.Errorf("the kernel of a sandbox of the retired snapshot: %+v, %v", ex, err)
	}
	templates, err := s.api.ListTemplates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var retired, warm int
	for _, tpl := range templates {
		switch {
		case strings.HasPrefix(tpl.Name, "code-interpreter-v1-retired-"):
			retired++
		case tpl.Name == "code-interpreter-v1":
			warm++
		}
	}
	if retired != 1 || warm != 1 {
		t.Errorf("templates %+v: want one retired warm snapshot and one current", templates)
	}

	// The restores of the old build's images pinned it again.
	pinned, err := os.ReadDir(filepath.Join(s.dataDir, "envd"))
	if err != nil || len(pinned) != 2 {
		t.Errorf("pinned envd builds: %v, %v; want the two", pinned, err)
	}
	if _, err := os.Stat(oldPinned); err != nil {
		t.Errorf("the old build, pinned again: %v", err)
	}
}

// fileDigest is the hex SHA-256 of the file at p.
func fileDigest(p string) (string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}
