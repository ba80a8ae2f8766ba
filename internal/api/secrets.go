package api

import (
	"net/http"

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
	var md map[string]string
	if req.Metadata != nil {
		md = *req.Metadata
		if md == nil {
			md = map[string]string{}
		}
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
