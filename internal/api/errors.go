package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// errorBody is the control plane's error shape everywhere; the E2B SDK
// reads `code` from the body, so it always equals the HTTP status.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// apiError is an error with a status and a message safe to show clients.
type apiError struct {
	status  int
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(msg string) error { return &apiError{http.StatusBadRequest, msg} }

// statusOf maps an error to an HTTP status and a client-safe message. Errors
// of unknown kind are internal: their text is logged, never sent.
func statusOf(err error) (int, string) {
	var ae *apiError
	var maxBytes *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.message
	case errors.As(err, &maxBytes):
		return http.StatusRequestEntityTooLarge, "request body too large"
	case errors.Is(err, node.ErrStopped):
		// A call in flight when its sandbox was killed, paused, expired or
		// died: the message says which.
		return http.StatusGone, err.Error()
	case errors.Is(err, node.ErrNotFound), errors.Is(err, envdclient.ErrNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, node.ErrInvalid), errors.Is(err, envdclient.ErrInvalidArgument):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, node.ErrConflict):
		return http.StatusConflict, err.Error()
	case errors.Is(err, node.ErrUnavailable):
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, store.ErrUnavailable):
		// The database's own text names hosts and sockets: not for clients.
		return http.StatusServiceUnavailable, "the database is unavailable; try again shortly"
	case errors.Is(err, node.ErrBadGateway):
		return http.StatusBadGateway, err.Error()
	case errors.Is(err, node.ErrInsufficientStorage):
		return http.StatusInsufficientStorage, err.Error()
	case errors.Is(err, node.ErrNotSupported):
		return http.StatusNotImplemented, err.Error()
	case errors.Is(err, envdclient.ErrPermission):
		return http.StatusForbidden, err.Error()
	case errors.Is(err, envdclient.ErrNoSpace):
		return http.StatusInsufficientStorage, err.Error()
	case errors.Is(err, envdclient.ErrUnauthenticated):
		return http.StatusUnauthorized, "unknown user"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "operation timed out"
	case errors.Is(err, context.Canceled):
		return 499, "request canceled"
	}
	return http.StatusInternalServerError, "internal error"
}

func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	status, msg := statusOf(err)
	if status >= 500 {
		logger.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	} else {
		logger.DebugContext(r.Context(), "request rejected", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// WriteErrorJSON answers with the API's error shape, {"code", "message"}.
func WriteErrorJSON(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, errorBody{Code: status, Message: message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
