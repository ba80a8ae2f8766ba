package integration

import (
	"github.com/aenv-dev/aenv/internal/client"

	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// hostPasswd is the host file a hostile image points its /etc/passwd at.
const hostPasswd = "root:x:0:0:root:/host-root:/bin/bash\nhostuser:x:4242:4242::/home/hostuser-from-host:/bin/sh\n"

// TestHostileImagesStayInRootfs pulls images whose layers aim symlinks and
// device nodes at the host through the real API, and checks that building
// their templates wrote nothing outside the template rootfs, read nothing
// from the host, and made no device node; a sandbox from such an image
// still starts, and its user comes from the image.
func TestHostileImagesStayInRootfs(t *testing.T) {
	t.Parallel()
	host := t.TempDir() // what the images aim at
	for _, d := range []string{"abs-target", "rel-target"} {
		if err := os.Mkdir(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "passwd"), []byte(hostPasswd), 0o644); err != nil {
		t.Fatal(err)
	}

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	regHost := strings.TrimPrefix(reg.URL, "http://")
	base := smallBaseLayer(t)
	// From the rootfs, enough ".." to reach / whatever the data dir's depth.
	up := strings.Repeat("../", 64)
	imagePasswd := "root:x:0:0:root:/root:/bin/bash\nimguser:x:4242:4242::/home/imguser:/bin/sh\n"
	images := []struct {
		name     string
		onBase   bool
		user     string
		entries  []tarEntry
		sandbox  string // if set: a command run in a sandbox from the template, and its expected output
		wantExec string
	}{
		{name: "aenv-abs", onBase: true, entries: []tarEntry{symlinkEntry(".aenv", filepath.Join(host, "abs-target"))},
			sandbox: "test -f /.aenv/envd && test ! -L /.aenv && echo mounted", wantExec: "mounted\n"},
		{name: "aenv-rel", entries: []tarEntry{symlinkEntry(".aenv", up+strings.TrimPrefix(host, "/")+"/rel-target")}},
		{name: "aenv-dangling", entries: []tarEntry{symlinkEntry(".aenv", filepath.Join(host, "dangling"))}},
		{name: "envd-dangling", entries: []tarEntry{dirEntry(".aenv/"),
			symlinkEntry(".aenv/envd", filepath.Join(host, "dangling-envd"))}},
		// /etc/passwd is an absolute link to the host's path, where the
		// image has a file of its own: in the sandbox the link resolves to
		// the image's file, and so must it when the server reads it.
		{name: "passwd", onBase: true, user: "4242", entries: []tarEntry{
			symlinkEntry("etc/passwd", filepath.Join(host, "passwd")),
			fileEntry(strings.TrimPrefix(filepath.Join(host, "passwd"), "/"), imagePasswd),
			{hdr: tar.Header{Name: "home/imguser/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 4242, Gid: 4242}},
		}, sandbox: "id -un; pwd", wantExec: "imguser\n/home/imguser\n"},
		{name: "passwd-dangling", user: "4242", entries: []tarEntry{
			dirEntry("etc/"), symlinkEntry("etc/passwd", filepath.Join(host, "passwd")),
		}},
		{name: "devices", entries: []tarEntry{
			dirEntry("dev/"),
			{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8, Devminor: 0}},
			{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
			{hdr: tar.Header{Name: "mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1}},
		}},
	}
	for _, im := range images {
		img := empty.Image
		if im.onBase {
			img = mustAppend(t, img, base)
		}
		img = mustAppend(t, img, hostileLayer(t, im.entries))
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cfg = cfg.DeepCopy()
		cfg.OS, cfg.Architecture, cfg.Config.User = "linux", "amd64", im.user
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			t.Fatal(err)
		}
		push(t, regHost+"/hostile/"+im.name+":1", img)
	}

	s := newServer(t)
	s.start()
	for _, im := range images {
		t.Run(im.name, func(t *testing.T) {
			tplID, errMsg := s.pullImage(regHost+"/hostile/"+im.name+":1", "hostile-"+im.name)
			if errMsg != "" {
				t.Fatalf("pull: %s", errMsg)
			}
			rootfs := filepath.Join(s.dataDir, "templates", tplID, "rootfs")
			checkHostUntouched(t, host)
			// Setuid programs of an image are out of host users' reach.
			if fi, err := os.Stat(filepath.Dir(rootfs)); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("template directory: %v, %v; want mode 700", fi, err)
			}
			for _, p := range []string{".aenv", ".aenv/envd"} {
				fi, err := os.Lstat(filepath.Join(rootfs, p))
				if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
					t.Errorf("template rootfs %s: %v, %v; want a real file or directory", p, fi, err)
				}
			}
			filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Type()&(fs.ModeDevice|fs.ModeCharDevice) != 0 {
					t.Errorf("device node on the host: %s", p)
				}
				return nil
			})
			if im.sandbox == "" {
				return
			}
			sb := s.create(map[string]any{"templateID": "hostile-" + im.name})
			defer s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil)
			res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: im.sandbox})
			if res.ExitCode != 0 || res.Stdout != im.wantExec {
				t.Errorf("in the sandbox, %q: exit %d, stdout %q, stderr %q; want %q",
					im.sandbox, res.ExitCode, res.Stdout, res.Stderr, im.wantExec)
			}
		})
	}
	// passwd-dangling has no passwd of its own: its user is root, whose
	// home the server cannot know, rather than the host's user.
	if logs := s.logs.String(); strings.Contains(logs, "hostuser") {
		t.Errorf("the server took a user from the host's passwd:\n%s", tail(logs, 40))
	}
}

// TestImagePullRefusesPrivateRegistries: without --allow-private-registries
// a client cannot make the server fetch from this host (its own API, here)
// or a registry on loopback, by address or by name, and no reply body is
// passed back.
func TestImagePullRefusesPrivateRegistries(t *testing.T) {
	t.Parallel()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	regHost := strings.TrimPrefix(reg.URL, "http://")
	push(t, regHost+"/ok/img:1", mustAppend(t, empty.Image, hostileLayer(t, []tarEntry{fileEntry("f", "x")})))
	_, regPort, _ := strings.Cut(regHost, ":")

	s := newServer(t, "--allow-private-registries=false")
	s.start()
	_, apiPort, _ := strings.Cut(s.addr, ":")
	for i, ref := range []string{
		s.addr + "/sandboxes:latest",
		"localhost:" + apiPort + "/sandboxes:latest",
		regHost + "/ok/img:1",
		"localhost:" + regPort + "/ok/img:1",
	} {
		t.Run(ref, func(t *testing.T) {
			tplID, errMsg := s.pullImage(ref, "private-"+string(rune('a'+i)))
			if tplID != "" || !strings.Contains(errMsg, "refused") {
				t.Fatalf("pull %s: template %q, error %q; want it refused", ref, tplID, errMsg)
			}
			if strings.Contains(errMsg, "{") {
				t.Errorf("error repeats a reply: %q", errMsg)
			}
		})
	}
}

// pullImage builds a template from ref through POST /templates and returns
// its ID, or the error message of the stream's final line.
func (s *server) pullImage(ref, name string) (templateID, errMsg string) {
	s.t.Helper()
	r := s.expect(s.do("POST", "/templates", map[string]any{"image": ref, "name": name}), 200, "pull "+ref)
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	var last struct {
		TemplateID string `json:"templateID"`
		Error      *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		s.t.Fatalf("pull %s: last line %q: %v", ref, lines[len(lines)-1], err)
	}
	if last.Error != nil {
		return "", last.Error.Message
	}
	return last.TemplateID, ""
}

// checkHostUntouched fails t if the host directory the images aim at holds
// anything but what the test put there.
func checkHostUntouched(t *testing.T, host string) {
	t.Helper()
	var found []string
	filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != host {
			rel, _ := filepath.Rel(host, p)
			found = append(found, rel)
		}
		return nil
	})
	if want := []string{"abs-target", "passwd", "rel-target"}; !slices.Equal(found, want) {
		t.Errorf("host directory holds %v, want %v", found, want)
	}
	if b, err := os.ReadFile(filepath.Join(host, "passwd")); err != nil || string(b) != hostPasswd {
		t.Errorf("host passwd changed: %q, %v", b, err)
	}
}

type tarEntry struct {
	hdr  tar.Header
	body string
}

func fileEntry(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, body: body}
}

func dirEntry(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}

func symlinkEntry(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}

// hostileLayer makes an uncompressed layer of entries, in order.
func hostileLayer(t *testing.T, entries []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		hdr.Size = int64(len(e.body))
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return tarLayer(t, buf.Bytes())
}

// smallBaseLayer is a layer of the base rootfs's shell, the few tools the
// image tests run in their sandboxes, the libraries those load, and the
// accounts files: a few MB where the whole rootfs (baseLayer) is ~300 MB
// pushed, pulled and unpacked once per image.
func smallBaseLayer(t *testing.T) v1.Layer {
	t.Helper()
	root := baseRootfs(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	added := map[string]bool{}
	// add puts rel (a path in root) in the layer after its parents,
	// following a symlink to what it names and an ELF file to the
	// libraries and interpreter it needs.
	var add func(rel string)
	add = func(rel string) {
		rel = strings.TrimPrefix(filepath.Clean("/"+rel), "/")
		if rel == "" || added[rel] {
			return
		}
		add(filepath.Dir(rel))
		// A parent may itself be a link (bin -> usr/bin): the entry goes
		// where the link leads.
		if dir := filepath.Dir(rel); dir != "." {
			if real, err := filepath.EvalSymlinks(filepath.Join(root, dir)); err == nil {
				if r, err := filepath.Rel(root, real); err == nil && r != dir {
					added[rel] = true
					add(filepath.Join(r, filepath.Base(rel)))
					return
				}
			}
		}
		added[rel] = true
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				t.Fatal(err)
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			t.Fatal(err)
		}
		hdr.Name, hdr.Uname, hdr.Gname = rel, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		switch {
		case link != "":
			if !filepath.IsAbs(link) {
				link = filepath.Join(filepath.Dir(rel), link)
			}
			add(link)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(b); err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(b))
			if err != nil {
				return // not a program
			}
			libs, _ := f.ImportedLibraries()
			for _, lib := range libs {
				add("usr/lib/x86_64-linux-gnu/" + lib)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					interp, _ := io.ReadAll(prog.Open())
					add(strings.TrimRight(string(interp), "\x00"))
				}
			}
		}
	}
	for _, rel := range []string{"bin", "lib", "lib64", "sbin", "etc/passwd", "etc/group", "root", "home/user",
		"tmp", "var/tmp", "usr/bin/bash", "usr/bin/sh", "usr/bin/cat", "usr/bin/readlink", "usr/bin/awk", "usr/bin/id"} {
		add(rel)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return tarLayer(t, buf.Bytes())
}

// tarLayer is an uncompressed layer of the tar b.
func tarLayer(t *testing.T, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustAppend(t *testing.T, img v1.Image, l v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
