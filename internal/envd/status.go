package envd

import (
	"encoding/json"
	"net/http"
)

func handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

// handleEnvs returns the sandbox env vars set by /init.
func (s *Server) handleEnvs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.settings.env())
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.readMetrics(r.Context())
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, m)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
