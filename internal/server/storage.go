package server

import (
	"context"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
)

// storedBytes is what this node keeps stored for each team, for its usage
// by day (usage.StorageSource): its snapshots' and templates of
// sandboxes' images, as recorded, and its volumes' files, as last
// measured. Templates built from images and the images of sandboxes
// paused to disk are not counted: neither has a recorded size.
type storedBytes struct {
	st      store.Store
	volumes *volume.Service // nil without volumes
}

func (s storedBytes) StoredBytes(ctx context.Context) (map[string]int64, error) {
	out, err := s.st.TeamImageBytes(ctx)
	if err != nil {
		return nil, err
	}
	if s.volumes != nil {
		for team, n := range s.volumes.TeamBytes() {
			out[team] += n
		}
	}
	return out, nil
}
