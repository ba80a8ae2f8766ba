package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// A sandbox with runtime.Spec.RootImage gets its file systems from EROFS
// images, which the sentry reads itself, so runsc starts no gofer for them
// (and none at all without volumes): an idle sandbox is one process fewer
// and ~3.5 MiB less host memory, and the images' pages are the host's page
// cache, shared by every sandbox over them. Both live under
// Config.RootImageDir (0700: they hold the templates' files):
//
//	<RootImageDir>/<hex sha256>.erofs   a template's rootfs, named by the
//	                                    image's digest; never replaced
//	<RootImageDir>/index/<hex key>      the digest of the image made of a
//	                                    rootfs directory, its path and
//	                                    identity: the image is made once
//	<RootImageDir>/envd/<format>-<hex sha256 of envd>.erofs
//	                                    an envd build alone, mounted
//	                                    read-only at /.aenv
//
// Writes to the root land in the memory overlay as with the directory;
// envd stays read-only, as its bind mount was.
//
// runsc refuses a restore whose root image path differs from the
// checkpoint's (mount sources may differ, the root's may not): so the
// directory is the same on every node (a setting nodes share, like runsc's
// flags), and the name is the content's digest. mkfs.erofs makes the same
// bytes from the same tree (a fixed build time and UUID; the files keep
// their own times), so nodes that fetched the same rootfs make the same
// image if they run the same erofs-utils; a checkpoint records the digest
// (runtime.RootImageRecord) and a restore over any other image is refused,
// because the sentry would run on memory that does not match its files.

// rootImageFormat names how images are made (mkfs's version and options):
// part of the index key and of envd images' names, so that a change makes
// new ones and leaves the old ones to the checkpoints taken over them.
const rootImageFormat = "erofs-2"

// rootImageUUID is the file system UUID of every image: with a random one
// (mkfs's default) the same tree would give different bytes.
const rootImageUUID = "5f1d7e0c-3a6b-4c2e-9d8f-0a1b2c3d4e5f"

// rootImageBuildTime is the build time every image records (mkfs reads it
// from SOURCE_DATE_EPOCH), 2100-01-01: any fixed time makes the bytes
// depend on the tree alone. The files keep their own modification times
// (tools that compare them, such as Python's bytecode cache, need them).
const rootImageBuildTime = 4102444800

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
	builds singleflight.Group // by index key, or "envd " and envd's digest

	// placing is held by collect, and by a build while it puts its image
	// in place and indexes it, so that this process's collect never
	// removes an image between the two.
	placing sync.Mutex

	mu      sync.Mutex
	known   map[string]string // index key → digest
	digests map[string]string // image path → its digest (images never change)
}

func newRootImages(dir string) *rootImages {
	return &rootImages{dir: dir, known: make(map[string]string), digests: make(map[string]string)}
}

// digestOf is the digest of the image at p, read once per process.
func (ri *rootImages) digestOf(p string) (string, error) {
	ri.mu.Lock()
	digest, ok := ri.digests[p]
	ri.mu.Unlock()
	if ok {
		return digest, nil
	}
	digest, err := fileSHA256(p)
	if err != nil {
		return "", err
	}
	ri.mu.Lock()
	ri.digests[p] = digest
	ri.mu.Unlock()
	return digest, nil
}

// path is where the image with digest ("sha256:<hex>") lives.
func (ri *rootImages) path(digest string) string {
	return filepath.Join(ri.dir, strings.TrimPrefix(digest, "sha256:")+".erofs")
}

// digestOfPath is path's inverse: the digest of the image at p, "" if p
// is not an image's path.
func (ri *rootImages) digestOfPath(p string) string {
	hexDigest, ok := strings.CutSuffix(filepath.Base(p), ".erofs")
	if !ok || filepath.Clean(p) != p || filepath.Dir(p) != ri.dir || !runtime.IsHexSHA256(hexDigest) {
		return ""
	}
	return "sha256:" + hexDigest
}

// image returns the path of the root image for spec: the one with
// spec.RootImageDigest when it is given (a restore), else the one made of
// spec's rootfs, made now if there is none.
func (ri *rootImages) image(ctx context.Context, spec runtime.Spec) (string, error) {
	if d := spec.RootImageDigest; d != "" {
		if !runtime.IsImageDigest(d) {
			return "", fmt.Errorf("root image digest %q is malformed", d)
		}
		if _, err := os.Stat(ri.path(d)); err == nil {
			return ri.path(d), nil
		}
	}
	key, identity, err := ri.key(spec.RootfsPath)
	if err != nil {
		return "", fmt.Errorf("root image: %w", err)
	}
	digest, err := ri.lookup(key)
	if err != nil {
		v, err := ri.await(ctx, key, func() (any, error) {
			return ri.build(context.WithoutCancel(ctx), key, spec.RootfsPath, identity)
		})
		if err != nil {
			return "", fmt.Errorf("root image of %s: %w", spec.RootfsPath, err)
		}
		digest = v.(string)
	}
	if spec.RootImageDigest != "" && digest != spec.RootImageDigest {
		return "", fmt.Errorf("%w: the checkpoint was taken over %s, and the image of %s is %s here "+
			"(the template's files, or the erofs-utils that made the image, differ from those of the node that took it)",
			runtime.ErrRootImageMismatch, spec.RootImageDigest, spec.RootfsPath, digest)
	}
	return ri.path(digest), nil
}

// await runs build once for key however many ask at once (one build, in
// the background, not cut short by any of them), and waits for it until
// ctx ends.
func (ri *rootImages) await(ctx context.Context, key string, build func() (any, error)) (any, error) {
	select {
	case r := <-ri.builds.DoChan(key, build):
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the image to be made: %w", ctx.Err())
	}
}

// key names the image of rootfs: how images are made, the directory's
// path, and its identity on this host, which a rootfs made anew at the
// same path does not share (a rootfs is never changed in place).
func (ri *rootImages) key(rootfs string) (key, identity string, err error) {
	if identity, err = dirIdentity(rootfs); err != nil {
		return "", "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s", rootImageFormat, filepath.Clean(rootfs), identity)
	return hex.EncodeToString(h.Sum(nil)), identity, nil
}

// dirIdentity tells one directory from another made later at the same
// path: its device, inode and birth time (inode numbers are reused at
// once; a file system without birth times gives the change time, which a
// rootfs's top directory keeps while nothing is added to it).
func dirIdentity(dir string) (string, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_INO|unix.STATX_BTIME|unix.STATX_CTIME, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", dir, err)
	}
	born := st.Ctime
	if st.Mask&unix.STATX_BTIME != 0 {
		born = st.Btime
	}
	return fmt.Sprintf("%d:%d:%d:%d.%d", st.Dev_major, st.Dev_minor, st.Ino, born.Sec, born.Nsec), nil
}

// envdImage returns the path of the image holding the envd binary at
// envd, alone, as the file "envd"; made now if there is none.
func (ri *rootImages) envdImage(ctx context.Context, envd string) (string, error) {
	digest, err := envdDigest(envd)
	if err != nil {
		return "", fmt.Errorf("envd image: %w", err)
	}
	image := filepath.Join(ri.dir, "envd", rootImageFormat+"-"+digest+".erofs")
	if _, err := os.Stat(image); err == nil {
		return image, nil
	}
	if _, err := ri.await(ctx, "envd "+digest, func() (any, error) {
		return nil, ri.buildEnvd(context.WithoutCancel(ctx), envd, image)
	}); err != nil {
		return "", fmt.Errorf("envd image of %s: %w", envd, err)
	}
	return image, nil
}

// buildEnvd makes image, of a directory holding envd alone.
func (ri *rootImages) buildEnvd(ctx context.Context, envd, image string) error {
	if err := ri.makeDir(filepath.Dir(image)); err != nil {
		return err
	}
	// The staging directory keeps its own time, by which collect removes
	// it should the build be cut short; the tree inside has fixed ones.
	staging, err := os.MkdirTemp(filepath.Dir(image), ".tree-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	tree := filepath.Join(staging, "root")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return err
	}
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
	// The tree is made now, on each node: fixed times make the image the
	// same on every node, as a restore elsewhere needs (the sentry fails
	// restoring over an envd image with other bytes).
	fixed := time.Unix(rootImageBuildTime, 0)
	for _, p := range []string{filepath.Join(tree, "envd"), tree} {
		if err := os.Chtimes(p, fixed, fixed); err != nil {
			return err
		}
	}
	made, err := ri.mkfs(ctx, tree, filepath.Dir(image))
	if err != nil {
		return err
	}
	defer os.Remove(made)
	return renameDurable(made, image)
}

// makeDir makes dir, and the image directory above it, readable by root
// alone: the images hold the templates' files.
func (ri *rootImages) makeDir(dir string) error {
	for _, d := range []string{ri.dir, dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// lookup returns the digest of the image indexed under key, if that image
// is there.
func (ri *rootImages) lookup(key string) (string, error) {
	ri.mu.Lock()
	digest, ok := ri.known[key]
	ri.mu.Unlock()
	if !ok {
		entry, err := ri.readIndex(key)
		if err != nil {
			return "", err
		}
		digest = entry.digest
	}
	if _, err := os.Stat(ri.path(digest)); err != nil {
		return "", err
	}
	ri.mu.Lock()
	ri.known[key] = digest
	ri.mu.Unlock()
	return digest, nil
}

// indexEntry is what the index keeps of one image: its digest, and the
// rootfs (path and identity) it was made of.
type indexEntry struct {
	digest, rootfs, identity string
}

func (e indexEntry) String() string { return e.digest + "\n" + e.rootfs + "\n" + e.identity + "\n" }

// readIndex reads the index entry key.
func (ri *rootImages) readIndex(key string) (indexEntry, error) {
	raw, err := os.ReadFile(filepath.Join(ri.dir, "index", key))
	if err != nil {
		return indexEntry{}, err
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 || !runtime.IsImageDigest(lines[0]) {
		return indexEntry{}, fmt.Errorf("index %s: malformed entry %q", key, raw)
	}
	return indexEntry{digest: lines[0], rootfs: lines[1], identity: lines[2]}, nil
}

// collectAge is how old an unindexed image or a staging file must be
// before collect removes it: younger, a server may be putting it in place.
const collectAge = 10 * time.Minute

// collect removes what no rootfs needs any more: index entries of root
// file systems gone (or made anew at their path), the root images no
// remaining entry names, and what a build killed midway left. The images
// of a rootfs that is still there stay, whatever format made them: the
// checkpoints taken over them restore over them. A sandbox running over a
// removed image keeps it open; its checkpoints restore over the image made
// again of its rootfs, which exists while the sandbox does. envd's images
// stay: one per build, ~10 MB each.
func (ri *rootImages) collect(now time.Time) (removed int, err error) {
	ri.placing.Lock()
	defer ri.placing.Unlock()
	live := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(ri.dir, "index"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // atomicfile's staging; swept below by age
		}
		entry, err := ri.readIndex(e.Name())
		if err == nil {
			if identity, err := dirIdentity(entry.rootfs); err == nil && identity == entry.identity {
				live[entry.digest] = true
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
func (ri *rootImages) build(ctx context.Context, key, rootfs, identity string) (string, error) {
	if err := ri.makeDir(filepath.Join(ri.dir, "index")); err != nil {
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
	// Its bytes reach the disk before the lock, which a collection (from
	// the node's monitor) waits on: the rename under it is then quick.
	if err := syncFile(staging); err != nil {
		return "", err
	}
	ri.placing.Lock()
	defer ri.placing.Unlock()
	if _, err := os.Stat(final); errors.Is(err, fs.ErrNotExist) {
		if err := renameDurable(staging, final); err != nil {
			return "", err
		}
	} else {
		// Made before, and perhaps unindexed since: young again, so that
		// another server's collect leaves it until the entry is written.
		now := time.Now()
		if err := os.Chtimes(final, now, now); err != nil {
			return "", err
		}
	}
	entry := indexEntry{digest: digest, rootfs: filepath.Clean(rootfs), identity: identity}
	if err := atomicfile.WriteDurable(filepath.Join(ri.dir, "index", key), strings.NewReader(entry.String()), 0o600); err != nil {
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
	// -x -1: no extended attributes. gVisor's EROFS reader refuses every
	// file that has one (ENOTSUP), and a rootfs fetched from another node
	// has none (the tree's transfer leaves them out). -E noinline_data:
	// it cannot load executables whose tails are inlined either (the
	// default of erofs-utils 1.5): "bad address".
	cmd := exec.CommandContext(ctx, mkfs, "--quiet", "-x", "-1", "-E", "noinline_data", "-U", rootImageUUID, staging, tree)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", rootImageBuildTime))
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(staging)
		return "", fmt.Errorf("mkfs.erofs %s: %w: %s", tree, err, strings.TrimSpace(string(out)))
	}
	if err := os.Chmod(staging, 0o400); err != nil {
		os.Remove(staging)
		return "", err
	}
	return staging, nil
}

// renameDurable puts the file staging in place at final once its contents
// are on disk, and the rename too: an image is trusted by its name from
// then on, also after a power loss.
func renameDurable(staging, final string) error {
	if err := syncFile(staging); err != nil {
		return err
	}
	if err := os.Rename(staging, final); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(final))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// syncFile makes the bytes of the file at p durable.
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// fileSHA256 is "sha256:<hex>" of the file at p.
func fileSHA256(p string) (string, error) {
	digest, err := runtime.FileSHA256(p)
	if err != nil {
		return "", err
	}
	return "sha256:" + digest, nil
}

// envdDigest is the hex SHA-256 of the envd binary at p: its file name
// when it is a pinned copy (named by its digest), else its content's.
func envdDigest(p string) (string, error) {
	if name := filepath.Base(p); runtime.IsHexSHA256(name) {
		return name, nil
	}
	return runtime.FileSHA256(p)
}
