package volume

// Moving a volume to another node of a cluster. A gateway begins the move
// in the cluster's database (the volume is then mounted nowhere, and no
// sandbox may mount it), streams the volume's files as a tar from the
// node that keeps it (Export) to the node it goes to (Import), which
// makes them its own and finishes the move in the database: the commit
// point. The node left then removes its copy (DropMoved), or its next
// start does.
//
// Crash safety: the source marks the volume's directory exporting; a start
// that finds the mark removes the files if the record has gone elsewhere
// (or is gone), and otherwise ends the move it was part of. The target
// makes the files pending, as a create does, until the record is its.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/treetar"
	"golang.org/x/sys/unix"
)

// exportingMarker, in a volume's directory, says its files are being
// sent to another node.
const exportingMarker = "exporting"

// mover is the records' side of a move, nil on a single server.
func (s *Service) mover() (store.VolumeMover, error) {
	m, ok := s.records.(store.VolumeMover)
	if !ok || s.nodeID == "" {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "volumes move between the nodes of a cluster only")
	}
	return m, nil
}

// Export writes volume id's files to w as a tar (internal/treetar: a
// volume's content, without FIFOs, sockets or devices; hard links as
// links when links, else as files of their own, for an importer that
// does not read links), for the move the records say it is in. Content
// calls under way end first; the others are refused from then until the
// move ends, and the volume stays here until then.
func (s *Service) Export(ctx context.Context, id string, w io.Writer, links bool) error {
	if _, err := s.mover(); err != nil {
		return err
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", id)
	}
	if err != nil {
		return err
	}
	if !s.Local(v) || v.MovingTo == "" {
		return errdefs.Errorf(errdefs.ErrConflict, "volume %s is not being moved from this node (kept by %s, moving to %q)",
			id, v.NodeID, v.MovingTo)
	}
	// Content calls that get in after the export (one that read the
	// record before the move began waits for the lock below) must not
	// write what the other node would never see. The mark names this
	// move, so that a call that saw an earlier move end clears only that
	// one's.
	s.exportingMu.Lock()
	err = os.WriteFile(filepath.Join(s.dir, id, exportingMarker), []byte(v.MovingTo), 0o600)
	if err == nil {
		s.exporting[id] = v.MoveToken
	}
	s.exportingMu.Unlock()
	if err != nil {
		return fmt.Errorf("export volume %s: %w", id, err)
	}
	lock := s.freezeLock(id)
	lock.Lock()
	defer lock.Unlock()
	files, _, err := s.files(v)
	if err != nil {
		return fmt.Errorf("export volume %s: %w", id, err)
	}
	_, err = treetar.Write(ctx, files, w, treetar.Options{NoHardLinks: !links})
	if err != nil {
		// The move cannot end with these files: no start need look.
		s.exportingMu.Lock()
		if s.exporting[id] == v.MoveToken {
			os.Remove(filepath.Join(s.dir, id, exportingMarker))
		}
		s.exportingMu.Unlock()
		return fmt.Errorf("export volume %s: %w", id, err)
	}
	return nil
}

// checkNotExported refuses a content call on volume id once an export
// of it has begun here, unless its record says the move ended without it
// (aborted): then, with clear, the mark goes (unless a later export has
// marked it since).
func (s *Service) checkNotExported(ctx context.Context, id string, clear bool) error {
	s.exportingMu.Lock()
	token, exported := s.exporting[id]
	s.exportingMu.Unlock()
	if !exported {
		return nil
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err == nil && s.Local(v) && v.MovingTo == "" {
		if clear {
			s.exportingMu.Lock()
			if now, ok := s.exporting[id]; ok && now == token {
				delete(s.exporting, id)
				os.Remove(filepath.Join(s.dir, id, exportingMarker))
			}
			s.exportingMu.Unlock()
		}
		return nil
	}
	return errdefs.Errorf(errdefs.ErrUnavailable, "volume %s is moving to another node: try again in a moment", id)
}

// Import makes volume id, moving to this node by the move of token, from
// the tar r (Export's), then finishes the move in the records: from then
// on the volume is this node's. On failure nothing of it is left here,
// unless the records cannot tell whether the move finished: then its
// files stay, pending, for the next start to keep (the record is this
// node's) or remove.
func (s *Service) Import(ctx context.Context, id string, token int64, r io.Reader) (*store.Volume, error) {
	m, err := s.mover()
	if err != nil {
		return nil, err
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %s not found", id)
	}
	if err != nil {
		return nil, err
	}
	if v.MovingTo != s.nodeID || s.Local(v) || v.MoveToken != token {
		return nil, errdefs.Errorf(errdefs.ErrConflict, "volume %s is not moving to this node by this move (kept by %s, moving to %q)",
			id, v.NodeID, v.MovingTo)
	}
	moved := *v
	moved.NodeID, moved.MovingTo, moved.Layers = s.nodeID, "", nil
	if s.pool == nil {
		moved.SizeBytes = 0
	} else if moved.SizeBytes, err = s.sizeOf(moved.SizeBytes); err != nil {
		return nil, err
	}
	if err := s.checkDisk(); err != nil {
		return nil, err
	}
	// Made here and now, or not at all: two imports never share files.
	if err := os.Mkdir(filepath.Join(s.dir, id), 0o700); errors.Is(err, fs.ErrExist) {
		return nil, errdefs.Errorf(errdefs.ErrConflict, "volume %s has files on this node already", id)
	} else if err != nil {
		return nil, fmt.Errorf("import volume %s: %w", id, err)
	}
	if err := s.makePending(id); err != nil {
		os.RemoveAll(filepath.Join(s.dir, id))
		return nil, fmt.Errorf("import volume %s: %w", id, err)
	}
	err = s.makeData(&moved, nil, "")
	if err == nil {
		_, err = treetar.Read(ctx, r, s.dataDir(id), treetar.Options{})
	}
	if err == nil {
		// Durable before the commit: the other node drops its copy then.
		err = syncFS(s.dataDir(id))
	}
	if err == nil {
		// The commit: made whether or not the caller still waits.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = m.FinishVolumeMove(fctx, id, v.NodeID, s.nodeID, token, moved.SizeBytes)
		cancel()
		switch {
		case errors.Is(err, store.ErrConflict):
			err = errdefs.Errorf(errdefs.ErrConflict, "the move of volume %s ended meanwhile (aborted, taken over, or the volume was mounted)", id)
		case err != nil:
			// Committed or not? The record says; unread, the files stay
			// pending for the next start to judge.
			got, gerr := s.records.GetVolume(context.WithoutCancel(ctx), "", id)
			if gerr != nil || s.Local(got) {
				if gerr == nil {
					os.Remove(filepath.Join(s.dir, id, pendingMarker))
					return got, nil
				}
				return nil, fmt.Errorf("import volume %s: finished or not, its files stay here until the next start tells: %w", id, err)
			}
		}
	}
	if err != nil {
		if rerr := removeTree(filepath.Join(s.dir, id)); rerr != nil {
			s.logger.WarnContext(ctx, "a failed import's files are removed at the next start", "volume", id, "err", rerr)
		}
		return nil, fmt.Errorf("import volume %s: %w", id, err)
	}
	if err := os.Remove(filepath.Join(s.dir, id, pendingMarker)); err != nil {
		s.logger.WarnContext(ctx, "volume moved here; its pending mark stays until the next start", "volume", id, "err", err)
	}
	return &moved, nil
}

// syncFS makes the writes to the file system holding dir durable.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// DropMoved removes this node's files of volume id once its record says
// it is kept elsewhere (or is gone), with the layers no volume holds any
// more.
func (s *Service) DropMoved(ctx context.Context, id string) error {
	if !ValidID(id) {
		return errdefs.Errorf(errdefs.ErrNotFound, "volume %q not found", id)
	}
	v, err := s.records.GetVolume(ctx, "", id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err == nil && s.Local(v) {
		return errdefs.Errorf(errdefs.ErrConflict, "volume %s is still this node's", id)
	}
	s.dropFiles(ctx, id)
	return nil
}

// dropFiles removes volume id's files here, and the layers no volume
// holds any more.
func (s *Service) dropFiles(ctx context.Context, id string) {
	lock := s.freezeLock(id)
	lock.Lock()
	s.unmount(ctx, id)
	err := removeTree(filepath.Join(s.dir, id))
	lock.Unlock()
	if err != nil {
		s.logger.WarnContext(ctx, "remove a moved volume's files", "volume", id, "err", err)
	}
	s.forgetUsage(id)
	s.exportingMu.Lock()
	delete(s.exporting, id)
	s.exportingMu.Unlock()
	if entries, err := os.ReadDir(s.layersDir()); err == nil {
		var names []string
		for _, e := range entries {
			// Layers of copy-on-write volumes only: a pool's frozen
			// snapshots belong to forks under way, and no record holds
			// them.
			if strings.HasPrefix(e.Name(), "layer-") {
				names = append(names, e.Name())
			}
		}
		s.removeUnheldLayers(ctx, names)
	}
}

// reconcileMoves, at start, deals with the moves a crash cut: files sent
// elsewhere whose record left are removed; a move from here that did not
// end is ended (its stream died with the previous process).
func (s *Service) reconcileMoves(ctx context.Context, kept map[string]*store.Volume) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !ValidID(id) {
			continue
		}
		marker := filepath.Join(s.dir, id, exportingMarker)
		if _, err := os.Stat(marker); err != nil {
			continue
		}
		v := kept[id]
		if v == nil {
			// Removed only when its record says where it went: files of
			// a volume with no record here are kept (see reconcile).
			if other, err := s.records.GetVolume(ctx, "", id); err == nil && other.NodeID != s.nodeID && other.NodeID != "" {
				s.dropFiles(ctx, id)
				s.logger.InfoContext(ctx, "removed a volume's files that moved to another node", "volume", id, "node", other.NodeID)
			}
			continue
		}
		// Its stream died with the previous process: the move cannot end.
		if m, err := s.mover(); err == nil && v.MovingTo != "" {
			if err := m.AbortVolumeMove(ctx, id, v.MoveToken); err != nil {
				s.logger.WarnContext(ctx, "end a move cut short", "volume", id, "err", err)
				continue
			}
		}
		os.Remove(marker)
	}
}
