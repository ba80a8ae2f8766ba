package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/wire"
)

// getTemplateAlias is E2B's alias check (Template.exists and aliasExists):
// 200 with the template when a template, image template or snapshot goes
// by that name (or ID), 404 when none does.
func (s *Server) getTemplateAlias(w http.ResponseWriter, r *http.Request) error {
	alias := r.PathValue("alias")
	if err := template.CheckName(alias); err != nil {
		return badRequest(err.Error())
	}
	tpl, err := s.lookupAlias(r, alias)
	if err != nil {
		return err
	}
	// Public says whether every team may use the template; on a node only
	// the base template is shared by nature.
	writeJSON(w, http.StatusOK, wire.TemplateAlias{TemplateID: tpl.ID, Public: tpl.Name == template.BaseName})
	return nil
}

// lookupAlias finds the template a name refers to. E2B names may carry a
// build tag ("name:tag") that does not change which template is meant;
// aenv names may contain colons themselves, so the whole name is tried
// first.
func (s *Server) lookupAlias(r *http.Request, alias string) (*store.Template, error) {
	tpl, err := s.catalog.GetTemplate(r.Context(), alias)
	if errors.Is(err, node.ErrNotFound) {
		if name, _, tagged := cutTag(alias); tagged {
			tpl, err = s.catalog.GetTemplate(r.Context(), name)
		}
	}
	if err == nil && !principal(r).Uses(tpl.TeamID) {
		err = node.ErrNotFound // another team's: as if it did not exist
	}
	if errors.Is(err, node.ErrNotFound) {
		return nil, fmt.Errorf("%w: template alias %q", node.ErrNotFound, alias)
	}
	return tpl, err
}

// cutTag splits "name:tag" at its last colon.
func cutTag(alias string) (name, tag string, ok bool) {
	i := strings.LastIndexByte(alias, ':')
	if i <= 0 || i == len(alias)-1 {
		return alias, "", false
	}
	return alias[:i], alias[i+1:], true
}

// untagged drops a build tag from a template name ("name:tag") that only
// names a template without it: a template has one version, which every
// tag of it names.
func (s *Server) untagged(r *http.Request, name string) string {
	if !strings.Contains(name, ":") {
		return name // the common case costs no lookup
	}
	if tpl, err := s.lookupAlias(r, name); err == nil && tpl.Name != name && tpl.ID != name {
		return tpl.Name
	}
	return name
}
