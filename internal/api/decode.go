package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// errEmptyBody answers a request whose JSON body is missing; endpoints
// whose body is optional accept it.
var errEmptyBody = errdefs.New(errdefs.ErrInvalidArgument, "request body must be a JSON object")

// decodeJSON reads one JSON value of at most limit bytes into v. Unknown
// fields are accepted (the E2B SDK sends fields we do not use yet), but a
// known field of the wrong type, malformed JSON or trailing data is a 400.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var maxBytes *http.MaxBytesError
		var typeErr *json.UnmarshalTypeError
		var syntaxErr *json.SyntaxError
		switch {
		case errors.As(err, &maxBytes):
			return err
		case errors.Is(err, io.EOF):
			return errEmptyBody
		case errors.As(err, &typeErr):
			return badRequest(fmt.Sprintf("field %q must be of type %s", typeErr.Field, typeErr.Type))
		case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
			return badRequest("malformed JSON: " + err.Error())
		default:
			return badRequest("invalid JSON body: " + err.Error())
		}
	}
	if dec.More() {
		return badRequest("malformed JSON: trailing data after the object")
	}
	return nil
}

// decodeOptionalJSON is decodeJSON for endpoints whose body may be empty.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	err := decodeJSON(w, r, limit, v)
	if errors.Is(err, errEmptyBody) {
		return nil // chunked empty body
	}
	return err
}

// checkSandboxPath accepts only absolute paths without ".." segments: the
// control plane's file endpoints take exact paths, never relative ones.
func checkSandboxPath(p string) error {
	switch {
	case p == "":
		return badRequest("path is required")
	case strings.ContainsRune(p, 0):
		return badRequest("path must not contain NUL bytes")
	case !path.IsAbs(p):
		return badRequest(fmt.Sprintf("path %q must be absolute", p))
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return badRequest(fmt.Sprintf("path %q must not contain '..'", p))
		}
	}
	return nil
}

// DecodeOptionalJSON is decodeJSON for a body that may be missing (v is
// then left as it is), for the gateway's own routes.
func DecodeOptionalJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if err := decodeJSON(w, r, limit, v); err != nil && !errors.Is(err, errEmptyBody) {
		return err
	}
	return nil
}
