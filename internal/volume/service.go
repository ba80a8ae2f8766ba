package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
)

// IDPrefix starts every volume's ID; names may not, so that an ID and a
// name never meet.
const IDPrefix = "vol-"

// TokenPrefix starts every content API token: not shaped like an API key,
// so that proxies pass it on rather than strip it as one.
const TokenPrefix = "vtok_"

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
}

// NewService opens the volumes kept under dir, and removes the
// directories of volumes whose record is gone (a delete or a create cut
// short by a crash).
func NewService(ctx context.Context, records store.VolumeStore, dir, nodeID string, logger *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	s := &Service{records: records, dir: dir, nodeID: nodeID, logger: logger}
	if err := s.reconcile(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Service) reconcile(ctx context.Context) error {
	all, err := s.records.ListVolumes(ctx, "")
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	kept := map[string]bool{}
	for _, v := range all {
		if v.NodeID == s.nodeID {
			kept[v.ID] = true
		}
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	for _, e := range entries {
		if kept[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("volumes: remove %s, which has no record: %w", e.Name(), err)
		}
		s.logger.InfoContext(ctx, "removed a volume's files left without its record", "volume", e.Name())
	}
	for id := range kept {
		// A record whose files are gone (a data dir restored without
		// them): an empty volume, rather than one that fails every use.
		if err := os.MkdirAll(s.dataDir(id), 0o755); err != nil {
			return fmt.Errorf("volumes: %w", err)
		}
	}
	return nil
}

func (s *Service) dataDir(id string) string { return filepath.Join(s.dir, id, "data") }

// Create makes an empty volume named name for team.
func (s *Service) Create(ctx context.Context, team, name string) (*store.Volume, error) {
	if !validName.MatchString(name) || strings.HasPrefix(name, IDPrefix) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument,
			"volume name %q: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit, and not with %q",
			name, IDPrefix)
	}
	v := &store.Volume{ID: IDPrefix + strings.ToLower(rand.Text()[:20]), Name: name, TeamID: team,
		Token: TokenPrefix + rand.Text() + rand.Text(), NodeID: s.nodeID, CreatedAt: time.Now().UTC()}
	// The files first: a record is never without them, and files
	// without a record are removed at the next start.
	if err := os.MkdirAll(s.dataDir(v.ID), 0o755); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := s.records.CreateVolume(ctx, v); err != nil {
		os.RemoveAll(filepath.Join(s.dir, v.ID))
		if errors.Is(err, store.ErrConflict) {
			return nil, errdefs.Errorf(errdefs.ErrConflict, "team %s has a volume named %q already", team, name)
		}
		return nil, err
	}
	return v, nil
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

// List lists team's volumes, every team's for "".
func (s *Service) List(ctx context.Context, team string) ([]*store.Volume, error) {
	return s.records.ListVolumes(ctx, team)
}

// Delete deletes v and its files: the record first, so that a crash in
// between leaves files without a record, which the next start removes.
func (s *Service) Delete(ctx context.Context, v *store.Volume) error {
	if err := s.records.DeleteVolume(ctx, v.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", v.ID)
		}
		return err
	}
	if err := os.RemoveAll(filepath.Join(s.dir, v.ID)); err != nil {
		s.logger.WarnContext(ctx, "volume deleted; its files are removed at the next start", "volume", v.ID, "err", err)
	}
	return nil
}

// Authorize finds volume id for a content API call bearing token. An
// unknown volume and a wrong token get the same answer (401), so that
// neither tells whether the volume exists.
func (s *Service) Authorize(ctx context.Context, id, token string) (*store.Volume, error) {
	notFound := errdefs.Errorf(errdefs.ErrUnauthenticated, "invalid token for volume %q (Authorization: Bearer <the volume's token>)", id)
	if !strings.HasPrefix(id, IDPrefix) || token == "" {
		return nil, notFound
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound
	}
	if err != nil {
		return nil, err
	}
	if v.ID != id || subtle.ConstantTimeCompare([]byte(v.Token), []byte(token)) != 1 {
		return nil, notFound
	}
	return v, nil
}

// Local reports whether v's files are on this node.
func (s *Service) Local(v *store.Volume) bool { return v.NodeID == s.nodeID }

// Open opens v's content; the caller closes it.
func (s *Service) Open(v *store.Volume) (*Dir, error) {
	if !s.Local(v) {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "volume %s is on node %s, not this one", v.ID, v.NodeID)
	}
	return Open(s.dataDir(v.ID))
}
