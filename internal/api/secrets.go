package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/secret"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// routeSecrets registers E2B's secret routes. Values go in and never come
// out: every answer is the record alone.
func (s *Server) routeSecrets() {
	if s.cfg.Secrets == nil {
		return
	}
	s.route("GET /secrets", s.listSecrets)
	s.route("POST /secrets", s.createSecret)
	s.route("GET /secrets/{secretID}", s.getSecret)
	s.route("POST /secrets/{secretID}", s.updateSecret)
	s.route("DELETE /secrets/{secretID}", s.deleteSecret)
}

func toSecretJSON(sec *store.Secret) wire.Secret {
	md := sec.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return wire.Secret{SecretID: sec.ID, Name: sec.Name, CurrentVersion: sec.Version, Metadata: md,
		CreatedAt: sec.CreatedAt, UpdatedAt: sec.UpdatedAt}
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	secs, err := s.cfg.Secrets.List(r.Context(), teamFilter(principal(r)))
	if err != nil {
		return err
	}
	key := func(sec *store.Secret) pageKey { return pageKey{sec.CreatedAt, sec.ID} }
	secs, err = page(w, secs, key, oldestFirst(true), q.Get("nextToken"), limit)
	if err != nil {
		return err
	}
	out := make([]wire.Secret, 0, len(secs))
	for _, sec := range secs {
		out = append(out, toSecretJSON(sec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewSecret
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	var md map[string]string
	if req.Metadata != nil {
		md = *req.Metadata
	}
	sec, err := s.cfg.Secrets.Create(r.Context(), principal(r).TeamID, req.Name, req.Value, md)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toSecretJSON(sec))
	return nil
}

func (s *Server) findSecret(r *http.Request) (*store.Secret, error) {
	p := principal(r)
	return s.cfg.Secrets.Get(r.Context(), p.TeamID, p.Admin, r.PathValue("secretID"))
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) error {
	sec, err := s.findSecret(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toSecretJSON(sec))
	return nil
}

func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) error {
	var req wire.SecretUpdate
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	sec, err := s.findSecret(r)
	if err != nil {
		return err
	}
	var md map[string]string // nil keeps the secret's metadata
	if req.Metadata != nil {
		md = *req.Metadata
	}
	up, err := s.cfg.Secrets.Update(r.Context(), sec, req.Value, md)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toSecretJSON(up))
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	sec, err := s.findSecret(r)
	if err != nil {
		return err
	}
	if err := s.cfg.Secrets.Delete(r.Context(), sec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// storeRules is E2B's network.rules as a sandbox's record keeps them,
// hosts lower-cased.
func storeRules(rules *wire.NetworkRules) map[string][]store.NetworkRule {
	if rules == nil || len(*rules) == 0 {
		return nil
	}
	out := make(map[string][]store.NetworkRule, len(*rules))
	for host, rs := range *rules {
		host = strings.ToLower(host)
		for _, r := range rs {
			sr := store.NetworkRule{}
			if r.Transform != nil {
				sr.Transform = &store.NetworkTransform{Headers: r.Transform.Headers}
			}
			out[host] = append(out[host], sr)
		}
		if out[host] == nil {
			out[host] = []store.NetworkRule{}
		}
	}
	return out
}

// wireRules is the reverse of storeRules.
func wireRules(rules map[string][]store.NetworkRule) *wire.NetworkRules {
	if len(rules) == 0 {
		return nil
	}
	out := make(wire.NetworkRules, len(rules))
	for host, rs := range rules {
		list := make([]wire.NetworkRule, 0, len(rs))
		for _, r := range rs {
			wr := wire.NetworkRule{}
			if r.Transform != nil {
				wr.Transform = &wire.NetworkTransform{Headers: r.Transform.Headers}
			}
			list = append(list, wr)
		}
		out[host] = list
	}
	return &out
}

// checkRuleSecrets refuses rules whose placeholders name secrets team does
// not have: better a 400 now than every request failing at the gateway.
// The rules themselves are checked where they are applied.
func (s *Server) checkRuleSecrets(ctx context.Context, team string, p *store.NetworkPolicy) error {
	if p == nil || len(p.Rules) == 0 {
		return nil
	}
	if s.cfg.Secrets == nil {
		return errdefs.Errorf(errdefs.ErrNotImplemented, "network rules need the egress gateway's secrets, which this server does not serve")
	}
	for host, rs := range p.Rules {
		for _, r := range rs {
			if r.Transform == nil {
				continue
			}
			for header, value := range r.Transform.Headers {
				for _, name := range secret.Names(value) {
					sec, err := s.cfg.Secrets.Get(ctx, team, false, name)
					if err == nil && sec.Name != name {
						err = errdefs.ErrNotFound // an ID: placeholders name secrets by name
					}
					if err != nil {
						if errors.Is(err, errdefs.ErrNotFound) {
							return badRequest(fmt.Sprintf("network rules: header %s for %s names secret %q, which the team does not have", header, host, name))
						}
						return err
					}
				}
			}
		}
	}
	return nil
}
