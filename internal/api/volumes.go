package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

// routeVolumes registers E2B's volume routes: the records under the API
// key, and the content API, whose calls bear the volume's own token.
func (s *Server) routeVolumes() {
	if s.cfg.Volumes == nil {
		return
	}
	if s.cfg.VolumeRecords != nil {
		s.route("GET /volumes", s.listVolumes)
	}
	s.route("POST /volumes", s.createVolume)
	s.route("GET /volumes/{volumeID}", s.getVolume)
	s.route("DELETE /volumes/{volumeID}", s.deleteVolume)
	// A move between nodes: the gateway's calls (the cluster secret).
	s.route("GET /volumes/{volumeID}/export", s.operatorOnly(s.exportVolume))
	s.route("PUT /volumes/{volumeID}/import", s.operatorOnly(s.importVolume))
	s.route("DELETE /volumes/{volumeID}/files", s.operatorOnly(s.dropMovedVolume))
	// A copy to move to another node, for a fork's children there.
	s.route("POST /volumes/{volumeID}/copy", s.operatorOnly(s.copyVolume))
	for pattern, h := range map[string]func(http.ResponseWriter, *http.Request, *volume.Dir) error{
		"GET /volumecontent/{volumeID}/file":    s.readVolumeFile,
		"PUT /volumecontent/{volumeID}/file":    s.writeVolumeFile,
		"GET /volumecontent/{volumeID}/dir":     s.listVolumeDir,
		"POST /volumecontent/{volumeID}/dir":    s.makeVolumeDir,
		"GET /volumecontent/{volumeID}/path":    s.statVolumePath,
		"PATCH /volumecontent/{volumeID}/path":  s.updateVolumePath,
		"DELETE /volumecontent/{volumeID}/path": s.removeVolumePath,
	} {
		s.mux.Handle(pattern, s.volumeContent(h))
	}
}

// VolumeAnswer is volume v as the API answers it (its record's fields;
// no usage).
func VolumeAnswer(v *store.Volume) wire.VolumeAndToken {
	out := wire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token}
	if v.NodeID != "" {
		out.NodeID = &v.NodeID
	}
	if v.MovingTo != "" {
		out.MovingTo = &v.MovingTo
	}
	if v.SizeBytes > 0 {
		mb := v.SizeBytes >> 20
		out.SizeMB = &mb
	}
	return out
}

// listVolumes is GET /volumes, from the records: a node's, or a
// gateway's (the cluster's, every node's volumes).
func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	vs, err := s.cfg.VolumeRecords.ListVolumes(r.Context(), teamFilter(principal(r)))
	if err != nil {
		return err
	}
	out := make([]wire.Volume, 0, len(vs))
	for _, v := range vs {
		item := wire.Volume{VolumeID: v.ID, Name: v.Name}
		if v.NodeID != "" {
			item.NodeID = &v.NodeID
		}
		if v.MovingTo != "" {
			item.MovingTo = &v.MovingTo
		}
		out = append(out, item)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewVolume
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	var size int64
	if req.SizeMB != nil {
		if *req.SizeMB <= 0 || *req.SizeMB > 1<<30 {
			return badRequest("sizeMB must be a positive number of MiB")
		}
		size = *req.SizeMB << 20
	}
	v, err := s.cfg.Volumes.Create(r.Context(), principal(r).TeamID, req.Name, size)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, VolumeAnswer(v))
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	v, err := s.cfg.Volumes.Get(r.Context(), p.TeamID, p.Admin, r.PathValue("volumeID"))
	if err != nil {
		return err
	}
	out := VolumeAnswer(v)
	if u, ok := s.cfg.Volumes.UsageOf(v.ID); ok {
		out.UsedBytes = &u.Bytes
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	v, err := s.cfg.Volumes.Get(r.Context(), p.TeamID, p.Admin, r.PathValue("volumeID"))
	if err != nil {
		return err
	}
	if err := s.cfg.Volumes.Delete(r.Context(), v); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// volumeContent authenticates a content API call by the volume's token
// (Authorization: Bearer), opens the volume and runs h on it. Failed
// tokens count toward the address's failures, as bad keys do.
func (s *Server) volumeContent(h func(http.ResponseWriter, *http.Request, *volume.Dir) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.serveVolumeContent(w, r, h); err != nil {
			writeError(w, r, s.logger, contentError(err))
		}
	})
}

func (s *Server) serveVolumeContent(w http.ResponseWriter, r *http.Request, h func(http.ResponseWriter, *http.Request, *volume.Dir) error) error {
	if retry, blocked := s.authFails.Blocked(r); blocked {
		WriteTooManyAuthFailures(w, retry)
		return nil
	}
	token := BearerToken(r)
	v, err := s.cfg.Volumes.Authorize(r.Context(), r.PathValue("volumeID"), token)
	if err != nil {
		// Behind gateways (Authorize set) every call comes from one:
		// they count their clients' failures themselves, and counted here
		// one client's would block every other's.
		if errors.Is(err, errdefs.ErrUnauthenticated) && token != "" && s.cfg.Authorize == nil {
			s.authFails.Failed(r)
		}
		return err
	}
	if !r.URL.Query().Has("path") {
		return badRequest("query parameter path is required")
	}
	d, err := s.cfg.Volumes.Open(v)
	if err != nil {
		return err
	}
	defer d.Close()
	return h(w, r, d)
}

// contentError gives the content API's errors the API's kinds: a missing
// path is 404 (the E2B SDK's VolumePathNotFoundError), a full volume 507.
func contentError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return err // 413
	}
	if volume.IsUploadReadError(err) {
		// The client's body ended early or broke: its fault, not the
		// volume's (the old file is intact).
		return badRequest("the upload ended before its content did: " + err.Error())
	}
	for _, m := range []struct {
		from error
		kind error
	}{
		{volume.ErrTooMany, errdefs.ErrInvalidArgument},
		{volume.ErrNotFound, errdefs.ErrNotFound},
		{volume.ErrExists, errdefs.ErrConflict},
		{volume.ErrIsDir, errdefs.ErrInvalidArgument},
		{volume.ErrNotDir, errdefs.ErrInvalidArgument},
		{volume.ErrNotRegular, errdefs.ErrInvalidArgument},
		{volume.ErrInvalid, errdefs.ErrInvalidArgument},
		{volume.ErrNoSpace, errdefs.ErrInsufficientStorage},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %w", m.kind, err)
		}
	}
	return err
}

func toEntryStat(e volume.Entry) wire.VolumeEntryStat {
	return wire.VolumeEntryStat{Name: e.Name, Path: e.Path, Type: wire.VolumeEntryStatType(e.Type), Size: e.Size,
		Mode: e.Mode, Uid: e.UID, Gid: e.GID, Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
}

// contentOptions reads uid, gid, mode and force from the query.
func contentOptions(r *http.Request) (volume.Options, error) {
	q := r.URL.Query()
	var o volume.Options
	for _, f := range []struct {
		name string
		to   **uint32
	}{{"uid", &o.UID}, {"gid", &o.GID}, {"mode", &o.Mode}} {
		if !q.Has(f.name) || q.Get(f.name) == "" {
			continue
		}
		n, err := strconv.ParseUint(q.Get(f.name), 10, 32)
		if err != nil {
			return o, badRequest(fmt.Sprintf("query parameter %s must be an unsigned 32-bit integer", f.name))
		}
		v := uint32(n)
		*f.to = &v
	}
	if o.Mode != nil && *o.Mode > 0o7777 {
		return o, badRequest(fmt.Sprintf("mode %o: permission bits only (at most 07777)", *o.Mode))
	}
	if v := q.Get("force"); v != "" {
		force, err := strconv.ParseBool(v)
		if err != nil {
			return o, badRequest("query parameter force must be true or false")
		}
		o.Force = force
	}
	return o, nil
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	f, e, err := d.ReadFile(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
	w.WriteHeader(http.StatusOK)
	// Content-Length said Size: a file grown since is cut there.
	io.CopyN(w, f, e.Size)
	return nil
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	o, err := contentOptions(r)
	if err != nil {
		return err
	}
	if r.ContentLength > s.cfg.MaxFileBytes {
		// Refused before a byte is written.
		return &http.MaxBytesError{Limit: s.cfg.MaxFileBytes}
	}
	body := io.Reader(http.NoBody)
	if r.Body != nil {
		body = http.MaxBytesReader(w, r.Body, s.cfg.MaxFileBytes)
	}
	e, err := d.WriteFile(r.URL.Query().Get("path"), body, o)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryStat(e))
	return nil
}

func (s *Server) listVolumeDir(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListDepth {
			return badRequest(fmt.Sprintf("depth must be between 1 and %d", maxListDepth))
		}
		depth = n
	}
	entries, err := d.List(r.URL.Query().Get("path"), depth)
	if err != nil {
		return err
	}
	out := make([]wire.VolumeEntryStat, 0, len(entries))
	for _, e := range entries {
		out = append(out, toEntryStat(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// maxListDepth bounds a listing's recursion.
const maxListDepth = 32

func (s *Server) makeVolumeDir(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	o, err := contentOptions(r)
	if err != nil {
		return err
	}
	e, err := d.MakeDir(r.URL.Query().Get("path"), o)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toEntryStat(e))
	return nil
}

func (s *Server) statVolumePath(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	e, err := d.Stat(r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryStat(e))
	return nil
}

func (s *Server) updateVolumePath(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	var req wire.VolumeMetadata
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.Mode != nil && *req.Mode > 0o7777 {
		return badRequest(fmt.Sprintf("mode %o: permission bits only (at most 07777)", *req.Mode))
	}
	e, err := d.UpdateMetadata(r.URL.Query().Get("path"), volume.Metadata{UID: req.Uid, GID: req.Gid, Mode: req.Mode})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryStat(e))
	return nil
}

func (s *Server) removeVolumePath(w http.ResponseWriter, r *http.Request, d *volume.Dir) error {
	if err := d.Remove(r.URL.Query().Get("path")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// operatorOnly lets through only calls made with the node's own key (on
// a node of a cluster, the cluster secret its gateways call with): not
// an admin's API key.
func (s *Server) operatorOnly(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if !s.isOperatorKey(RequestKey(r)) {
			return errdefs.Errorf(errdefs.ErrPermissionDenied, "only the cluster's gateways move volumes")
		}
		return h(w, r)
	}
}

// exportVolume streams a volume being moved from this node as a tar. A
// failure once bytes are sent aborts the answer, so that the receiver
// never takes a cut stream for a whole one.
func (s *Server) exportVolume(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/x-tar")
	sw := &startedWriter{w: w}
	// Hard links as links only for an importer that reads them (the
	// gateway knows its release).
	err := s.cfg.Volumes.Export(r.Context(), r.PathValue("volumeID"), sw, r.URL.Query().Get("links") == "1")
	if err != nil && sw.started {
		s.logger.WarnContext(r.Context(), "volume export cut", "volume", r.PathValue("volumeID"), "err", err)
		panic(http.ErrAbortHandler)
	}
	return err
}

// startedWriter tells whether anything was written through it.
type startedWriter struct {
	w       io.Writer
	started bool
}

func (s *startedWriter) Write(b []byte) (int, error) {
	s.started = true
	return s.w.Write(b)
}

// importVolume takes a volume moving to this node from the tar in the
// body (another node's export), and answers it as now kept here.
func (s *Server) importVolume(w http.ResponseWriter, r *http.Request) error {
	token, err := strconv.ParseInt(r.URL.Query().Get("move"), 10, 64)
	if err != nil {
		return badRequest("query parameter move (the move's token) is required")
	}
	v, err := s.cfg.Volumes.Import(r.Context(), r.PathValue("volumeID"), token, r.Body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, VolumeAnswer(v))
	return nil
}

// copyVolume makes a copy-on-write copy of a volume, as it is now, and
// answers it (201).
func (s *Server) copyVolume(w http.ResponseWriter, r *http.Request) error {
	// Only for the team the gateway acts for: another team's volume is
	// not found.
	p := principal(r)
	src, err := s.cfg.Volumes.Get(r.Context(), p.TeamID, false, r.PathValue("volumeID"))
	if err != nil {
		return err
	}
	v, err := s.cfg.Volumes.Copy(r.Context(), src.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, VolumeAnswer(v))
	return nil
}

// dropMovedVolume removes this node's files of a volume moved away.
func (s *Server) dropMovedVolume(w http.ResponseWriter, r *http.Request) error {
	if err := s.cfg.Volumes.DropMoved(r.Context(), r.PathValue("volumeID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
