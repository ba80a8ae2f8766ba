package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/diskspace"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// IDPrefix starts every volume's ID; names may not, so that an ID and a
// name never meet.
const IDPrefix = "vol-"

// TokenPrefix starts every content API token: not shaped like an API key,
// so that proxies pass it on rather than strip it as one.
const TokenPrefix = "vtok_"

// MaxTeamVolumes bounds a team's volumes.
const MaxTeamVolumes = 1000

// validID is a volume's ID: IDPrefix and 20 characters of lower-case
// base32.
var validID = regexp.MustCompile(`^vol-[a-z2-7]{20}$`)

// ValidID reports whether id is shaped like a volume's ID: callers check
// it before asking the database.
func ValidID(id string) bool { return validID.MatchString(id) }

// pendingMarker, in a volume's directory beside its data, says that the
// volume is being made or removed: files that have it and no record are a
// create or delete cut short, and are removed at the next start. Files
// without it and without a record are kept (a node started with another
// ID or database must not erase volumes it does not know).
const pendingMarker = "pending"

// validName is a volume's name: what fits in a path segment and a DNS
// label, as E2B's names do.
var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// Service keeps a node's volumes: their records (the node's store, or the
// cluster's) and their directories under dir, one per volume.
type Service struct {
	records store.VolumeStore
	dir     string
	nodeID  string // "" on a single server
	logger  *slog.Logger
	// pool is the volume pool mounted at dir, nil without one: then
	// volumes are plain directories, unbounded, and copies are overlays.
	pool *PoolConfig
	stop context.CancelFunc // ends the background sweep
	// freezing holds one lock per volume: a freeze holds it (write)
	// while it moves the volume's files into a layer; every open content
	// call, and every look-up of where to mount it, (read), since they
	// must not work where a layer is being made.
	freezingMu sync.Mutex
	freezing   map[string]*sync.RWMutex
	// layersMu keeps a removal of layers no volume holds from meeting a
	// clone that is about to hold them (write for the removal).
	layersMu sync.RWMutex
	// overlayErr says why overlay mounts do not work under dir (nil when
	// they do): copies are refused, rather than made and unmountable.
	overlayErr error
	// mountMu serialises the overlay mounts of layered volumes.
	mountMu sync.Mutex
	// usage is each local volume's usage, as last measured
	// (sampleUsage), layerBytes the frozen layers', and layerTeamBytes
	// those by the team of the volumes holding them.
	usageMu        sync.Mutex
	usage          map[string]measured
	layerBytes     int64
	layerTeamBytes map[string]int64
	measureMu      sync.Mutex // one measureAll at a time
	// exporting marks the volumes whose files an export has sent from
	// here (see checkNotExported).
	exportingMu sync.Mutex
	exporting   map[string]int64 // by the move's token
	// maxPerTeam bounds a team's volumes: MaxTeamVolumes.
	maxPerTeam int
	// minFreeBytes and minFreeFraction are the disk a new volume leaves
	// free at least (the larger of the two): MinFreeBytes, MinFreeFraction.
	minFreeBytes    uint64
	minFreeFraction float64
	sweeps          sync.WaitGroup
}

// NewService opens the volumes kept under dir, and removes the
// directories of volumes whose record is gone (a delete or a create cut
// short by a crash). With pool, dir is the mount of a volume pool (made
// and mounted here if need be).
func NewService(ctx context.Context, records store.VolumeStore, dir, nodeID string, pool *PoolConfig, logger *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if pool != nil {
		if _, err := os.Stat(pool.Image); errors.Is(err, fs.ErrNotExist) {
			// A new pool is empty: records of volumes here would come
			// back empty from it (an image deleted, or volumes kept
			// without a pool before).
			if all, err := records.ListNodeVolumes(ctx, nodeID); err != nil {
				return nil, fmt.Errorf("volumes: %w", err)
			} else if len(all) > 0 {
				return nil, fmt.Errorf("volume pool: its image %s is missing, and %d volumes of this node have records (%s...): "+
					"restore the image, or start without --volume-pool-gb if they were kept without a pool", pool.Image, len(all), all[0].ID)
			}
		}
		if err := openPool(ctx, *pool, dir, logger); err != nil {
			return nil, err
		}
	}
	ctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &Service{records: records, dir: dir, nodeID: nodeID, logger: logger, stop: stop, maxPerTeam: MaxTeamVolumes,
		minFreeBytes: MinFreeBytes, minFreeFraction: MinFreeFraction, pool: pool}
	s.freezing = map[string]*sync.RWMutex{}
	s.exporting = map[string]int64{}
	if pool == nil {
		s.overlayErr = s.probeOverlay()
	}
	if err := s.reconcile(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// checkKind refuses to open volumes kept the other way: a pool's (sized)
// without the pool, whose mount point is then an empty directory where
// every volume would come back empty; or plain and layered ones in a
// pool, which would be unbounded, or lack their layers.
func (s *Service) checkKind(kept map[string]*store.Volume) error {
	for _, v := range kept {
		switch {
		case s.pool == nil && v.SizeBytes > 0:
			return fmt.Errorf("volumes: volume %s (%s) was kept in a volume pool: start with --volume-pool-gb (its files are in the pool's image, not in %s)",
				v.ID, v.Name, s.dir)
		case s.pool != nil && (v.SizeBytes == 0 || len(v.Layers) > 0):
			return fmt.Errorf("volumes: volume %s (%s) was kept without a volume pool: start without --volume-pool-gb, "+
				"or copy its files out (aenv volume cp) and delete it first", v.ID, v.Name)
		}
	}
	return nil
}

func (s *Service) reconcile(ctx context.Context) error {
	all, err := s.records.ListNodeVolumes(ctx, s.nodeID)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	kept := map[string]*store.Volume{}
	for _, v := range all {
		if v.NodeID == s.nodeID {
			kept[v.ID] = v
		}
	}
	if err := s.checkKind(kept); err != nil {
		return err
	}
	s.reconcileMoves(ctx, kept)
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	for _, e := range entries {
		id := e.Name()
		if kept[id] != nil || !ValidID(id) {
			continue
		}
		if _, err := os.Stat(filepath.Join(s.dir, id, pendingMarker)); err != nil {
			s.logger.WarnContext(ctx, "kept a volume's files that have no record here: another node's or "+
				"another database's? remove them by hand if they are nobody's", "dir", filepath.Join(s.dir, id))
			continue
		}
		s.unmount(ctx, id) // a delete cut between its record and its unmount
		if err := removeTree(filepath.Join(s.dir, id)); err != nil {
			return fmt.Errorf("volumes: remove %s, made or removed only in part: %w", id, err)
		}
		s.logger.InfoContext(ctx, "removed a volume made or removed only in part", "volume", id)
	}
	for id := range kept {
		// A record whose files are gone (a data dir restored without
		// them): an empty volume, rather than one that fails every use.
		if _, err := os.Stat(s.dataDir(id)); errors.Is(err, fs.ErrNotExist) {
			if err := s.makeData(kept[id], nil, ""); err != nil {
				return fmt.Errorf("volumes: %w", err)
			}
		}
		// A create cut short after its record: it is whole now.
		os.Remove(filepath.Join(s.dir, id, pendingMarker))
	}
	if err := s.reconcileLayers(ctx, kept); err != nil {
		return err
	}
	s.sweeps.Add(2)
	go s.sweepUploads(ctx, kept, time.Now())
	go s.sampleUsage(ctx, UsageInterval)
	return nil
}

// sweepUploads removes the temporary files of uploads a previous process
// left, in the background (it walks every volume).
func (s *Service) sweepUploads(ctx context.Context, volumes map[string]*store.Volume, before time.Time) {
	defer s.sweeps.Done()
	for id, v := range volumes {
		d, err := s.Open(v)
		if err != nil {
			continue
		}
		n, err := d.SweepUploads(ctx, before)
		d.Close()
		if err != nil && ctx.Err() == nil {
			s.logger.WarnContext(ctx, "sweeping unfinished uploads", "volume", id, "err", err)
		}
		if n > 0 {
			s.logger.InfoContext(ctx, "removed unfinished uploads", "volume", id, "files", n)
		}
	}
}

// Close stops the background sweep and waits for it.
func (s *Service) Close() {
	s.stop()
	s.sweeps.Wait()
}

func (s *Service) dataDir(id string) string { return filepath.Join(s.dir, id, "data") }

// HostPath is where volume id's files are on this node, for a sandbox to
// mount, and whether that is an overlay mount (a layered volume): an
// error of kind ErrNotFound when this node does not keep it.
func (s *Service) HostPath(ctx context.Context, id string) (string, bool, error) {
	if !ValidID(id) {
		return "", false, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", id)
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return "", false, errdefs.Errorf(errdefs.ErrNotFound, "volume %s was deleted", id)
	}
	if err != nil {
		return "", false, err
	}
	if !s.Local(v) {
		return "", false, errdefs.Errorf(errdefs.ErrNotFound, "volume %s is on node %s, not this one", id, v.NodeID)
	}
	// A pending mark is not looked at: a delete marks the volume before
	// it finds it mounted (and refuses), and its sandboxes must go on
	// starting meanwhile. The caller's record holds the volume.
	lock := s.freezeLock(id)
	lock.RLock()
	defer lock.RUnlock()
	return s.files(v)
}

// MountedError is the answer to deleting volume v while holders (the
// sandboxes that mount it) hold it: a conflict that names them.
func MountedError(v *store.Volume, holders []store.Ref) error {
	return errdefs.Errorf(errdefs.ErrConflict,
		"volume %s is mounted by %s: kill the sandboxes (or wait for them to end) and delete the snapshots first",
		v.Name, holderList(holders))
}

// holderList names holders, the first ten of them: "sandbox ID" or
// "snapshot ID".
func holderList(holders []store.Ref) string {
	ids := make([]string, 0, len(holders))
	for _, h := range holders {
		kind := "sandbox"
		if h.HolderKind == store.RefTemplate {
			kind = "snapshot"
		}
		ids = append(ids, kind+" "+h.HolderID)
	}
	const shown = 10
	list := strings.Join(ids[:min(len(ids), shown)], ", ")
	if len(ids) > shown {
		list += fmt.Sprintf(" and %d more", len(ids)-shown)
	}
	return list
}

// makePending makes volume id's directory, if need be, and marks it
// pending.
func (s *Service) makePending(id string) error {
	if err := os.MkdirAll(filepath.Join(s.dir, id), 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.dir, id, pendingMarker), nil, 0o600)
}

// Create makes an empty volume named name for team, of size bytes at
// most (0: the pool's default), which only a pool can bound.
func (s *Service) Create(ctx context.Context, team, name string, size int64) (*store.Volume, error) {
	if !validName.MatchString(name) || strings.HasPrefix(name, IDPrefix) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"volume name %q: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit, and not with %q",
			name, IDPrefix)
	}

	size, err := s.sizeOf(size)
	if err != nil {
		return nil, err
	}
	if err := s.checkTeamRoom(ctx, team); err != nil {
		return nil, err
	}
	return s.create(ctx, team, name, nil, size, "")
}

// MinVolumeBytes is the smallest size a volume may be given.
const MinVolumeBytes = 1 << 20

// sizeOf checks a volume's asked size (0: none asked) and gives the one
// it will have.
func (s *Service) sizeOf(size int64) (int64, error) {
	if s.pool == nil {
		if size != 0 {
			return 0, errdefs.Errorf(errdefs.ErrInvalidArgument,
				"a volume's size is bounded only in a volume pool, which this node has none of (start it with --volume-pool-gb)")
		}
		return 0, nil
	}
	// The pool as it is (a pool never shrinks, so it may be larger than
	// asked).
	capacity := s.pool.Bytes
	if _, poolSize, err := diskspace.Free(s.dir); err == nil {
		capacity = poolSize
	}
	if size == 0 {
		size = int64(min(s.pool.DefaultVolumeBytes, capacity))
	}
	if size < MinVolumeBytes || uint64(size) > capacity {
		return 0, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"volume size %d MiB: from 1 MiB to the node's volume pool, %d MiB", size>>20, capacity>>20)
	}
	return size, nil
}

// Pooled reports whether volumes are kept in a volume pool.
func (s *Service) Pooled() bool { return s.pool != nil }

// MinFreeBytes and MinFreeFraction: no volume is made (or copied) on a
// disk with less free than the larger of the two, so that volumes do not
// take the disk the node's sandboxes, images and database need.
const (
	MinFreeBytes    = 1 << 30
	MinFreeFraction = 0.05
)

// checkDisk refuses a new volume when the disk under the volumes is
// nearly full (507).
func (s *Service) checkDisk() error {
	free, total, err := diskspace.Free(s.dir)
	if err != nil {
		return fmt.Errorf("volumes: free disk: %w", err)
	}
	floor := max(s.minFreeBytes, uint64(float64(total)*s.minFreeFraction))
	if s.pool != nil {
		// The pool holds volumes only: the node's own files are not in it.
		floor = uint64(float64(total) * s.minFreeFraction)
	}
	if free < floor {
		return errdefs.Errorf(errdefs.ErrInsufficientStorage,
			"the node's disk (or volume pool) has %d MiB free, and volumes are made only while %d MiB stay free: delete volumes or free the disk",
			free>>20, floor>>20)
	}
	return nil
}

// checkTeamRoom refuses a new volume of team past its bound: each is a
// directory and a record, and a key must not make them without end.
// It also refuses one on a disk nearly full.
func (s *Service) checkTeamRoom(ctx context.Context, team string) error {
	if err := s.checkDisk(); err != nil {
		return err
	}
	n, err := s.records.CountVolumes(ctx, team)
	if err != nil {
		return err
	}
	if n >= s.maxPerTeam {
		return errdefs.Errorf(errdefs.ErrResourceExhausted,
			"team %s has %d volumes, the most a team may have: delete some first", team, n)
	}
	return nil
}

// create makes volume name of team over layers (none for a plain one),
// or, in a pool, as a snapshot of subvolume from (when not "").
func (s *Service) create(ctx context.Context, team, name string, layers []string, size int64, from string) (*store.Volume, error) {
	v := &store.Volume{ID: IDPrefix + strings.ToLower(rand.Text()[:20]), Name: name, TeamID: team,
		Token: TokenPrefix + rand.Text() + rand.Text(), NodeID: s.nodeID, CreatedAt: time.Now().UTC(), Layers: layers,
		SizeBytes: size}
	// The files first, marked pending: a record is never without them,
	// and pending files without a record are removed at the next start.
	if err := s.makePending(v.ID); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := s.makeData(v, layers, from); err != nil {
		removeTree(filepath.Join(s.dir, v.ID))
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := s.records.CreateVolume(ctx, v); err != nil {
		removeTree(filepath.Join(s.dir, v.ID))
		if errors.Is(err, store.ErrConflict) {
			return nil, errdefs.Errorf(errdefs.ErrConflict, "team %s has a volume named %q already", team, name)
		}
		return nil, err
	}
	if err := os.Remove(filepath.Join(s.dir, v.ID, pendingMarker)); err != nil {
		s.logger.WarnContext(ctx, "volume made; its pending mark stays until the next start", "volume", v.ID, "err", err)
	}
	return v, nil
}

// makeData makes v's own files: a directory, or a subvolume of the pool
// (a snapshot of from, if given) bounded to v's size.
func (s *Service) makeData(v *store.Volume, layers []string, from string) error {
	data := s.dataDir(v.ID)
	if s.pool == nil {
		// The volume's top directory is open to every user of the
		// sandboxes that mount it (images run as different users: E2B's
		// templates as uid 1000); the directory above it keeps everyone
		// else on the host out. A clone's is as its top layer's.
		if err := os.MkdirAll(data, 0o755); err != nil {
			return err
		}
		return s.topLike(data, layers)
	}
	if err := os.MkdirAll(filepath.Dir(data), 0o700); err != nil {
		return err
	}
	if from != "" {
		// A snapshot's top directory is its source's.
		if err := snapshotSubvolume(from, data, false); err != nil {
			return err
		}
	} else {
		if err := createSubvolume(data); err != nil {
			return err
		}
		if err := os.Chmod(data, 0o777); err != nil {
			return err
		}
	}
	return limitSubvolume(data, uint64(v.SizeBytes))
}

// Get finds volume idOrName as p's team sees it: by ID, or by name in
// team; another team's is not found, unless admin.
func (s *Service) Get(ctx context.Context, team string, admin bool, idOrName string) (*store.Volume, error) {
	v, err := s.records.GetVolume(ctx, team, idOrName)
	if err == nil && !admin && v.TeamID != team {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", idOrName)
	}
	return v, err
}

// Delete deletes v and its files: marked pending, then the record, then
// the files, so that a crash in between leaves pending files without a
// record, which the next start removes. Layers no other volume holds go
// with it.
func (s *Service) Delete(ctx context.Context, v *store.Volume) error {
	if !s.Local(v) {
		return errdefs.Errorf(errdefs.ErrUnavailable, "volume %s is on node %s, not this one", v.ID, v.NodeID)
	}
	if err := s.makePending(v.ID); err != nil {
		return fmt.Errorf("delete volume %s: %w", v.ID, err)
	}
	holders, err := s.records.DeleteVolume(ctx, v.ID)
	if err != nil {
		os.Remove(filepath.Join(s.dir, v.ID, pendingMarker))
		switch {
		case errors.Is(err, store.ErrNotFound):
			return errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", v.ID)
		case errors.Is(err, store.ErrConflict):
			return MountedError(v, holders)
		}
		return err
	}
	s.unmount(ctx, v.ID)
	if err := removeTree(filepath.Join(s.dir, v.ID)); err != nil {
		s.logger.WarnContext(ctx, "volume deleted; its files are removed at the next start", "volume", v.ID, "err", err)
	}
	s.removeUnheldLayers(ctx, v.Layers)
	s.forgetUsage(v.ID)
	s.freezingMu.Lock()
	delete(s.freezing, v.ID)
	s.freezingMu.Unlock()
	return nil
}

// Authorize finds volume id for a content API call bearing token. An
// unknown volume and a wrong token get the same answer (401), so that
// neither tells whether the volume exists.
func (s *Service) Authorize(ctx context.Context, id, token string) (*store.Volume, error) {
	notFound := UnauthorizedError(id)
	if !ValidID(id) || token == "" {
		return nil, notFound
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound
	}
	if err != nil {
		return nil, err
	}
	if !TokenOpens(v, id, token) {
		return nil, notFound
	}
	return v, nil
}

// TokenOpens reports whether token opens the content of volume id, whose
// record (found by ID) is v.
func TokenOpens(v *store.Volume, id, token string) bool {
	return v.ID == id && token != "" && subtle.ConstantTimeCompare([]byte(v.Token), []byte(token)) == 1
}

// UnauthorizedError is the answer to a content call whose token does not
// open volume id, or whose volume does not exist: the same for both.
func UnauthorizedError(id string) error {
	return errdefs.Errorf(errdefs.ErrUnauthenticated, "invalid token for volume %q (Authorization: Bearer <the volume's token>)", id)
}

// Local reports whether v's files are on this node.
func (s *Service) Local(v *store.Volume) bool { return v.NodeID == s.nodeID }

// Open opens v's content; the caller closes it. A freeze of v waits for
// it to be closed.
func (s *Service) Open(v *store.Volume) (*Dir, error) {
	if !s.Local(v) {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "volume %s is on node %s, not this one", v.ID, v.NodeID)
	}
	// Refused at once while an export runs, rather than after waiting
	// for it to end; checked again under the lock, for an export that
	// began meanwhile (and only there is an ended export's mark cleared).
	if err := s.checkNotExported(context.Background(), v.ID, false); err != nil {
		return nil, err
	}
	lock := s.freezeLock(v.ID)
	lock.RLock()
	if err := s.checkNotExported(context.Background(), v.ID, true); err != nil {
		lock.RUnlock()
		return nil, err
	}
	files, _, err := s.files(v)
	if err != nil {
		lock.RUnlock()
		return nil, err
	}
	d, err := Open(files)
	if err != nil {
		lock.RUnlock()
		return nil, err
	}
	d.onClose = lock.RUnlock
	return d, nil
}
