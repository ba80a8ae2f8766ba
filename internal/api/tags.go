package api

import (
	"net/http"

	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/wire"
)

// E2B's template tags. aenv keeps one version of each template, so a tag
// names that version; "name:tag" resolves to the template whatever the
// tag (lookupAlias). The routes record which tags were given.

func (s *Server) routeTags() {
	s.route("POST /templates/tags", s.assignTags)
	s.route("DELETE /templates/tags", s.removeTags)
	// "GET /templates/{templateID}/tags" (and .../builds) would clash with
	// "GET /templates/aliases/{alias}" over /templates/aliases/tags
	// (neither is more specific), so the last segment is matched here; the
	// alias route stays the more specific one.
	s.route("GET /templates/{templateID}/{sub}", func(w http.ResponseWriter, r *http.Request) error {
		switch r.PathValue("sub") {
		case "tags":
			return s.listTags(w, r)
		case "builds":
			return s.listBuilds(w, r)
		}
		return &apiError{http.StatusNotFound, "no such endpoint: " + r.Method + " " + r.URL.Path}
	})
}

// assignTags is E2B's POST /templates/tags {"target": "name[:tag]",
// "tags"}: 201 {"buildID", "tags"}.
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) error {
	var req wire.AssignTemplateTags
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if err := template.CheckName(req.Target); err != nil {
		return badRequest("target: " + err.Error())
	}
	tpl, err := s.lookupAlias(r, req.Target)
	if err != nil {
		return err
	}
	if err := ownsTemplate(principal(r), tpl); err != nil {
		return err
	}
	buildID, err := s.cfg.Builds.AssignTags(tpl, req.Tags)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, wire.AssignedTemplateTags{BuildID: buildID, Tags: req.Tags})
	return nil
}

// removeTags is E2B's DELETE /templates/tags {"name", "tags"}: 204.
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) error {
	var req wire.DeleteTemplateTags
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if err := template.CheckName(req.Name); err != nil {
		return badRequest("name: " + err.Error())
	}
	tpl, err := s.lookupAlias(r, req.Name)
	if err != nil {
		return err
	}
	if err := ownsTemplate(principal(r), tpl); err != nil {
		return err
	}
	if err := s.cfg.Builds.RemoveTags(tpl.Name, req.Tags); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listTags is E2B's GET /templates/{templateID}/tags: 200 [{"tag",
// "buildID", "createdAt"}], oldest first.
func (s *Server) listTags(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("templateID")
	if err := template.CheckName(id); err != nil {
		return badRequest(err.Error())
	}
	tpl, err := s.lookupAlias(r, id)
	if err != nil {
		return err
	}
	tags, err := s.cfg.Builds.Tags(tpl.Name)
	if err != nil {
		return err
	}
	out := make([]wire.TemplateTag, 0, len(tags))
	for _, t := range tags {
		out = append(out, wire.TemplateTag{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
