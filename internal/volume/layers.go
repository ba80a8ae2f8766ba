package volume

// Copy-on-write volumes. A volume's files are a plain directory (data)
// until it is frozen for a fork in copy mode: then its files become a
// read-only layer, and the volume, like each clone made of it, is an
// overlay of its own new files (data, the upper directory) over its layers
// (top first), mounted on the host at mnt. A clone costs two directories
// and a mount, whatever the volume's size; a file is copied (up) only when
// written.
//
// On disk, under the service's directory:
//
//	<id>/data       a plain volume's files; a layered one's own (upper) files
//	<id>/work       overlayfs's work directory (layered)
//	<id>/mnt        where a layered volume is mounted
//	<id>/freezing   during a freeze: the new layer's ID
//	.layers/<layer> frozen layers, read-only, removed once no volume holds them

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// freezingMarker, in a volume's directory, holds the ID of the layer a
// freeze is making of it; a start that finds it finishes or drops the
// freeze, as the record says.
const freezingMarker = "freezing"

func (s *Service) layersDir() string            { return filepath.Join(s.dir, ".layers") }
func (s *Service) layerDir(layer string) string { return filepath.Join(s.layersDir(), layer) }
func (s *Service) mntDir(id string) string      { return filepath.Join(s.dir, id, "mnt") }
func (s *Service) workDir(id string) string     { return filepath.Join(s.dir, id, "work") }

// files is where v's files are seen whole, and whether that is an overlay
// mount: a plain volume's data directory, or a layered one's mount (made
// if need be).
func (s *Service) files(v *store.Volume) (string, bool, error) {
	if len(v.Layers) == 0 {
		return s.dataDir(v.ID), false, nil
	}
	if err := s.mount(v); err != nil {
		return "", false, err
	}
	return s.mntDir(v.ID), true, nil
}

// mounted reports whether dir is an overlay mount.
func mounted(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC
}

// mount mounts layered volume v at its mnt, unless it is mounted. A mount
// left by a previous process (its sandboxes may still use it) is kept.
func (s *Service) mount(v *store.Volume) error {
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	mnt := s.mntDir(v.ID)
	if mounted(mnt) {
		return nil
	}
	for _, l := range v.Layers {
		if _, err := os.Stat(s.layerDir(l)); err != nil {
			return fmt.Errorf("volume %s: layer %s: %w", v.ID, l, err)
		}
	}
	for _, dir := range []string{s.workDir(v.ID), mnt} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("volume %s: %w", v.ID, err)
		}
	}
	opts := s.mountOptions(v.ID, v.Layers)
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("volume %s: mount its layers: %w", v.ID, err)
	}
	return nil
}

// unmount unmounts volume id's overlay, if it is mounted (detached: a
// call still in it finishes first).
func (s *Service) unmount(ctx context.Context, id string) {
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	mnt := s.mntDir(id)
	for mounted(mnt) {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			s.logger.WarnContext(ctx, "unmount a volume's layers", "volume", id, "err", err)
			return
		}
	}
}

// UnmountAll unmounts every layered volume's overlay, and the volume
// pool: for a node that stops with no sandbox left (their mounts would
// otherwise outlive it).
func (s *Service) UnmountAll(ctx context.Context) {
	if s.pool != nil {
		s.Close() // the background sweeps read the pool
		closePool(ctx, s.dir, s.logger)
		return
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if ValidID(e.Name()) {
			s.unmount(ctx, e.Name())
		}
	}
}

// topLike gives dir, a new volume's own top directory, its attributes:
// open to every user for a plain volume, as its top layer's for a clone
// (an overlay's root is its upper directory).
func (s *Service) topLike(dir string, layers []string) error {
	if len(layers) == 0 {
		return os.Chmod(dir, 0o777)
	}
	info, err := os.Stat(s.layerDir(layers[0]))
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, info.Mode().Perm()|info.Mode()&(fs.ModeSticky|fs.ModeSetgid)); err != nil {
		return err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return os.Lchown(dir, int(st.Uid), int(st.Gid))
}

// Freeze makes volume id's files a read-only layer under it, for clones
// to share: the volume goes on, over the layer, with no files of its own.
// No sandbox but holder (whose fork this is, and which is stopped) may
// mount it: a running sandbox would go on writing into the layer.
//
// In a volume pool the volume is not changed: its files are snapshotted,
// read-only, as the layer its clones are snapshots of, until Release.
func (s *Service) Freeze(ctx context.Context, id, holder string) (*store.Volume, error) {
	if s.pool != nil {
		return s.freezeInPool(ctx, id)
	}
	if s.overlayErr != nil {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented,
			"copies of volumes need overlay mounts, which do not work in %s here: %v", s.dir, s.overlayErr)
	}
	lock := s.freezeLock(id)
	lock.Lock()
	defer lock.Unlock()
	v, err := s.localRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(v.Layers) >= store.MaxVolumeLayers {
		return nil, errdefs.Errorf(errdefs.ErrConflict,
			"volume %s has %d layers, the most a volume may (each copy fork adds one): fork with it shared, or copy its files to a new volume",
			v.Name, len(v.Layers))
	}
	if empty, err := emptyDir(s.dataDir(id)); err != nil {
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	} else if empty {
		// Nothing of its own since its last freeze (or ever): its copies
		// share its layers as they are, and no empty layer is added.
		return v, nil
	}
	layer := "layer-" + strings.ToLower(rand.Text()[:20])
	if n := len(s.mountOptions(id, append([]string{layer}, v.Layers...))); n > maxMountOptions {
		return nil, errdefs.Errorf(errdefs.ErrConflict,
			"volume %s has too many layers to mount one more (%d bytes of mount options; at most %d): fork with it shared, or copy its files to a new volume",
			v.Name, n, maxMountOptions)
	}
	if err := os.MkdirAll(s.layersDir(), 0o700); err != nil {
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	}
	marker := filepath.Join(s.dir, id, freezingMarker)
	if err := os.WriteFile(marker, []byte(layer), 0o600); err != nil {
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	}
	s.unmount(ctx, id)
	holders, err := s.records.FreezeVolume(ctx, id, layer, holder)
	switch {
	case errors.Is(err, store.ErrConflict):
		os.Remove(marker)
		return nil, errdefs.Errorf(errdefs.ErrConflict,
			"volume %s is mounted by other sandboxes (%s) as well: a copy is made of a volume only its fork's parent mounts",
			v.Name, holderList(holders))
	case errors.Is(err, store.ErrNotFound):
		os.Remove(marker)
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %s was deleted", id)
	case err != nil:
		// Maybe written, maybe not: the mark stays, and the next start
		// finishes the freeze or drops it as the record says.
		return nil, err
	}
	if err := s.finishFreeze(id, layer); err != nil {
		// The record has the layer: the next start finishes the move.
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	}
	os.Remove(marker)
	v.Layers = append([]string{layer}, v.Layers...)
	return v, nil
}

// freezeInPool snapshots volume id's files, read-only, as a layer under
// .layers (a crash leaves it to the next start, which removes layers no
// record holds), and answers v as if that were its only layer, for Clone.
func (s *Service) freezeInPool(ctx context.Context, id string) (*store.Volume, error) {
	v, err := s.localRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.layersDir(), 0o700); err != nil {
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	}
	layer := "frozen-" + strings.ToLower(rand.Text()[:20])
	// Content calls end first: a snapshot in an upload's midst would give
	// the copies its temporary file.
	lock := s.freezeLock(id)
	lock.Lock()
	err = snapshotSubvolume(s.dataDir(id), s.layerDir(layer), true)
	lock.Unlock()
	if err != nil {
		return nil, fmt.Errorf("freeze volume %s: %w", id, err)
	}
	frozen := *v
	frozen.Layers = []string{layer}
	return &frozen, nil
}

// localRecord is volume id's record, which must be this node's.
func (s *Service) localRecord(ctx context.Context, id string) (*store.Volume, error) {
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %s was deleted", id)
	}
	if err != nil {
		return nil, err
	}
	if !s.Local(v) {
		return nil, errdefs.Errorf(errdefs.ErrConflict, "volume %s is on node %s, not this one", id, v.NodeID)
	}
	return v, nil
}

// Release lets go of what Freeze made for the clones of frozen (in a
// volume pool, its snapshot), once they are made.
func (s *Service) Release(ctx context.Context, frozen *store.Volume) {
	if s.pool == nil || len(frozen.Layers) != 1 {
		return
	}
	if err := removeTree(s.layerDir(frozen.Layers[0])); err != nil {
		s.logger.WarnContext(ctx, "remove a volume's frozen snapshot: removed at the next start", "volume", frozen.ID, "err", err)
	}
}

// finishFreeze moves volume id's own files into layer, and gives it a
// new, empty, top directory like the old one. It can be run again after
// a crash at any step.
func (s *Service) finishFreeze(id, layer string) error {
	if _, err := os.Stat(s.layerDir(layer)); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(s.dataDir(id), s.layerDir(layer)); err != nil {
			return err
		}
	}
	if err := os.Mkdir(s.dataDir(id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// The old work directory may hold overlayfs's leftovers.
	if err := os.RemoveAll(s.workDir(id)); err != nil {
		return err
	}
	return s.topLike(s.dataDir(id), []string{layer})
}

// maxMountOptions bounds an overlay mount's options: the kernel takes a
// page of them.
const maxMountOptions = 4000

// mountOptions are the overlay mount options of volume id over layers.
func (s *Service) mountOptions(id string, layers []string) string {
	lower := make([]string, len(layers))
	for i, l := range layers {
		lower[i] = s.layerDir(l)
	}
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), s.dataDir(id), s.workDir(id))
}

// freezeLock is volume id's lock against freezes (see Service.freezing).
func (s *Service) freezeLock(id string) *sync.RWMutex {
	s.freezingMu.Lock()
	defer s.freezingMu.Unlock()
	l := s.freezing[id]
	if l == nil {
		l = &sync.RWMutex{}
		s.freezing[id] = l
	}
	return l
}

// emptyDir reports whether dir has no entries.
func emptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}

// probeOverlay mounts a small overlay under the service's directory and
// unmounts it: nil when copies of volumes can be made here.
func (s *Service) probeOverlay() error {
	dir, err := os.MkdirTemp(s.dir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, sub := range []string{"lower", "upper", "work", "mnt"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", filepath.Join(dir, "mnt"), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return unix.Unmount(filepath.Join(dir, "mnt"), unix.MNT_DETACH)
}

// Clone makes a copy-on-write copy of volume v, frozen (Freeze) just
// before: a new volume of v's team over v's layers, named after v (cut to
// fit) with a random suffix.
// A volume with no layers (it was empty when frozen) gets an empty copy.
func (s *Service) Clone(ctx context.Context, v *store.Volume) (*store.Volume, error) {
	if err := s.checkTeamRoom(ctx, v.TeamID); err != nil {
		return nil, err
	}
	// Until its record holds them, the layers must not be removed.
	s.layersMu.RLock()
	defer s.layersMu.RUnlock()
	name := fmt.Sprintf("%s-copy-%s", v.Name[:min(len(v.Name), 40)], strings.ToLower(rand.Text()[:8]))
	if s.pool != nil {
		// A snapshot of the frozen one: its own files, sharing every
		// block until written, bounded as its source.
		return s.create(ctx, v.TeamID, name, nil, v.SizeBytes, s.layerDir(v.Layers[0]))
	}
	return s.create(ctx, v.TeamID, name, v.Layers, 0, "")
}

// Copy makes a copy-on-write copy of volume id as it is now: a volume of
// its own, of the same team, named <name>-copy-<suffix>. A gateway moves
// such a copy to another node for a fork's children there. Without a
// volume pool no sandbox may mount the volume meanwhile (see Freeze).
func (s *Service) Copy(ctx context.Context, id string) (*store.Volume, error) {
	fv, err := s.Freeze(ctx, id, "")
	if err != nil {
		return nil, err
	}
	defer s.Release(context.WithoutCancel(ctx), fv)
	return s.Clone(ctx, fv)
}

// removeUnheldLayers removes the files of those of layers no volume holds
// (by reference, or by naming them in its record).
func (s *Service) removeUnheldLayers(ctx context.Context, layers []string) {
	s.layersMu.Lock()
	defer s.layersMu.Unlock()
	unheld, err := s.records.UnheldLayers(ctx, layers)
	if err != nil {
		s.logger.WarnContext(ctx, "layers no volume holds: kept until the next start", "err", err)
		return
	}
	for _, l := range unheld {
		if err := removeTree(s.layerDir(l)); err != nil {
			s.logger.WarnContext(ctx, "remove a layer no volume holds", "layer", l, "err", err)
		}
	}
}

// reconcileLayers finishes freezes a crash cut after their record
// (dropping those cut before it), then removes layers no volume holds.
func (s *Service) reconcileLayers(ctx context.Context, kept map[string]*store.Volume) error {
	for id, v := range kept {
		marker := filepath.Join(s.dir, id, freezingMarker)
		b, err := os.ReadFile(marker)
		if err != nil {
			continue
		}
		layer := string(b)
		if len(v.Layers) > 0 && v.Layers[0] == layer {
			s.unmount(ctx, id)
			if err := s.finishFreeze(id, layer); err != nil {
				return fmt.Errorf("volumes: finish the freeze of %s: %w", id, err)
			}
			s.logger.InfoContext(ctx, "finished a freeze cut short", "volume", id, "layer", layer)
		}
		os.Remove(marker)
	}
	entries, err := os.ReadDir(s.layersDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	s.removeUnheldLayers(ctx, names)
	return nil
}
