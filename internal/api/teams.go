package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Headers with which an admin acts as one team: a gateway sends them with
// the cluster secret so that the node acts for the caller's team, and an
// operator may send them to act as a team themselves.
const (
	HeaderTeam  = "Aenv-Team"
	HeaderAdmin = "Aenv-Admin" // "1": the caller is an admin too
)

// MaxKeyLifetime bounds the lifetime a key may be given (ten years).
const MaxKeyLifetime = 10 * 365 * 24 * time.Hour

// ActAs is who r is made by when its key is p's: an admin naming a team
// in HeaderTeam acts as that team, an admin only if HeaderAdmin says so
// (what a gateway sends for an admin caller). A team's key's headers are
// ignored; an admin's malformed team is an error, never a silent fall
// back to acting as the admin.
func ActAs(r *http.Request, p auth.Principal) (auth.Principal, error) {
	team := r.Header.Get(HeaderTeam)
	if !p.Admin || team == "" {
		return p, nil
	}
	if err := auth.ValidTeamID(team); err != nil {
		return auth.Principal{}, fmt.Errorf("%s header: %w", HeaderTeam, err)
	}
	return auth.Principal{TeamID: team, KeyID: p.KeyID, KeyName: p.KeyName, Admin: r.Header.Get(HeaderAdmin) == "1"}, nil
}

// SetTeamHeaders makes h carry who p is, for a node that trusts the
// sender (the cluster secret goes with it).
func SetTeamHeaders(h http.Header, p auth.Principal) {
	h.Set(HeaderTeam, p.TeamID)
	if p.Admin {
		h.Set(HeaderAdmin, "1")
	} else {
		h.Del(HeaderAdmin)
	}
}

// principal is who r is made by. Routes are authenticated before their
// handler runs, so every request a handler sees has one; an internal call
// without one acts as the operator.
func principal(r *http.Request) auth.Principal {
	if p, ok := auth.FromContext(r.Context()); ok {
		return p
	}
	return auth.Operator()
}

// keyPrincipal finds who key acts for among the stored keys (a single
// server's; a gateway checks its cluster's itself).
func (s *Server) keyPrincipal(ctx context.Context, key string) (auth.Principal, bool) {
	if s.cfg.Teams == nil || !auth.LooksLikeKey(key) {
		return auth.Principal{}, false
	}
	k, err := s.cfg.Teams.KeyByDigest(ctx, auth.Digest(key))
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.logger.WarnContext(ctx, "cannot check an API key", "err", err)
		}
		return auth.Principal{}, false
	}
	now := time.Now()
	if !k.Usable(now) {
		return auth.Principal{}, false
	}
	if s.keyUses.Due(k.ID, now) {
		// Best effort: a key's last use is for people to read.
		if err := s.cfg.Teams.TouchKey(ctx, k.ID, now); err != nil {
			s.logger.DebugContext(ctx, "cannot record a key's use", "err", err)
		}
	}
	return auth.Principal{TeamID: k.TeamID, KeyID: k.ID, KeyName: k.Name, Admin: k.Admin}, true
}

// scoped wraps the handler of a route that names an object by ID so that
// a caller of another team finds nothing there: 404, the answer for an ID
// that does not exist, so that IDs leak nothing.
func (s *Server) scoped(pattern string, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	var check func(r *http.Request, p auth.Principal) error
	switch {
	case strings.Contains(pattern, "/sandboxes/{id}"):
		check = s.checkSandbox
	case strings.Contains(pattern, "/snapshots/{id}"):
		check = func(r *http.Request, p auth.Principal) error { return s.checkTemplate(r, p, false) }
	case strings.Contains(pattern, "/templates/{templateID}"):
		check = s.checkBuildTemplate
	case strings.Contains(pattern, "/templates/{id}"):
		check = func(r *http.Request, p auth.Principal) error {
			return s.checkTemplate(r, p, r.Method == http.MethodDelete)
		}
	default:
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		if p := principal(r); !p.Admin {
			if err := check(r, p); err != nil {
				return err
			}
		}
		return h(w, r)
	}
}

func (s *Server) checkSandbox(r *http.Request, p auth.Principal) error {
	return s.checkSandboxID(r, p, r.PathValue("id"))
}

// checkSandboxID finds sandbox id only if it is p's team's.
func (s *Server) checkSandboxID(r *http.Request, p auth.Principal, id string) error {
	if p.Admin {
		return nil
	}
	team, err := s.catalog.SandboxTeam(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return nil // the handler says so, in its words
	case err != nil:
		return err
	case !p.Sees(team):
		return errdefs.Errorf(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return nil
}

// visibleTemplate finds template idOrName as p may see it: nil (and no
// error) when there is none, a not-found error when it is another team's.
func (s *Server) visibleTemplate(ctx context.Context, p auth.Principal, idOrName string) (*store.Template, error) {
	t, err := s.catalog.GetTemplate(ctx, idOrName)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case !p.Uses(t.TeamID):
		return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
	}
	return t, nil
}

// checkTemplate lets p use template (or snapshot) id when it is its
// team's or public; change (delete) only its team's.
func (s *Server) checkTemplate(r *http.Request, p auth.Principal, change bool) error {
	t, err := s.visibleTemplate(r.Context(), p, r.PathValue("id"))
	if err != nil || t == nil || !change {
		return err
	}
	return ownsTemplate(p, t)
}

// ownsTemplate lets p change template t (delete it, tag it) when it is
// p's team's; a public one only an admin may change.
func ownsTemplate(p auth.Principal, t *store.Template) error {
	if !p.Sees(t.TeamID) {
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "template %q is public: only an admin may change it", t.Name)
	}
	return nil
}

// checkBuildTemplate lets p reach the builds of a template (by its name,
// E2B's template ID) only when the template, or while it has no record its
// newest build, is p's team's.
func (s *Server) checkBuildTemplate(r *http.Request, p auth.Principal) error {
	id := r.PathValue("templateID")
	t, err := s.visibleTemplate(r.Context(), p, id)
	if err != nil || t != nil || s.cfg.Builds == nil {
		return err
	}
	if team, ok := s.cfg.Builds.TeamOf(id); ok && !p.Sees(team) {
		return fmt.Errorf("%w: template %q", node.ErrNotFound, id)
	}
	return nil
}

// usableTemplate refuses a create from a template p may not use, as if it
// did not exist; one it cannot find is left for the node to answer.
func (s *Server) usableTemplate(ctx context.Context, p auth.Principal, idOrName string) error {
	if p.Admin || idOrName == "" {
		return nil
	}
	_, err := s.visibleTemplate(ctx, p, idOrName)
	return err
}

// nameFree refuses a name for a new template or snapshot when another
// team's template or build has it: a team's names are one namespace
// across the cluster (public ones, as "base", are each node's), and a name
// must not let one team replace or learn of another's template.
// The build service's own names are no one else's (build.ReservedName).
func (s *Server) nameFree(ctx context.Context, p auth.Principal, name string) error {
	if name == "" {
		return nil
	}
	if build.ReservedName(name) {
		return badRequest(fmt.Sprintf("%q is a name the build service keeps for its own templates (pulled images, cached steps)", name))
	}
	if template.Reserved(name) {
		return errdefs.Errorf(errdefs.ErrConflict, "%q is a built-in template's name", name)
	}
	if s.cfg.Builds != nil && !p.Admin {
		if team, ok := s.cfg.Builds.TeamOf(name); ok && !p.Sees(team) {
			return errdefs.Errorf(errdefs.ErrConflict, "template name %q is taken", name)
		}
	}
	t, err := s.catalog.TemplateNamed(ctx, name)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		// A name that is another template's ID would never find the new
		// one: lookups take an ID first. (Checked here for every caller,
		// admins too, and nowhere else.)
		if t, err := s.catalog.GetTemplate(ctx, name); err == nil && t.ID == name {
			return errdefs.Errorf(errdefs.ErrConflict, "template name %q is taken", name)
		}
		return nil
	case err != nil:
		return err
	case !p.Sees(t.TeamID):
		return errdefs.Errorf(errdefs.ErrConflict, "template name %q is taken", name)
	}
	return nil
}
