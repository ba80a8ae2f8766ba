// Command aenv-images builds aenv's container images, a gateway and a
// node, from the binaries make build leaves in bin/, without a container
// engine: an OCI layout and one tarball per image (docker load, podman
// load), reproducible from the same inputs.
//
//	aenv-images -o bin/images --version v1.2.3               # gateway only
//	aenv-images -o bin/images --node-base /var/cache/aenv-images/node-base
//	aenv-images -o bin/images --debootstrap                   # make the node's Debian (root)
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/release"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "aenv-images:", err)
		os.Exit(1)
	}
}

func run() error {
	var in release.Inputs
	var out, cacheDir, suite, mirror string
	var debootstrap bool
	flag.StringVar(&out, "o", "bin/images", "output directory (an OCI layout in oci/, and <image>.tar files)")
	flag.StringVar(&in.BinDir, "bin", "bin", "directory with the static aenv, envd and runsc")
	flag.StringVar(&in.NodeBase, "node-base", "", "root filesystem of the node image (a Debian); without it, only the gateway image is built")
	flag.BoolVar(&debootstrap, "debootstrap", false, "make the node image's Debian with debootstrap (root; cached in -cache-dir)")
	flag.StringVar(&cacheDir, "cache-dir", "/var/cache/aenv-images", "where -debootstrap keeps the Debian it made")
	flag.StringVar(&suite, "suite", "bookworm", "Debian suite of the node image")
	flag.StringVar(&mirror, "mirror", "http://deb.debian.org/debian", "Debian mirror")
	flag.StringVar(&in.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle put into the gateway image")
	flag.StringVar(&in.Version, "version", "dev", "the images' tag and version label")
	flag.StringVar(&in.Repository, "repository", "ghcr.io/aenv-dev", "registry and path the images are named under")
	flag.Parse()

	// Reproducible builds date everything at SOURCE_DATE_EPOCH (make
	// passes the commit's time).
	in.Created = time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		in.Created = time.Unix(sec, 0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if debootstrap && in.NodeBase == "" {
		base, err := nodeBase(ctx, cacheDir, suite, mirror)
		if err != nil {
			return err
		}
		in.NodeBase = base
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(out, ".layers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	images, err := release.BuildAll(in, tmp)
	if err != nil {
		return err
	}
	if err := release.Write(out, images); err != nil {
		return err
	}
	for _, b := range images {
		d, err := b.Image.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s\n", b.Ref, d)
	}
	return nil
}

// nodePackages are what the node image adds to a minbase Debian:
// debootstrap and its keyring (the node builds its base template with
// them), CA certificates, btrfs-progs (mkfs.btrfs makes the volume pool,
// --volume-pool-gb) and erofs-utils (mkfs.erofs makes the root images of
// --root-image).
const nodePackages = "ca-certificates,debootstrap,debian-archive-keyring,btrfs-progs,erofs-utils"

// nodeBase returns a Debian made by debootstrap for the node image, made
// once per suite, mirror and package list.
func nodeBase(ctx context.Context, cacheDir, suite, mirror string) (string, error) {
	mirrorKey := sha256.Sum256([]byte(mirror + "\n" + nodePackages))
	dir := filepath.Join(cacheDir, fmt.Sprintf("node-base-%s-%x", suite, mirrorKey[:4]))
	if _, err := os.Stat(filepath.Join(dir, "etc", "os-release")); err == nil {
		return dir, nil
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase",
		"--include="+nodePackages, suite, tmp, mirror)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("debootstrap: %w", err)
	}
	// Package caches and lists are not wanted in an image.
	for _, p := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		entries, _ := os.ReadDir(filepath.Join(tmp, p))
		for _, e := range entries {
			if e.Name() != "partial" && e.Name() != "lock" {
				os.RemoveAll(filepath.Join(tmp, p, e.Name()))
			}
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}
