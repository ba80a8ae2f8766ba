// Package errdefs is aenv's one vocabulary of error kinds.
//
// Every package that can fail in a way a client can act on (the store, the
// runtime, images, builds, the object store, the envd client, the node)
// says so by wrapping one of these kinds, directly with %w or through a
// sentinel of its own made by New. One mapper, HTTPStatus, turns a kind
// into the status the API and the gateway answer; FromHTTPStatus is its
// inverse for clients of aenv's own servers (envd, nodes). Nothing is
// classified by the text of an error.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
)

// The kinds. Wrap them with %w to add context; test with errors.Is.
var (
	// ErrInvalidArgument: the request is malformed or out of bounds.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnauthenticated: no valid credentials came with the request.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the credentials are valid but do not allow it.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrNotFound: no such thing.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the thing exists already, is in a state that does not
	// allow the operation, or is still in use.
	ErrConflict = errors.New("conflict")
	// ErrGone: the thing stopped existing while the call was in flight (a
	// sandbox killed, paused, expired or dead); the wrapping error says
	// which.
	ErrGone = errors.New("gone")
	// ErrTooLarge: the request or what it would make exceeds a size limit.
	ErrTooLarge = errors.New("too large")
	// ErrResourceExhausted: a rate or quota is used up; retry later.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrNotImplemented: this server or its runtime cannot do it.
	ErrNotImplemented = errors.New("not implemented")
	// ErrBadGateway: a service the server depends on answered wrongly (an
	// object missing from the object store, or not matching its digest).
	ErrBadGateway = errors.New("bad gateway")
	// ErrUnavailable: the server cannot do it now (no capacity, the
	// database unreachable); the same call may succeed later.
	ErrUnavailable = errors.New("unavailable")
	// ErrInsufficientStorage: a disk is full; nothing partial is kept.
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// kinds pairs each kind with its HTTP status.
var kinds = []struct {
	kind   error
	status int
}{
	{ErrGone, http.StatusGone},
	{ErrNotFound, http.StatusNotFound},
	{ErrInvalidArgument, http.StatusBadRequest},
	{ErrUnauthenticated, http.StatusUnauthorized},
	{ErrPermissionDenied, http.StatusForbidden},
	{ErrConflict, http.StatusConflict},
	{ErrTooLarge, http.StatusRequestEntityTooLarge},
	{ErrResourceExhausted, http.StatusTooManyRequests},
	{ErrNotImplemented, http.StatusNotImplemented},
	{ErrBadGateway, http.StatusBadGateway},
	{ErrUnavailable, http.StatusServiceUnavailable},
	{ErrInsufficientStorage, http.StatusInsufficientStorage},
}

// StatusClientClosedRequest is the status logged for a request whose
// client left before the answer (nginx's 499; never seen by the client).
const StatusClientClosedRequest = 499

// HTTPStatus is the status that answers err: its kind's, 504 for a
// deadline, 499 for a cancelled request, 507 for a full disk (ENOSPC),
// and 500 for an error of no kind
// (whose text is then not for clients).
func HTTPStatus(err error) int {
	if kind := Kind(err); kind != nil {
		for _, k := range kinds {
			if k.kind == kind {
				return k.status
			}
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest
	case errors.Is(err, syscall.ENOSPC):
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// FromHTTPStatus is the kind an error answer of status stands for, nil
// for a status of no kind (5xx other than those listed, or a success).
// Other 4xx are the request's fault: ErrInvalidArgument.
func FromHTTPStatus(status int) error {
	for _, k := range kinds {
		if k.status == status {
			return k.kind
		}
	}
	if status >= 400 && status < 500 {
		return ErrInvalidArgument
	}
	return nil
}

// New makes a package's own sentinel error of a kind: its text is msg,
// and errors.Is matches both the sentinel and the kind.
//
//	var ErrNoSuchBuild = errdefs.New(errdefs.ErrNotFound, "no such build")
func New(kind error, msg string) error {
	return &kindError{kind: kind, msg: msg}
}

type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Kind is the kind of err, or nil when it has none. An error wrapping
// several kinds has the outermost one (the first met walking its chain
// depth first, as errors.Is does): the code that wrapped last said what
// the failure is, e.g. a call ended because its sandbox stopped (gone),
// found out through a "not found" from below.
func Kind(err error) error {
	for _, k := range kinds {
		if err == k.kind {
			return k.kind
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if inner := u.Unwrap(); inner != nil {
			return Kind(inner)
		}
	case interface{ Unwrap() []error }:
		for _, inner := range u.Unwrap() {
			if k := Kind(inner); k != nil {
				return k
			}
		}
	}
	return nil
}

// Errorf is an error of a kind whose text is the formatted message alone
// (the kind's own words are not added); %w in format wraps as fmt.Errorf
// does.
//
//	errdefs.Errorf(errdefs.ErrNotFound, "template %q not found", name)
func Errorf(kind error, format string, args ...any) error {
	return &formattedError{kind: kind, err: fmt.Errorf(format, args...)}
}

type formattedError struct {
	kind error
	err  error
}

func (e *formattedError) Error() string   { return e.err.Error() }
func (e *formattedError) Unwrap() []error { return []error{e.kind, e.err} }
