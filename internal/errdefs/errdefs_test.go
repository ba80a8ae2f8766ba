package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
)

func TestHTTPStatus(t *testing.T) {
	noSuchBuild := New(ErrNotFound, "no such build")
	stopped := New(ErrGone, "sandbox stopped")
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"kind", ErrConflict, http.StatusConflict},
		{"wrapped kind", fmt.Errorf("pause sandbox x: %w", ErrConflict), http.StatusConflict},
		{"package sentinel", fmt.Errorf("build b: %w", noSuchBuild), http.StatusNotFound},
		{"joined with a cause", errors.Join(errors.New("exit status 1"), ErrNotFound), http.StatusNotFound},
		// A call cut by its sandbox stopping wraps the stop, which also
		// wraps how it was found out: the stop wins.
		{"gone before not found", fmt.Errorf("%w: killed: %w", stopped, ErrNotFound), http.StatusGone},
		{"too large", ErrTooLarge, http.StatusRequestEntityTooLarge},
		{"exhausted", ErrResourceExhausted, http.StatusTooManyRequests},
		{"not implemented", ErrNotImplemented, http.StatusNotImplemented},
		{"bad gateway", ErrBadGateway, http.StatusBadGateway},
		{"unavailable", ErrUnavailable, http.StatusServiceUnavailable},
		{"disk full kind", ErrInsufficientStorage, http.StatusInsufficientStorage},
		{"ENOSPC", fmt.Errorf("write image: %w", syscall.ENOSPC), http.StatusInsufficientStorage},
		{"unauthenticated", ErrUnauthenticated, http.StatusUnauthorized},
		{"permission", ErrPermissionDenied, http.StatusForbidden},
		{"invalid", ErrInvalidArgument, http.StatusBadRequest},
		{"deadline", fmt.Errorf("start: %w", context.DeadlineExceeded), http.StatusGatewayTimeout},
		{"canceled", context.Canceled, StatusClientClosedRequest},
		{"no kind", errors.New("boom"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HTTPStatus(tt.err); got != tt.want {
				t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
}

// FromHTTPStatus is HTTPStatus's inverse for every kind, so an error
// answer read back by a client of aenv's own servers keeps its kind.
func TestFromHTTPStatusRoundTrip(t *testing.T) {
	for _, k := range kinds {
		got := FromHTTPStatus(HTTPStatus(k.kind))
		if got != k.kind {
			t.Errorf("kind %v: round trip gave %v", k.kind, got)
		}
	}
	if got := FromHTTPStatus(http.StatusTeapot); got != ErrInvalidArgument {
		t.Errorf("418: %v, want the request's fault", got)
	}
	for _, s := range []int{http.StatusOK, http.StatusInternalServerError, http.StatusGatewayTimeout} {
		if got := FromHTTPStatus(s); got != nil {
			t.Errorf("%d: %v, want no kind", s, got)
		}
	}
}

func TestNewKeepsTextAndKind(t *testing.T) {
	err := New(ErrNotFound, "no such build")
	if err.Error() != "no such build" {
		t.Errorf("text %q", err.Error())
	}
	if !errors.Is(err, ErrNotFound) || Kind(err) != ErrNotFound {
		t.Errorf("kind lost: %v", Kind(err))
	}
	if Kind(errors.New("x")) != nil {
		t.Error("an error of no kind has one")
	}
}

func TestErrorf(t *testing.T) {
	cause := errors.New("dial tcp: refused")
	err := Errorf(ErrUnavailable, "node %s did not answer: %w", "n1", cause)
	if err.Error() != "node n1 did not answer: dial tcp: refused" {
		t.Errorf("text %q", err.Error())
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) {
		t.Error("kind or cause lost")
	}
	if HTTPStatus(err) != http.StatusServiceUnavailable {
		t.Errorf("status %d", HTTPStatus(err))
	}
}

// The outermost kind answers: the wrapper that said what a failure is
// wins over what it found below.
func TestOutermostKindWins(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("%w: sandbox x is in use: %w", ErrConflict, ErrNotFound), http.StatusConflict},
		{Errorf(ErrUnavailable, "node n1 did not answer: %w", ErrNotFound), http.StatusServiceUnavailable},
		{errors.Join(errors.New("exit status 1"), ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", ErrTooLarge)), http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		if got := HTTPStatus(tt.err); got != tt.want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}
