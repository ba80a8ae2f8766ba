package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/volume"
	"github.com/aenv-dev/aenv/internal/wire"
)

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	var req wire.PauseRequest
	if err := decodeOptionalJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	opts := node.PauseOptions{ToDisk: req.ToDisk, DropMemory: req.Memory != nil && !*req.Memory}
	if err := s.sandboxes.Pause(r.Context(), r.PathValue("id"), opts); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resumeSandbox is the seed's and E2B's legacy resume: 201 with the
// Sandbox body, 409 when it is already running.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	timeout, reboot, err := s.resumeBody(w, r)
	if err != nil {
		return err
	}
	sb, wasPaused, err := s.sandboxes.Resume(r.Context(), r.PathValue("id"), timeout, reboot)
	if err != nil {
		return err
	}
	if !wasPaused {
		return &apiError{http.StatusConflict, fmt.Sprintf("sandbox %s is already running", sb.ID)}
	}
	writeJSON(w, http.StatusCreated, s.toSandboxJSON(sb))
	return nil
}

// connectSandbox is E2B's connect: resume a paused sandbox (201), or for a
// running one extend (never shorten) its deadline (200).
func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request) error {
	timeout, reboot, err := s.resumeBody(w, r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, wasPaused, err := s.sandboxes.Resume(r.Context(), id, timeout, reboot)
	if err != nil {
		return err
	}
	if wasPaused {
		writeJSON(w, http.StatusCreated, s.toSandboxJSON(sb))
		return nil
	}
	if timeout > 0 && time.Until(sb.EndAt) < timeout {
		if err := s.sandboxes.SetTimeout(r.Context(), id, timeout); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, s.toSandboxJSON(sb))
	return nil
}

// resumeBody reads {"timeout"?, "memory"?} of resume and connect; memory
// false (E2B's onResume: 'reboot') resumes without the processes.
func (s *Server) resumeBody(w http.ResponseWriter, r *http.Request) (time.Duration, bool, error) {
	var req wire.ResumeRequest
	if err := decodeOptionalJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return 0, false, err
	}
	reboot := req.Memory != nil && !*req.Memory
	// E2B's minimum is 0; 0, like an absent timeout, resumes with the
	// sandbox's own lifetime and never shortens a running one's.
	if req.Timeout == nil {
		return 0, reboot, nil
	}
	timeout, err := sandboxTimeout(*req.Timeout, s.cfg.MaxSandboxTimeout)
	return timeout, reboot, err
}

func toSnapshotJSON(t *store.Template) wire.Snapshot {
	names := []string{}
	if t.Named() {
		names = append(names, t.Name)
	}
	return wire.Snapshot{SnapshotID: t.ID, Names: names, SandboxID: t.SourceSandbox, CreatedAt: t.CreatedAt,
		Upload: wire.UploadState(t.Upload), UploadError: t.UploadError,
		Bytes: t.ImageStats.Bytes, StoredBytes: t.ImageStats.NewBytes, ParentID: t.ImageStats.Parent}
}

// getSnapshot is GET /snapshots/{id}: a snapshot of the caller's team, by
// ID or name.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	t, err := s.catalog.GetTemplate(r.Context(), id)
	if err == nil && (t.Kind != store.KindSnapshot || !principal(r).Uses(t.TeamID)) {
		err = store.ErrNotFound // a template, or another team's: no such snapshot
	}
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, node.ErrNotFound) {
		return fmt.Errorf("%w: snapshot %q", node.ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toSnapshotJSON(t))
	return nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewSnapshot
	if err := decodeOptionalJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if err := s.nameFree(r.Context(), principal(r), req.Name); err != nil {
		return err
	}
	tpl, err := s.sandboxes.Snapshot(r.Context(), node.SnapshotRequest{
		SandboxID: r.PathValue("id"), Name: req.Name, Kind: store.KindSnapshot,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toSnapshotJSON(tpl))
	return nil
}

// listSnapshots serves E2B's snapshot list, newest first, paged.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	f := store.SnapshotFilter{TeamID: teamFilter(principal(r)), SourceSandbox: q.Get("sandboxID"),
		Name: q.Get("name"), Limit: limit + 1} // one more: whether more follow
	if tok := q.Get("nextToken"); tok != "" {
		at, id, err := parsePageToken(tok)
		if err != nil {
			return err
		}
		f.After = &store.ListCursor{At: at, ID: id}
	}
	snaps, err := s.catalog.ListSnapshots(r.Context(), f)
	if err != nil {
		return err
	}
	if len(snaps) > limit {
		snaps = snaps[:limit]
		last := snaps[len(snaps)-1]
		w.Header().Set("X-Next-Token", pageToken(last.CreatedAt, last.ID))
	}
	out := make([]wire.Snapshot, 0, len(snaps))
	for _, t := range snaps {
		out = append(out, toSnapshotJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// toTemplateJSON is a template as the API shows it. BuildStatus, E2B's
// state of the template's newest build here, is the caller's to fill.
func toTemplateJSON(t *store.Template) wire.Template {
	out := wire.Template{TemplateID: t.ID, Aliases: []string{}, Kind: wire.TemplateKind(t.Kind), CpuCount: t.VCPU,
		MemoryMB: t.MemoryMB, CreatedAt: t.CreatedAt, SourceSandboxID: t.SourceSandbox,
		Upload: wire.UploadState(t.Upload), UploadError: t.UploadError}
	if t.Named() {
		out.Name = t.Name
		out.Aliases = []string{t.Name}
	}
	return out
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	all, err := s.catalog.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	out := make([]wire.Template, 0, len(all))
	p := principal(r)
	builds := map[string]string{}
	if s.cfg.Builds != nil {
		builds = s.cfg.Builds.BuildStatuses()
	}
	var building []store.BuildProgress
	if s.cfg.Building != nil {
		building = s.cfg.Building()
	}
	for _, b := range building {
		if builds[b.Template] == "" {
			builds[b.Template] = b.Status // a gateway's: its nodes run the builds
		}
	}
	named := make(map[string]bool, len(all))
	for _, t := range all {
		named[t.Name] = true
		if !p.Uses(t.TeamID) {
			continue
		}
		j := toTemplateJSON(t)
		if t.Named() {
			j.BuildStatus = wire.TemplateBuildStatus(builds[t.Name])
		}
		out = append(out, j)
	}
	// A template whose first build runs has no record yet: it is listed
	// with its build's status, as E2B lists it from its create on (by
	// its name: the ID of its record is made when the build ends).
	for _, b := range building {
		if named[b.Template] || !p.Uses(b.TeamID) {
			continue
		}
		named[b.Template] = true // one entry, if two nodes report it
		out = append(out, wire.Template{TemplateID: b.Template, Name: b.Template, Aliases: []string{b.Template},
			Kind: wire.TemplateKind(store.KindSandboxTemplate), CpuCount: b.VCPU, MemoryMB: b.MemoryMB, CreatedAt: b.Created, BuildStatus: wire.TemplateBuildStatus(b.Status)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	t, err := s.catalog.GetTemplate(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: template %q", node.ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toTemplateJSON(t))
	return nil
}

// createTemplate is the seed's template-from-sandbox: POST /templates
// {"sandboxID", "name"} → 201 {"templateID"}.
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewTemplate
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	switch {
	case req.SandboxID != "" && req.Image != "":
		return badRequest("give either sandboxID or image, not both")
	case req.Image != "":
		if err := s.nameFree(r.Context(), principal(r), req.Name); err != nil {
			return err
		}
		return s.buildImageTemplate(w, r, req.Image, req.Name, req.Platform)
	case req.SandboxID == "":
		return badRequest("sandboxID (or image) is required")
	}
	if err := s.checkSandboxID(r, principal(r), req.SandboxID); err != nil {
		return err
	}
	if err := s.nameFree(r.Context(), principal(r), req.Name); err != nil {
		return err
	}
	tpl, err := s.sandboxes.Snapshot(r.Context(), node.SnapshotRequest{
		SandboxID: req.SandboxID, Name: req.Name, Kind: store.KindSandboxTemplate,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, wire.TemplateRef{TemplateID: tpl.ID, Name: tpl.Name})
	return nil
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	tpl, err := s.catalog.GetTemplate(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.sandboxes.DeleteTemplate(r.Context(), tpl.ID); err != nil {
		return err
	}
	if s.cfg.Builds != nil && tpl.Named() {
		// A built template's cached steps go with it.
		s.cfg.Builds.Forget(r.Context(), tpl.Name)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkSandbox is E2B's fork: 201 with one {sandbox} or {error} per child.
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.fork(w, r, node.ForkRequest{SandboxID: r.PathValue("id")})
}

// forkSnapshot forks children from a named snapshot or template.
func (s *Server) forkSnapshot(w http.ResponseWriter, r *http.Request) error {
	return s.fork(w, r, node.ForkRequest{SnapshotID: r.PathValue("id"), TeamID: principal(r).TeamID})
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request, req node.ForkRequest) error {
	var body struct {
		wire.ForkRequest
		// CopySources are a gateway's (see node.ForkRequest), not in the
		// API's document.
		CopySources map[string]string `json:"copySources"`
	}
	if err := decodeOptionalJSON(w, r, s.cfg.MaxJSONBytes, &body); err != nil {
		return err
	}
	req.Count = 1
	if body.Count != nil {
		req.Count = *body.Count
	}
	for p, mode := range body.Volumes {
		switch mode {
		case "shared":
		case "copy":
			clean, err := volume.CheckMountPath(p)
			if err != nil {
				return badRequest("volumes: " + err.Error())
			}
			req.CopyVolumes = append(req.CopyVolumes, clean)
		default:
			return badRequest(fmt.Sprintf("volumes: mode of %s is %q; want shared or copy", p, mode))
		}
	}
	slices.Sort(req.CopyVolumes)
	req.CopyVolumes = slices.Compact(req.CopyVolumes) // "/w" and "/w/" are one
	if len(body.CopySources) > 0 {
		if !s.isOperatorKey(RequestKey(r)) || req.SnapshotID == "" {
			return badRequest("copySources: only a gateway's fork of a snapshot names them")
		}
		req.CopySources = map[string]string{}
		for p, id := range body.CopySources {
			clean, err := volume.CheckMountPath(p)
			if err != nil || !slices.Contains(req.CopyVolumes, clean) {
				return badRequest(fmt.Sprintf("copySources: %s is not a path the fork copies", p))
			}
			req.CopySources[clean] = id
		}
	}
	if body.Timeout != nil {
		if *body.Timeout <= 0 {
			return badRequest("timeout must be a positive number of seconds")
		}
		timeout, err := sandboxTimeout(*body.Timeout, s.cfg.MaxSandboxTimeout)
		if err != nil {
			return err
		}
		req.Timeout = timeout
	}
	results, err := s.sandboxes.Fork(r.Context(), req)
	if err != nil {
		return err
	}
	out := make([]wire.ForkResult, len(results))
	for i, res := range results {
		if res.Err != nil {
			status, msg := statusOf(res.Err)
			if status >= 500 {
				s.logger.ErrorContext(r.Context(), "fork child failed", "err", res.Err)
			}
			out[i].Error = &wire.Error{Code: status, Message: msg}
			continue
		}
		sb := s.toSandboxJSON(res.Sandbox)
		out[i].Sandbox = &sb
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
