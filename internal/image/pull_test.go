package image

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// loopbackOK lets pulls reach the test registry on loopback.
var loopbackOK = RegistryPolicy{AllowPrivate: true}

func storedBlobs(t *testing.T, layerDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(layerDir, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, "sha256:"+e.Name())
	}
	return out
}

func TestPullStoresLayersOnceAndReportsProgress(t *testing.T) {
	reg := testRegistry(t)
	base := layer(t, dir("etc/"), file("etc/os-release", "ID=test\n"))
	appA := layer(t, file("app/a", "a"))
	appB := layer(t, file("app/b", "b"))
	cfg := v1.Config{Env: []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "EMPTY="}, WorkingDir: "/app", User: "1000:1000"}
	push(t, reg+"/test/a:1", buildImage(t, "linux/amd64", cfg, base, appA))
	push(t, reg+"/test/b:1", buildImage(t, "linux/amd64", v1.Config{}, base, appB))

	layerDir := t.TempDir()
	var events []Progress
	imgA, err := Pull(context.Background(), reg+"/test/a:1", PullOptions{LayerDir: layerDir, Registries: loopbackOK,
		Progress: func(p Progress) { events = append(events, p) }})
	if err != nil {
		t.Fatal(err)
	}
	wantDefaults := Defaults{Env: map[string]string{"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "EMPTY": ""},
		WorkingDir: "/app", User: "1000:1000"}
	if imgA.Defaults.WorkingDir != wantDefaults.WorkingDir || imgA.Defaults.User != wantDefaults.User ||
		len(imgA.Defaults.Env) != 3 || imgA.Defaults.Env["PATH"] != "/usr/bin:/bin" || imgA.Defaults.Env["EMPTY"] != "" {
		t.Errorf("defaults = %+v, want %+v", imgA.Defaults, wantDefaults)
	}
	if imgA.Platform != "linux/amd64" || imgA.Reference != reg+"/test/a:1" || len(imgA.Layers) != 2 {
		t.Errorf("image = %+v", imgA)
	}
	if got := phasesOf(events, digestOf(t, base)); !slices.Contains(got, PhaseDownloaded) {
		t.Errorf("first pull of base: phases %v, want %s", got, PhaseDownloaded)
	}
	if events[0].Phase != PhaseResolving {
		t.Errorf("first event %+v, want %s", events[0], PhaseResolving)
	}

	events = nil
	imgB, err := Pull(context.Background(), reg+"/test/b:1", PullOptions{LayerDir: layerDir, Registries: loopbackOK,
		Progress: func(p Progress) { events = append(events, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if got := phasesOf(events, digestOf(t, base)); !slices.Equal(got, []string{PhaseCached}) {
		t.Errorf("second pull of base: phases %v, want only %s", got, PhaseCached)
	}
	want := []string{digestOf(t, base), digestOf(t, appA), digestOf(t, appB)}
	slices.Sort(want)
	if got := storedBlobs(t, layerDir); !slices.Equal(got, want) {
		t.Errorf("stored blobs %v, want %v (base once)", got, want)
	}
	// Blobs may hold a private image: the store is not for other users.
	if fi, err := os.Stat(filepath.Join(layerDir, "sha256")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("layer store: %v, %v; want mode 700", fi, err)
	}

	root := t.TempDir()
	var unpacked []string
	if err := imgB.UnpackWithProgress(context.Background(), root, DefaultLimits(), func(i, n int, l Layer) {
		if n != 2 {
			t.Errorf("layer count %d, want 2", n)
		}
		unpacked = append(unpacked, l.Digest)
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{digestOf(t, base), digestOf(t, appB)}; !slices.Equal(unpacked, want) {
		t.Errorf("unpacked %v, want base first: %v", unpacked, want)
	}
	assertFile(t, root, "etc/os-release", "ID=test\n")
	assertFile(t, root, "app/b", "b")
	assertMissing(t, root, "app/a")
}

func phasesOf(events []Progress, layer string) []string {
	var out []string
	for _, e := range events {
		if e.Layer == layer && !slices.Contains(out, e.Phase) {
			out = append(out, e.Phase)
		}
	}
	return out
}

func TestPullSelectsPlatform(t *testing.T) {
	reg := testRegistry(t)
	amd := buildImage(t, "linux/amd64", v1.Config{}, layer(t, file("arch", "amd64")))
	arm := buildImage(t, "linux/arm64", v1.Config{}, layer(t, file("arch", "arm64")))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	pushIndex(t, reg+"/multi:latest", idx)
	push(t, reg+"/armonly:latest", arm)

	tests := []struct {
		ref, platform, want string
		err                 error
	}{
		{ref: "multi:latest", platform: "", want: "amd64"},
		{ref: "multi:latest", platform: "linux/amd64", want: "amd64"},
		{ref: "multi:latest", platform: "linux/arm64", want: "arm64"},
		{ref: "multi:latest", platform: "linux/s390x", err: ErrNoPlatform},
		{ref: "multi:latest", platform: "linux", err: ErrNoPlatform},
		{ref: "armonly:latest", platform: "linux/arm64", want: "arm64"},
		{ref: "armonly:latest", platform: "", err: ErrNoPlatform},
	}
	for _, tt := range tests {
		t.Run(tt.ref+"@"+tt.platform, func(t *testing.T) {
			img, err := Pull(context.Background(), reg+"/"+tt.ref, PullOptions{LayerDir: t.TempDir(), Platform: tt.platform, Registries: loopbackOK})
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			if err := img.Unpack(context.Background(), root, DefaultLimits()); err != nil {
				t.Fatal(err)
			}
			assertFile(t, root, "arch", tt.want)
		})
	}
}

func TestPullErrors(t *testing.T) {
	reg := testRegistry(t)
	push(t, reg+"/exists:1", buildImage(t, "linux/amd64", v1.Config{}, layer(t, file("f", "x"))))

	// A loopback port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	tests := []struct {
		name, ref string
		want      error
	}{
		{"bad reference", "UPPER/Case::x", ErrInvalidReference},
		{"unknown tag", reg + "/exists:2", ErrNotFound},
		{"unknown repository", reg + "/nope:1", ErrNotFound},
		{"unreachable registry", closed + "/xx:1", ErrUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layerDir := t.TempDir()
			_, err := Pull(context.Background(), tt.ref, PullOptions{LayerDir: layerDir, Registries: loopbackOK})
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if entries, _ := os.ReadDir(layerDir); len(entries) != 0 {
				t.Errorf("failed pull left %d entries in the store", len(entries))
			}
		})
	}
}

func TestPullCanceled(t *testing.T) {
	reg := testRegistry(t)
	push(t, reg+"/cc:1", buildImage(t, "linux/amd64", v1.Config{}, layer(t, file("f", "x"))))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Pull(ctx, reg+"/cc:1", PullOptions{LayerDir: t.TempDir(), Registries: loopbackOK}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestDockerHubShortNames(t *testing.T) {
	// Only the name resolution: no network is used.
	tests := []struct{ in, want string }{
		{"ubuntu:22.04", "index.docker.io/library/ubuntu:22.04"},
		{"docker.io/library/python:3.12", "index.docker.io/library/python:3.12"},
		{"user/app", "index.docker.io/user/app:latest"},
		{"ghcr.io/o/r:t", "ghcr.io/o/r:t"},
	}
	for _, tt := range tests {
		got, err := Qualify(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Qualify(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}
