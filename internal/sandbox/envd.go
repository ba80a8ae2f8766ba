package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/atomicfile"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// envd is part of a sandbox's memory image, not only of its files: a
// checkpoint holds envd's code pages by reference to the binary it was
// mapped from, and a restore maps them again from whatever file is then
// mounted at runtime.EnvdMountPath. Restored over another build of envd (an
// upgrade of aenv, or a binary replaced in place), the sandbox crashes. So
// sandboxes never run the configured envd itself but a copy named by its
// digest (PinEnvd), which nothing replaces; an image records the copy it
// was taken with (the runtime links it into the image as
// runtime.EnvdImagePrefix + digest), and a restore mounts that one (Manager.envdOf), fetched from the
// image when this node has no copy of it (an image from another node).

// PinEnvd copies the envd binary at src into dir under the hex SHA-256 of
// its content, if no such copy is there, and returns the copy's path.
// Copies of earlier builds stay: images taken with them restore with them.
func PinEnvd(src, dir string) (string, error) {
	digest, err := runtime.FileSHA256(src)
	if err != nil {
		return "", fmt.Errorf("pin envd: %w", err)
	}
	pinned := filepath.Join(dir, digest)
	if err := copyVerified(src, pinned, digest); err != nil {
		return "", fmt.Errorf("pin envd: %w", err)
	}
	return pinned, nil
}

// envdOf returns the envd a restore of imageDir must mount: "" for this
// node's own (images taken before envd was pinned, or with the same
// build), else the pinned copy the image was taken with, copied here from
// the image first if this node has none.
func (m *Manager) envdOf(imageDir string) string {
	digest := m.otherEnvd(imageDir)
	if digest == "" {
		return ""
	}
	pinned := filepath.Join(m.cfg.EnvdDir, digest)
	m.envdBuilds.Lock()
	err := copyVerified(filepath.Join(imageDir, runtime.EnvdImagePrefix+digest), pinned, digest)
	if err == nil {
		markUsed(pinned)
	}
	m.envdBuilds.Unlock()
	if err != nil {
		m.logger.Warn("envd of an image not usable; restoring with this node's", "image", imageDir, "err", err)
		return ""
	}
	m.logger.Debug("restore with the envd build the image was taken with", "image", imageDir, "envd", pinned)
	return pinned
}

// otherEnvd is the digest of the envd build a restore of imageDir runs
// when that is not this node's own, "" when it is; unlike envdOf, it pins
// nothing.
func (m *Manager) otherEnvd(imageDir string) string {
	if imageDir == "" || m.cfg.EnvdDir == "" {
		return ""
	}
	digest := imageEnvd(imageDir)
	if digest == "" || filepath.Join(m.cfg.EnvdDir, digest) == m.cfg.EnvdPath {
		return ""
	}
	return digest
}

// imageEnvd is the digest of the envd build the checkpoint image at
// imageDir holds a copy of, "" if none.
func imageEnvd(imageDir string) string {
	entries, err := os.ReadDir(imageDir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if digest, ok := strings.CutPrefix(e.Name(), runtime.EnvdImagePrefix); ok && runtime.IsHexSHA256(digest) {
			return digest
		}
	}
	return ""
}

// envdBuildIdle is how long a pinned envd other than this server's goes
// unused (envdOf) before collectEnvdBuilds removes it, unless a sandbox
// runs it: the images taken with it hold their own copy, so a restore of
// one pins it again, and a day spares that to the builds still in use.
const envdBuildIdle = 24 * time.Hour

// markUsed sets the modification time of the file at p to now, once a
// minute at most (restores come by the hundred).
func markUsed(p string) {
	now := time.Now()
	if info, err := os.Stat(p); err == nil && now.Sub(info.ModTime()) > time.Minute {
		_ = os.Chtimes(p, now, now)
	}
}

// collectEnvdBuilds removes the pinned envd builds that are not this
// server's, were not used for envdBuildIdle and that no sandbox of the
// driver runs (one more is pinned at each upgrade, ~10 MB), and copies a
// crash left half made; it says how many went. A driver that cannot say
// which builds its sandboxes run keeps them all.
func (m *Manager) collectEnvdBuilds(ctx context.Context) (removed int, err error) {
	users, ok := m.driver.(runtime.EnvdUser)
	if m.cfg.EnvdDir == "" || !ok {
		return 0, nil
	}
	entries, err := os.ReadDir(m.cfg.EnvdDir)
	if err != nil {
		return 0, fmt.Errorf("envd builds: %w", err)
	}
	now := time.Now()
	var idle []string
	for _, e := range entries {
		p := filepath.Join(m.cfg.EnvdDir, e.Name())
		info, err := e.Info()
		if err != nil || p == m.cfg.EnvdPath {
			continue
		}
		switch {
		case strings.HasSuffix(e.Name(), ".copying") && now.Sub(info.ModTime()) >= copyingAge:
			if os.Remove(p) == nil {
				removed++
			}
		case runtime.IsHexSHA256(e.Name()) && now.Sub(info.ModTime()) >= envdBuildIdle:
			idle = append(idle, p)
		}
	}
	if len(idle) == 0 {
		return removed, nil
	}
	inUse, err := users.EnvdInUse(ctx)
	if err != nil {
		return removed, fmt.Errorf("envd builds: %w", err)
	}
	// By digest, the file's name: a bundle of a run with another data
	// directory names the same build at another path.
	running := map[string]bool{}
	for p := range inUse {
		running[filepath.Base(p)] = true
	}
	// The bundles are read without the lock (restores need not wait for
	// them); a build a restore marked used since is young when looked at
	// again under it.
	m.envdBuilds.Lock()
	defer m.envdBuilds.Unlock()
	for _, p := range idle {
		if running[filepath.Base(p)] {
			continue
		}
		if info, err := os.Stat(p); err == nil && time.Since(info.ModTime()) >= envdBuildIdle && os.Remove(p) == nil {
			removed++
		}
	}
	return removed, nil
}

// copyingAge is how old a copy of envd being made must be before it is
// taken for what a crash left: a copy takes well under a second.
const copyingAge = 10 * time.Minute

// copyVerified makes dst a copy of src, whose content must have digest,
// unless dst exists (put in place whole, and only once checked: it is that
// content, and is never replaced).
func copyVerified(src, dst, digest string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	staging := fmt.Sprintf("%s.%x.copying", dst, rand.Uint64())
	h := sha256.New()
	if err := atomicfile.WriteDurable(staging, io.TeeReader(f, h), 0o555); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		os.Remove(staging)
		return fmt.Errorf("%s: content digest %s, not %s", src, got, digest)
	}
	return os.Rename(staging, dst)
}

// rootForm is how a sandbox gets its root file system
// (runtime.Spec.RootImage): as the node's setting says (a boot), as the
// directory, or over the image with a digest (a restore of a checkpoint
// taken over it).
type rootForm string

const (
	rootFromNode  rootForm = ""
	rootDirectory rootForm = "directory"
)

// rootOf returns the root form a restore of imageDir (a checkpoint of a
// sandbox of rootfs) must have: the one the checkpoint was taken with.
// Where that is what a boot on this node gets (the directory on a node
// that boots over it, or the image a boot over rootfs gets here), it is
// rootFromNode, so that its restores share the prepared sandboxes of
// boots. An unreadable record gives the directory; the driver's restore
// then says what is wrong with it.
func (m *Manager) rootOf(ctx context.Context, imageDir, rootfs string) rootForm {
	if imageDir == "" {
		return rootFromNode
	}
	digest, err := runtime.CheckpointRootImage(imageDir)
	switch {
	case err != nil:
		m.logger.Warn("root image record of a checkpoint not readable", "image", imageDir, "err", err)
		return rootDirectory
	case digest == "" && m.cfg.RootImage:
		return rootDirectory
	case digest == "":
		return rootFromNode
	}
	if ri, ok := m.driver.(runtime.RootImager); ok && m.cfg.RootImage {
		if current, err := ri.RootImageDigest(ctx, rootfs); err == nil && current == digest {
			return rootFromNode
		}
	}
	return rootForm(digest)
}

// apply sets spec's root file system to root.
func (root rootForm) apply(spec *runtime.Spec, nodeRootImage bool) {
	switch root {
	case rootFromNode:
		spec.RootImage = nodeRootImage
	case rootDirectory:
	default:
		spec.RootImage, spec.RootImageDigest = true, string(root)
	}
}
