package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"syscall"

	"github.com/aenv-dev/aenv/internal/image"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// buildImageTemplate builds a template from an OCI image. Errors found
// before the pull starts are ordinary JSON errors; after that the answer
// is a stream of JSON lines (application/x-ndjson): progress objects
// {"phase","layer","current","total"}, then exactly one final line,
// the template ({"templateID",...}) or {"error":{"code","message"}}.
func (s *Server) buildImageTemplate(w http.ResponseWriter, r *http.Request, ref, name, platform string) error {
	qualified, err := image.Qualify(ref)
	if err != nil {
		return badRequest(err.Error())
	}
	if name == "" {
		return badRequest("name is required")
	}
	if err := template.CheckName(name); err != nil {
		return badRequest(err.Error())
	}
	// A template this node finds by the name (or ID), or any node's
	// record of a team's name, uploaded or not: a team's names are the
	// cluster's.
	_, err = s.sandboxes.GetTemplate(r.Context(), name)
	if err != nil {
		_, err = s.sandboxes.TemplateNamed(r.Context(), name)
	}
	if err == nil {
		return &apiError{http.StatusConflict, fmt.Sprintf("a template named %q exists", name)}
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	emit := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(v)
		if flusher != nil {
			flusher.Flush()
		}
	}
	s.logger.InfoContext(r.Context(), "building template from image", "image", qualified, "name", name)
	tpl, err := s.sandboxes.BuildTemplate(r.Context(), template.ImageRequest{
		Reference: ref, Name: name, Platform: platform, TeamID: principal(r).TeamID,
		Progress: func(p image.Progress) { emit(p) },
	})
	if err != nil {
		status, msg := imageErrorStatus(err)
		if status >= 500 {
			s.logger.ErrorContext(r.Context(), "image template failed", "image", qualified, "err", err)
		}
		emit(map[string]errorBody{"error": {Code: status, Message: msg}})
		return nil
	}
	emit(toTemplateJSON(tpl))
	return nil
}

// imageErrorStatus maps pull and unpack failures to statuses and
// client-safe messages: the image package's errors carry their kinds, so
// only the messages of two cases differ from statusOf's.
func imageErrorStatus(err error) (int, string) {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return http.StatusInsufficientStorage, "disk full while unpacking the image"
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict, "a template with that name exists"
	}
	return statusOf(err)
}
