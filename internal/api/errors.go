package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// errorBody is the control plane's error shape everywhere (wire.Error);
// the E2B SDK reads `code` from the body, so it always equals the HTTP
// status.
type errorBody = wire.Error

// apiError is an error with a status and a message safe to show clients.
type apiError struct {
	status  int
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(msg string) error { return &apiError{http.StatusBadRequest, msg} }

// statusOf maps an error to an HTTP status and a client-safe message: the
// status of its kind (errdefs.HTTPStatus, the one mapper the API and the
// gateway share) and its text. Errors of no kind are internal: their text
// is logged, never sent.
func statusOf(err error) (int, string) {
	var ae *apiError
	var maxBytes *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.message
	case errors.As(err, &maxBytes):
		return http.StatusRequestEntityTooLarge, "request body too large"
	case errors.Is(err, store.ErrUnavailable):
		// The database's own text names hosts and sockets: not for clients.
		return http.StatusServiceUnavailable, "the database is unavailable; try again shortly"
	case errors.Is(err, envdclient.ErrUnauthenticated):
		// envd refused the caller's token: E2B's words for it.
		return http.StatusUnauthorized, "unknown user"
	}
	switch status := errdefs.HTTPStatus(err); status {
	case http.StatusInternalServerError:
		return status, "internal error"
	case http.StatusGatewayTimeout:
		return status, "operation timed out"
	case errdefs.StatusClientClosedRequest:
		return status, "request canceled"
	default:
		return status, err.Error()
	}
}

// HeaderLimit marks a refusal for a team's limit (429), which holds on
// every node of a cluster: a gateway passes it to the client instead of
// offering the request to another node.
const HeaderLimit = "Aenv-Limit"

func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	status, msg := statusOf(err)
	if status == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
		// A limit, not a failure: the client may try again (E2B's SDKs
		// raise RateLimitError).
		w.Header().Set("Retry-After", "1")
	}
	if errors.Is(err, store.ErrLimit) {
		w.Header().Set(HeaderLimit, "team")
	}
	if status >= 500 {
		logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	} else {
		logger.DebugContext(r.Context(), "request rejected", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// WriteError answers err in the API's error shape, its status that of its
// kind (errdefs.HTTPStatus): the one mapper of the API and the gateway.
func WriteError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	writeError(w, r, logger, err)
}

// WriteErrorJSON answers with the API's error shape, {"code", "message"}.
func WriteErrorJSON(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, errorBody{Code: status, Message: message})
}

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
