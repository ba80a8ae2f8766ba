package integration

import (
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestImageTmpSymlink: an image whose /tmp is a symlink (as some
// distributions ship it) makes a template whose sandboxes start, and /tmp
// behaves as under Docker: the link is kept, and what is written to /tmp
// lands where it points. gVisor cannot start over a link to nowhere, so
// the template gets the directory it leads to (inside its rootfs); a link
// that loops is refused, naming /tmp, and so is a sandbox of a template
// made before aenv made the missing directory.
func TestImageTmpSymlink(t *testing.T) {
	t.Parallel()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	regHost := strings.TrimPrefix(reg.URL, "http://")
	base := smallBaseLayer(t)
	// What is written to /tmp stays in the root filesystem's overlay, as
	// for an image whose /tmp is a directory: no tmpfs over the link's
	// target, so that pausing without memory keeps it.
	const write = "echo hi > /tmp/f && cat /tmp/f && readlink /tmp && cat /var/tmp/f && " +
		"awk '$2 == \"/tmp\" || $2 == \"/var/tmp\"' /proc/mounts"
	images := []struct {
		name     string
		entries  []tarEntry
		command  string
		wantExec string
		wantErr  string // the template is refused, with this in the message
		// unmake is removed from the template's rootfs after the pull, as
		// a template made before aenv made /tmp's target lacks it: its
		// sandboxes are refused with 400 and wantCreate in the message.
		unmake, wantCreate string
	}{
		{name: "abs", entries: []tarEntry{symlinkEntry("tmp", "/var/tmp")},
			command: write, wantExec: "hi\n/var/tmp\nhi\n"},
		{name: "rel", entries: []tarEntry{symlinkEntry("tmp", "var/tmp")},
			command: write, wantExec: "hi\nvar/tmp\nhi\n"},
		// Absolute or not, the link resolves inside the sandbox's root.
		{name: "rel-escaping", entries: []tarEntry{symlinkEntry("tmp", strings.Repeat("../", 16)+"var/tmp")},
			command: "echo hi > /tmp/f && cat /var/tmp/f", wantExec: "hi\n"},
		// gVisor cannot start over a /tmp that leads nowhere: the template
		// gets the directory it leads to.
		{name: "dangling", entries: []tarEntry{symlinkEntry("tmp", "/nowhere/tmp")},
			command: "readlink /tmp; echo hi > /tmp/f && cat /nowhere/tmp/f", wantExec: "/nowhere/tmp\nhi\n"},
		{name: "to-file", entries: []tarEntry{fileEntry("tmpfile", "x"), symlinkEntry("tmp", "/tmpfile")},
			command: "readlink /tmp; cat /tmp", wantExec: "/tmpfile\nx"},
		{name: "dangling-made-before", entries: []tarEntry{symlinkEntry("tmp", "/nowhere/tmp")},
			unmake: "nowhere", wantCreate: `/tmp is a symlink to "/nowhere/tmp", which does not exist`},
		{name: "loop", entries: []tarEntry{symlinkEntry("tmp", "/tmp")}, wantErr: `/tmp is a symlink to "/tmp", which loops`},
	}
	for _, im := range images {
		img := mustAppend(t, mustAppend(t, empty.Image, base), hostileLayer(t, im.entries))
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cfg = cfg.DeepCopy()
		cfg.OS, cfg.Architecture = "linux", "amd64"
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			t.Fatal(err)
		}
		push(t, regHost+"/tmplink/"+im.name+":1", img)
	}

	s := newServer(t)
	s.start()
	for _, im := range images {
		t.Run(im.name, func(t *testing.T) {
			name := "tmplink-" + im.name
			tplID, errMsg := s.pullImage(regHost+"/tmplink/"+im.name+":1", name)
			if im.wantErr != "" {
				if !strings.Contains(errMsg, im.wantErr) {
					t.Fatalf("pull: template %q, error %q; want it refused with %q", tplID, errMsg, im.wantErr)
				}
				return
			}
			if errMsg != "" {
				t.Fatalf("pull: %s", errMsg)
			}
			if im.unmake != "" {
				if err := os.RemoveAll(filepath.Join(s.dataDir, "templates", tplID, "rootfs", im.unmake)); err != nil {
					t.Fatal(err)
				}
			}
			r := s.do("POST", "/sandboxes", map[string]any{"templateID": name})
			if im.wantCreate != "" {
				var e struct{ Message string }
				if r.status != 400 || json.Unmarshal(r.body, &e) != nil || !strings.Contains(e.Message, im.wantCreate) {
					t.Fatalf("create: status %d, body %s; want 400 with %q", r.status, truncate(r.body), im.wantCreate)
				}
				return
			}
			if r.status != 201 {
				t.Fatalf("create: status %d, body %s", r.status, truncate(r.body))
			}
			var sb client.Sandbox
			r.json(t, &sb)
			defer s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil)
			res := s.exec(sb.SandboxID, client.ExecuteRequest{Command: im.command})
			if res.Stdout != im.wantExec {
				t.Errorf("in the sandbox, %q: exit %d, stdout %q, stderr %q; want %q",
					im.command, res.ExitCode, res.Stdout, res.Stderr, im.wantExec)
			}
		})
	}
}
