package release

import (
	"archive/tar"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/pflag"

	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/roottest"
)

var created = time.Unix(1700000000, 0)

// fakeBins makes a bin dir with stand-ins for aenv, envd and runsc, and
// a CA bundle.
func fakeBins(t *testing.T) Inputs {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []string{"aenv", "envd", "runsc"} {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!binary "+b), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Inputs{BinDir: dir, CACerts: ca, Version: "v1.2.3", Repository: "registry.test/aenv", Created: created}
}

// entries reads the image's filesystem as it would be unpacked (all
// layers applied): name → header, and the contents of regular files.
func entries(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdrs, data := map[string]*tar.Header{}, map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimSuffix(h.Name, "/")
		hdrs[n] = h
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			data[n] = string(b)
		}
	}
	return hdrs, data
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func configName(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestGatewayImage(t *testing.T) {
	in := fakeBins(t)
	img, err := Build(GatewaySpec(in), created, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The same inputs, built again elsewhere, give the same image.
	again, err := Build(GatewaySpec(in), created, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, img) != digest(t, again) {
		t.Fatalf("two builds differ: %s and %s", digest(t, img), digest(t, again))
	}
	later, err := Build(GatewaySpec(in), created.Add(time.Hour), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, later) == digest(t, img) {
		t.Fatal("the build time does not reach the image")
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/aenv gateway" ||
		!cf.Created.Time.Equal(created) || cf.OS != "linux" {
		t.Errorf("config: user %q entrypoint %v created %v os %s", cf.Config.User, cf.Config.Entrypoint, cf.Created, cf.OS)
	}
	if _, ok := cf.Config.ExposedPorts["8000/tcp"]; !ok || cf.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("config: ports %v labels %v", cf.Config.ExposedPorts, cf.Config.Labels)
	}

	hdrs, data := entries(t, img)
	for _, tc := range []struct {
		name string
		mode int64
	}{
		{"usr/local/bin/aenv", 0o755},
		{"etc/ssl/certs/ca-certificates.crt", 0o644},
		{"etc/passwd", 0o644},
		{"tmp", 0o1777},
		{"usr", 0o755},
		{"usr/local", 0o755},
	} {
		h, ok := hdrs[tc.name]
		if !ok {
			t.Errorf("%s missing", tc.name)
			continue
		}
		if h.Mode != tc.mode || h.Uid != 0 || h.Uname != "" || !h.ModTime.Equal(created) {
			t.Errorf("%s: mode %o uid %d uname %q time %v", tc.name, h.Mode, h.Uid, h.Uname, h.ModTime)
		}
	}
	if data["usr/local/bin/aenv"] != "#!binary aenv" {
		t.Errorf("aenv in the image: %q", data["usr/local/bin/aenv"])
	}
	if !strings.Contains(data["etc/passwd"], "nonroot:x:65532:65532:") {
		t.Errorf("passwd: %q", data["etc/passwd"])
	}
	if _, ok := hdrs["usr/local/bin/envd"]; ok {
		t.Error("the gateway image carries envd, which it never runs")
	}
}

// The node image is the Debian base with aenv on top: the base's links,
// hard links and modes kept, what runtimes mount over left empty, and
// sockets (made by what ran in the tree) left out.
func TestNodeImageOverBase(t *testing.T) {
	in := fakeBins(t)
	base := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "usr/bin", "dev/pts", "proc/1", "sys/kernel", "run"} {
		must(os.MkdirAll(filepath.Join(base, d), 0o755))
	}
	must(os.WriteFile(filepath.Join(base, "etc/os-release"), []byte("ID=debian\n"), 0o644))
	must(os.WriteFile(filepath.Join(base, "usr/bin/su"), []byte("su"), 0o755))
	must(os.Chmod(filepath.Join(base, "usr/bin/su"), os.ModeSetuid|0o755))
	must(os.Link(filepath.Join(base, "usr/bin/su"), filepath.Join(base, "usr/bin/su2")))
	must(os.Symlink("usr/bin", filepath.Join(base, "bin")))
	must(os.WriteFile(filepath.Join(base, "proc/1/status"), []byte("x"), 0o644))
	l, err := net.Listen("unix", filepath.Join(base, "run/socket"))
	must(err)
	defer l.Close()
	in.NodeBase = base

	img, err := Build(NodeSpec(in), created, t.TempDir())
	must(err)
	hdrs, data := entries(t, img)
	if data["etc/os-release"] != "ID=debian\n" || data["usr/local/bin/runsc"] != "#!binary runsc" {
		t.Errorf("files: os-release %q runsc %q", data["etc/os-release"], data["usr/local/bin/runsc"])
	}
	if h := hdrs["bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
		t.Errorf("symlink bin: %+v", h)
	}
	if h := hdrs["usr/bin/su"]; h == nil || h.Mode&0o4000 == 0 {
		t.Errorf("setuid bit lost: %+v", h)
	}
	if h := hdrs["usr/bin/su2"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/su" {
		t.Errorf("hard link: %+v", h)
	}
	for _, d := range []string{"dev", "proc", "sys"} {
		if hdrs[d] == nil {
			t.Errorf("%s missing", d)
		}
	}
	for _, gone := range []string{"dev/pts", "proc/1", "proc/1/status", "sys/kernel", "run/socket"} {
		if hdrs[gone] != nil {
			t.Errorf("%s is in the image", gone)
		}
	}
	cf, err := img.ConfigFile()
	must(err)
	if _, ok := cf.Config.Volumes["/var/lib/aenv"]; !ok || cf.Config.User != "" ||
		strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/aenv node" {
		t.Errorf("node config: volumes %v user %q entrypoint %v", cf.Config.Volumes, cf.Config.User, cf.Config.Entrypoint)
	}
	if h := hdrs["var/lib/aenv"]; h == nil || h.Mode != 0o700 {
		t.Errorf("data dir: %+v", h)
	}
}

// Write gives an OCI layout naming each image, and tarballs that load as
// the same images.
func TestWriteLayoutAndTarballs(t *testing.T) {
	in := fakeBins(t)
	in.NodeBase = t.TempDir()
	if err := os.MkdirAll(filepath.Join(in.NodeBase, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	images, err := BuildAll(in, t.TempDir())
	if err != nil || len(images) != 2 {
		t.Fatalf("build: %d images, %v", len(images), err)
	}
	out := t.TempDir()
	if err := Write(out, images); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string]v1.Hash{}
	for _, d := range m.Manifests {
		refs[d.Annotations["org.opencontainers.image.ref.name"]] = d.Digest
	}
	for _, b := range images {
		want := digest(t, b.Image)
		if refs[b.Ref.String()] != want {
			t.Errorf("layout: %s is %v, want %v (%v)", b.Ref, refs[b.Ref.String()], want, refs)
		}
		tag, err := name.NewTag(b.Ref.String())
		if err != nil {
			t.Fatal(err)
		}
		loaded, err := tarball.ImageFromPath(filepath.Join(out, filepath.Base(b.Ref.RepositoryStr())+".tar"), &tag)
		if err != nil {
			t.Fatal(err)
		}
		// A tarball holds Docker's manifest form: the same config (and so
		// the same layers, by their diff IDs) under another manifest.
		if got, want := configName(t, loaded), configName(t, b.Image); got != want {
			t.Errorf("tarball of %s loads with config %v, want %v", b.Ref, got, want)
		}
	}
	if refs["registry.test/aenv/aenv-gateway:v1.2.3"] == (v1.Hash{}) || refs["registry.test/aenv/aenv-node:v1.2.3"] == (v1.Hash{}) {
		t.Errorf("names in the layout: %v", refs)
	}
}

// The gateway image's filesystem runs the real aenv as its unprivileged
// user, with nothing else in it (the binary is static).
func TestGatewayImageRuns(t *testing.T) {
	roottest.Require(t)
	bin := os.Getenv("AENV_BIN_DIR")
	if bin == "" {
		roottest.SkipOrFail(t, "AENV_BIN_DIR (with the static aenv) is not set")
	}
	in := Inputs{BinDir: bin, CACerts: "/etc/ssl/certs/ca-certificates.crt", Version: "test",
		Repository: "registry.test/aenv", Created: created}
	if _, err := os.Stat(in.CACerts); err != nil {
		in.CACerts = fakeBins(t).CACerts
	}
	img, err := Build(GatewaySpec(in), created, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode).Perm())
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(f, tr)
			f.Close()
		}
	}
	out, err := exec.Command("chroot", "--userspec=65532:65532", root, "/usr/local/bin/aenv", "gateway", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--database-url") {
		t.Fatalf("aenv gateway --help in the image as nonroot: %v\n%s", err, out)
	}
}

// The images' AENV_* settings are flags of the commands they run.
func TestImageSettingsAreFlags(t *testing.T) {
	in := fakeBins(t)
	srv, cl, gw := config.Default(), config.DefaultCluster(), config.Gateway{}
	node := pflag.NewFlagSet("node", pflag.ContinueOnError)
	srv.RegisterFlags(node)
	cl.RegisterFlags(node)
	gateway := pflag.NewFlagSet("gateway", pflag.ContinueOnError)
	gw.RegisterFlags(gateway)
	for _, tc := range []struct {
		spec  Spec
		flags *pflag.FlagSet
	}{{NodeSpec(in), node}, {GatewaySpec(in), gateway}} {
		known := map[string]bool{}
		tc.flags.VisitAll(func(f *pflag.Flag) { known[config.EnvName(f.Name)] = true })
		for _, e := range tc.spec.Env {
			k, _, _ := strings.Cut(e, "=")
			if strings.HasPrefix(k, "AENV_") && !known[k] {
				t.Errorf("the %s image sets %s, which is no flag of aenv %s", tc.flags.Name(), k, tc.flags.Name())
			}
		}
	}
}
