package integration

import (
	"archive/tar"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/aenv-dev/aenv/internal/client"
)

// cli runs the real aenv binary against s and returns its output and
// exit code.
func (s *server) cli(args ...string) (string, int) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "aenv"), args...)
	cmd.Env = append(os.Environ(), "AENV_URL="+s.url, "AENV_API_KEY="+apiKey, "HOME="+s.t.TempDir())
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("aenv %v: %v", args, err)
	}
	return string(out), code
}

func (s *server) cliOK(args ...string) string {
	s.t.Helper()
	out, code := s.cli(args...)
	if code != 0 {
		s.t.Fatalf("aenv %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// pushTestImages serves two images from an in-process OCI registry on
// loopback: "base" (the Debian base rootfs as one layer) and "app" (base
// plus a layer with a file, a whiteout and Env/WorkingDir/User).
func pushTestImages(t *testing.T) (registryHost string) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	rootfs := baseRootfs(t)
	layerTar := filepath.Join(t.TempDir(), "base.tar")
	if err := tarDir(rootfs, layerTar, imageOmits); err != nil {
		t.Fatal(err)
	}
	baseLayer, err := tarball.LayerFromFile(layerTar, tarball.WithMediaType(types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	base, err := mutate.AppendLayers(empty.Image, baseLayer)
	if err != nil {
		t.Fatal(err)
	}
	push(t, host+"/test/base:1", base)

	appTar := filepath.Join(t.TempDir(), "app.tar")
	writeTar(t, appTar, map[string]string{
		"srv/app/hello.txt":   "from the app layer\n",
		"etc/.wh.motd":        "", // whiteout: removes /etc/motd of the base
		"srv/app/.keep-owner": "",
	})
	appLayer, err := tarball.LayerFromFile(appTar, tarball.WithMediaType(types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	app, err := mutate.AppendLayers(base, appLayer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := app.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.Config.Env = []string{"APP_MODE=test", "PATH=/usr/local/bin:/usr/bin:/bin"}
	cfg.Config.WorkingDir = "/srv/app"
	cfg.Config.User = "1000"
	app, err = mutate.ConfigFile(app, cfg)
	if err != nil {
		t.Fatal(err)
	}
	push(t, host+"/test/app:1", app)
	return host
}

func push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// imageOmits are the base rootfs's largest trees that no image test uses
// (translations, documentation, perl, python, git): two thirds of its
// ~300 MB, which every image test would otherwise push, pull and unpack.
var imageOmits = []string{
	"usr/share/locale", "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/perl", "usr/share/zoneinfo",
	"usr/lib/python3.11", "usr/lib/git-core", "usr/lib/x86_64-linux-gnu/perl", "usr/lib/x86_64-linux-gnu/gconv",
	"usr/bin/python3.11", "usr/bin/perl", "usr/bin/git", "usr/bin/scalar", "usr/bin/git-shell",
}

// tarDir writes the tree at dir as an uncompressed tar to out, leaving out
// the paths (relative to dir) in omit.
func tarDir(dir, out string, omit []string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if slices.Contains(omit, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil // sockets and the like: not in an image
		}
		hdr.Name = rel
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			defer src.Close()
			if _, err := io.Copy(tw, src); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func writeTar(t *testing.T, out string, files map[string]string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "srv/app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000})
	for n, content := range files {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content)), Uid: 1000, Gid: 1000})
		tw.Write([]byte(content))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCLIAndImageTemplates drives the real aenv CLI against the real
// server: pull two OCI images (sharing a layer) from a registry on
// loopback, start sandboxes from them, exec, cp, fork, snapshot, pause,
// resume, delete, with table and JSON output and meaningful exit codes.
func TestCLIAndImageTemplates(t *testing.T) {
	t.Parallel()
	host := pushTestImages(t)
	s := newServer(t)
	s.start()

	out := s.cliOK("pull", host+"/test/base:1", "--name", "imgbase")
	if !strings.Contains(out, "downloaded") {
		t.Fatalf("pull shows no progress:\n%s", out)
	}
	var pulled map[string]any
	if err := json.Unmarshal([]byte(s.cliOK("pull", host+"/test/app:1", "--name", "app", "-o", "json", "-q")), &pulled); err != nil {
		t.Fatalf("pull -o json: %v", err)
	}
	if pulled["templateID"] == nil {
		t.Fatalf("pull -o json: %v", pulled)
	}
	// The shared base layer is stored once.
	layers, _ := filepath.Glob(filepath.Join(s.dataDir, "layers", "sha256", "*"))
	if len(layers) != 2 {
		t.Fatalf("layer store holds %d blobs, want 2 (base shared + app)", len(layers))
	}
	if _, code := s.cli("pull", host+"/test/missing:1", "--name", "nope", "-q"); code != 3 {
		t.Fatalf("pull of a missing image: exit %d, want 3", code)
	}
	if _, code := s.cli("pull", "Not A Reference!!", "--name", "nope", "-q"); code == 0 {
		t.Fatal("pull of a bad reference succeeded")
	}
	tls := s.cliOK("template", "ls")
	for _, want := range []string{"base", "imgbase", "app"} {
		if !strings.Contains(tls, want) {
			t.Fatalf("template ls lacks %s:\n%s", want, tls)
		}
	}

	id := strings.TrimSpace(s.cliOK("start", "app", "--detach"))
	if len(id) != 20 {
		t.Fatalf("start --detach printed %q", id)
	}
	// The image's defaults apply: user 1000 (named "user" in the base),
	// its WorkingDir and Env; the whiteout removed /etc/motd.
	out = s.cliOK("exec", id, "sh", "-c", "whoami; pwd; echo $APP_MODE; cat hello.txt; ls /etc/motd 2>&1 || true")
	for _, want := range []string{"user\n", "/srv/app\n", "test\n", "from the app layer\n", "No such file"} {
		if !strings.Contains(out, want) {
			t.Fatalf("exec in image sandbox lacks %q:\n%s", want, out)
		}
	}
	if _, code := s.cli("exec", id, "sh", "-c", "exit 7"); code != 7 {
		t.Fatalf("exec exit code %d, want 7", code)
	}

	local := filepath.Join(t.TempDir(), "local.txt")
	os.WriteFile(local, []byte("copied in\n"), 0o644)
	s.cliOK("cp", local, id+":/tmp/in.txt")
	back := filepath.Join(t.TempDir(), "back.txt")
	s.cliOK("cp", id+":/tmp/in.txt", back)
	if b, _ := os.ReadFile(back); string(b) != "copied in\n" {
		t.Fatalf("cp round trip: %q", b)
	}

	var listed []map[string]any
	if err := json.Unmarshal([]byte(s.cliOK("ls", "-o", "json")), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("ls -o json: %v %v", listed, err)
	}
	forkOut := s.cliOK("fork", id, "-n", "2")
	children := strings.Fields(forkOut)
	if len(children) != 2 {
		t.Fatalf("fork printed %q", forkOut)
	}
	if out := s.cliOK("exec", children[0], "cat", "/tmp/in.txt"); out != "copied in\n" {
		t.Fatalf("fork child: %q", out)
	}
	s.cliOK("snapshot", "create", id, "--name", "cli-snap")
	if out := s.cliOK("snapshot", "ls"); !strings.Contains(out, "cli-snap") {
		t.Fatalf("snapshot ls:\n%s", out)
	}
	fromSnap := strings.TrimSpace(s.cliOK("start", "cli-snap", "--detach"))
	if out := s.cliOK("exec", fromSnap, "cat", "/tmp/in.txt"); out != "copied in\n" {
		t.Fatalf("start from snapshot: %q", out)
	}
	s.cliOK("pause", id)
	if st := s.state(id); st != "paused" {
		t.Fatalf("state after aenv pause: %s", st)
	}
	s.cliOK("resume", id)
	s.cliOK("timeout", id, "600")
	s.cliOK("snapshot", "rm", "cli-snap")
	s.cliOK("delete", id, children[0], children[1], fromSnap)
	if _, code := s.cli("delete", id); code != 3 {
		t.Fatalf("delete of a deleted sandbox: exit %d, want 3", code)
	}
	if _, code := s.cli("exec", "nosuchsandbox0000000", "true"); code != 3 {
		t.Fatalf("exec in unknown sandbox: exit %d, want 3", code)
	}
	if _, code := s.cli("ls", "--api-key", "wrong"); code != 4 {
		t.Fatalf("bad key: exit %d, want 4", code)
	}
	if _, code := s.cli("ls", "--url", "http://127.0.0.1:1"); code != 5 {
		t.Fatalf("unreachable server: exit %d, want 5", code)
	}
	s.cliOK("template", "rm", "app")
	if _, err := os.Stat(filepath.Join(s.dataDir, "templates", pulled["templateID"].(string))); !os.IsNotExist(err) {
		t.Fatalf("removed template's rootfs kept: %v", err)
	}
}

// TestCLIInteractiveShell drives `aenv start` through a real
// pseudo-terminal: type commands, read their output, resize the window,
// interrupt a command with Ctrl-C, and exit.
func TestCLIInteractiveShell(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	cmd := exec.Command(filepath.Join(binDir, "aenv"), "start", "base", "--rm")
	cmd.Env = append(os.Environ(), "AENV_URL="+s.url, "AENV_API_KEY="+apiKey, "HOME="+t.TempDir(), "TERM=xterm")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var mu sync.Mutex
	var screen strings.Builder
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waitScreen := func(what string) {
		t.Helper()
		waitFor(t, 30*time.Second, "terminal shows "+what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return strings.Contains(screen.String(), what)
		})
	}
	send := func(keys string) {
		t.Helper()
		if _, err := tty.Write([]byte(keys)); err != nil {
			t.Fatal(err)
		}
	}
	send("echo hello-$((6*7))\r")
	waitScreen("hello-42")
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 33, Cols: 101}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // SIGWINCH reaches aenv, aenv resizes the remote pty
	send("stty size\r")
	waitScreen("33 101")
	// The markers are computed by the shell, so the echoed command lines
	// do not contain them.
	send("sleep 100; echo not-$((1+1))-interrupted\r")
	time.Sleep(time.Second)
	send("\x03")
	send("echo after-$((2+2))-ctrl-c\r")
	waitScreen("after-4-ctrl-c")
	mu.Lock()
	interrupted := !strings.Contains(screen.String(), "not-2-interrupted")
	mu.Unlock()
	if !interrupted {
		t.Fatal("Ctrl-C did not interrupt the remote command")
	}
	send("exit 0\r")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("aenv start exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("aenv start did not exit after the shell did")
	}
	// --rm: the sandbox is gone.
	var list []client.Sandbox
	s.expect(s.do("GET", "/v2/sandboxes", nil), 200, "list").json(t, &list)
	if len(list) != 0 {
		t.Fatalf("sandboxes left after aenv start --rm: %+v", list)
	}
}
