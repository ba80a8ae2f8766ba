package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// A sandbox with runtime.Spec.RootImage gets its file systems from EROFS
// images, which the sentry reads itself, so runsc starts no gofer for them
// (and none at all without volumes): an idle sandbox is one process fewer
// and ~3.5 MiB less host memory, and the images' pages are the host's page
// cache, shared by every sandbox over them. Both live under
// Config.RootImageDir:
//
//	<RootImageDir>/<hex sha256>.erofs       a template's rootfs, named by the
//	                                        image's digest; never replaced
//	<RootImageDir>/index/<hex key>          "sha256:<hex>": the image made of
//	                                        a rootfs directory, so that it is
//	                                        made once
//	<RootImageDir>/envd/<hex sha256>.erofs  an envd build alone, named by the
//	                                        binary's digest, mounted
//	                                        read-only at /.aenv
//
// Writes to the root land in the memory overlay as with the directory;
// envd stays read-only, as its bind mount was.
//
// runsc refuses a restore whose root image path differs from the
// checkpoint's (mount sources may differ, the root's may not): so the
// directory is the same on every node (a setting nodes share, like runsc's
// flags), and the name is the content's digest. mkfs.erofs makes the same
// bytes from the same tree (fixed timestamps and UUID), so nodes that
// fetched the same rootfs make the same image; a checkpoint records the
// digest (runtime.RootImageRecord) and a restore over any other image is
// refused, because the sentry would run on memory that does not match its
// files.

// rootImageFormat is part of every index key: a change of how images are
// made (mkfs options, the envd path inside) makes new ones.
const rootImageFormat = "erofs-1"

// rootImageUUID is the file system UUID of every image: with a random one
// (mkfs's default) the same tree would give different bytes.
const rootImageUUID = "5f1d7e0c-3a6b-4c2e-9d8f-0a1b2c3d4e5f"

// Annotations that give runsc the root file system as an image.
const (
	rootfsSourceAnnotation  = "dev.gvisor.spec.rootfs.source"
	rootfsTypeAnnotation    = "dev.gvisor.spec.rootfs.type"
	rootfsOverlayAnnotation = "dev.gvisor.spec.rootfs.overlay"
)

// rootImageBuildTimeout bounds making one image (~2 s for a 300 MB rootfs
// on 2 cores).
const rootImageBuildTimeout = 5 * time.Minute

// fsImages are the EROFS images a sandbox runs over: its root file system
// and envd.
type fsImages struct{ root, envd string }

// rootImages finds and makes the root file system images of one driver.
type rootImages struct {
	dir    string
	builds singleflight.Group // by index key

	mu    sync.Mutex
	known map[string]string // index key → digest
}

func newRootImages(dir string) *rootImages {
	return &rootImages{dir: dir, known: make(map[string]string)}
}

// path is where the image with digest ("sha256:<hex>") lives.
func (ri *rootImages) path(digest string) string {
	return filepath.Join(ri.dir, strings.TrimPrefix(digest, "sha256:")+".erofs")
}

// digestOfPath is path's inverse: the digest of the image at p, "" if p
// is not an image's path.
func (ri *rootImages) digestOfPath(p string) string {
	hexDigest, ok := strings.CutSuffix(filepath.Base(p), ".erofs")
	if !ok || filepath.Clean(p) != p || filepath.Dir(p) != ri.dir || !isHexDigest(hexDigest) {
		return ""
	}
	return "sha256:" + hexDigest
}

// image returns the path of the root image for spec: the one with
// spec.RootImageDigest when it is given (a restore), else the one made of
// spec's rootfs, made now if there is none.
func (ri *rootImages) image(ctx context.Context, spec runtime.Spec) (string, error) {
	if spec.RootImageDigest != "" {
		if _, err := os.Stat(ri.path(spec.RootImageDigest)); err == nil {
			return ri.path(spec.RootImageDigest), nil
		}
	}
	key, err := ri.key(spec.RootfsPath)
	if err != nil {
		return "", fmt.Errorf("root image: %w", err)
	}
	digest, err := ri.lookup(key)
	if err != nil {
		v, berr, _ := ri.builds.Do(key, func() (any, error) {
			return ri.build(context.WithoutCancel(ctx), key, spec.RootfsPath)
		})
		if berr != nil {
			return "", fmt.Errorf("root image of %s: %w", spec.RootfsPath, berr)
		}
		digest = v.(string)
	}
	if spec.RootImageDigest != "" && digest != spec.RootImageDigest {
		return "", fmt.Errorf("%w: the checkpoint was taken over %s, and the image of %s is %s here "+
			"(the template's files differ from those of the node that took it)",
			runtime.ErrRootImageMismatch, spec.RootImageDigest, spec.RootfsPath, digest)
	}
	return ri.path(digest), nil
}

// key names the image of rootfs: the directory's path and identity on
// this host (a rootfs is never changed in place; a new one is a new
// directory).
func (ri *rootImages) key(rootfs string) (string, error) {
	info, err := os.Stat(rootfs)
	if err != nil {
		return "", err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("stat %s: no inode", rootfs)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d:%d", rootImageFormat, filepath.Clean(rootfs), st.Dev, st.Ino)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// envdImage returns the path of the image holding the envd binary at
// envd, alone, as the file "envd"; made now if there is none.
func (ri *rootImages) envdImage(ctx context.Context, envd string) (string, error) {
	digest, err := envdDigest(envd)
	if err != nil {
		return "", fmt.Errorf("envd image: %w", err)
	}
	image := filepath.Join(ri.dir, "envd", digest+".erofs")
	if _, err := os.Stat(image); err == nil {
		return image, nil
	}
	_, err, _ = ri.builds.Do("envd "+digest, func() (any, error) {
		return nil, ri.buildEnvd(context.WithoutCancel(ctx), envd, image)
	})
	if err != nil {
		return "", fmt.Errorf("envd image of %s: %w", envd, err)
	}
	return image, nil
}

// buildEnvd makes image, of a directory holding envd alone.
func (ri *rootImages) buildEnvd(ctx context.Context, envd, image string) error {
	if err := os.MkdirAll(filepath.Dir(image), 0o755); err != nil {
		return err
	}
	tree, err := os.MkdirTemp(filepath.Dir(image), ".tree-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tree)
	src, err := os.Open(envd)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := atomicfile.Write(filepath.Join(tree, "envd"), src, 0o555); err != nil {
		return err
	}
	if err := os.Chmod(tree, 0o755); err != nil {
		return err
	}
	staging, err := ri.mkfs(ctx, tree, filepath.Dir(image))
	if err != nil {
		return err
	}
	defer os.Remove(staging)
	return os.Rename(staging, image)
}

// lookup returns the digest of the image indexed under key, if that image
// is there.
func (ri *rootImages) lookup(key string) (string, error) {
	ri.mu.Lock()
	digest, ok := ri.known[key]
	ri.mu.Unlock()
	if !ok {
		var err error
		if digest, _, err = ri.readIndex(key); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(ri.path(digest)); err != nil {
		return "", err
	}
	ri.mu.Lock()
	ri.known[key] = digest
	ri.mu.Unlock()
	return digest, nil
}

// readIndex reads the index entry key: the digest of the image and the
// rootfs it was made of.
func (ri *rootImages) readIndex(key string) (digest, rootfs string, err error) {
	raw, err := os.ReadFile(filepath.Join(ri.dir, "index", key))
	if err != nil {
		return "", "", err
	}
	digest, rootfs, _ = strings.Cut(strings.TrimSpace(string(raw)), "\n")
	if !strings.HasPrefix(digest, "sha256:") || !isHexDigest(strings.TrimPrefix(digest, "sha256:")) {
		return "", "", fmt.Errorf("index %s: malformed digest %q", key, digest)
	}
	return digest, rootfs, nil
}

// collectAge is how old an unindexed image or a staging file must be
// before collect removes it: younger, a server may be putting it in place.
const collectAge = 10 * time.Minute

// collect removes what no rootfs needs any more: index entries of root
// file systems gone (or replaced: another inode at the path), root images
// no entry names, and what a build killed midway left. A sandbox running
// over a removed image keeps it open; its checkpoints restore over the
// image made again of its rootfs, which exists while the sandbox does.
// envd's images stay: one per build, ~10 MB each.
func (ri *rootImages) collect(now time.Time) (removed int, err error) {
	live := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(ri.dir, "index"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // atomicfile's staging; swept below by age
		}
		digest, rootfs, err := ri.readIndex(e.Name())
		if err == nil && rootfs != "" {
			if key, kerr := ri.key(rootfs); kerr == nil && key == e.Name() {
				live[digest] = true
				continue
			}
		}
		if os.Remove(filepath.Join(ri.dir, "index", e.Name())) == nil {
			removed++
		}
	}
	for _, dir := range []string{ri.dir, filepath.Join(ri.dir, "index"), filepath.Join(ri.dir, "envd")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := filepath.Join(dir, e.Name())
			staging := strings.HasPrefix(e.Name(), ".")
			unneeded := dir == ri.dir && ri.digestOfPath(name) != "" && !live[ri.digestOfPath(name)]
			if !staging && !unneeded {
				continue
			}
			if info, err := e.Info(); err != nil || now.Sub(info.ModTime()) < collectAge {
				continue
			}
			if os.RemoveAll(name) == nil {
				removed++
			}
		}
	}
	return removed, nil
}

// build makes the image of rootfs, names it by its digest and indexes it
// under key. Servers that share the directory may build the same image at
// once; each puts it in place whole (a rename), and the bytes are the same.
func (ri *rootImages) build(ctx context.Context, key, rootfs string) (string, error) {
	if err := os.MkdirAll(filepath.Join(ri.dir, "index"), 0o755); err != nil {
		return "", err
	}
	staging, err := ri.mkfs(ctx, rootfs, ri.dir)
	if err != nil {
		return "", err
	}
	defer os.Remove(staging)
	digest, err := fileSHA256(staging)
	if err != nil {
		return "", err
	}
	final := ri.path(digest)
	if _, err := os.Stat(final); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(staging, final); err != nil {
			return "", err
		}
	}
	if err := atomicfile.Write(filepath.Join(ri.dir, "index", key), strings.NewReader(digest+"\n"+rootfs+"\n"), 0o644); err != nil {
		return "", err
	}
	ri.mu.Lock()
	ri.known[key] = digest
	ri.mu.Unlock()
	return digest, nil
}

// mkfs makes a read-only EROFS image of tree in dir, under a name of its
// own, and returns its path; the caller renames or removes it.
func (ri *rootImages) mkfs(ctx context.Context, tree, dir string) (string, error) {
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", fmt.Errorf("mkfs.erofs (Debian's erofs-utils) is needed for root images: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, rootImageBuildTimeout)
	defer cancel()
	staging := filepath.Join(dir, fmt.Sprintf(".build-%x.erofs", rand.Uint64()))
	// -E noinline_data: gVisor's EROFS reader cannot load executables
	// whose tails are inlined (the default of erofs-utils 1.5): "bad
	// address". -T 0 and the fixed UUID make the bytes depend on the tree
	// alone.
	cmd := exec.CommandContext(ctx, mkfs, "--quiet", "-E", "noinline_data", "-T", "0", "-U", rootImageUUID, staging, tree)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(staging)
		return "", fmt.Errorf("mkfs.erofs %s: %w: %s", tree, err, strings.TrimSpace(string(out)))
	}
	if err := os.Chmod(staging, 0o444); err != nil {
		os.Remove(staging)
		return "", err
	}
	return staging, nil
}

// fileSHA256 is "sha256:<hex>" of the file at p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func isHexDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// envdDigest is the hex SHA-256 of the envd binary at p: its file name
// when it is a pinned copy (named by its digest), else its content's.
func envdDigest(p string) (string, error) {
	if name := filepath.Base(p); isHexDigest(name) {
		return name, nil
	}
	digest, err := fileSHA256(p)
	return strings.TrimPrefix(digest, "sha256:"), err
}
