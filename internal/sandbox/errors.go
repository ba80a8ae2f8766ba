package sandbox

import "errors"

// Error kinds of the manager. The API translates them to HTTP statuses in
// one place; wrap them with %w to add context.
var (
	// ErrNotFound: no such sandbox or template.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed or out of bounds.
	ErrInvalid = errors.New("invalid request")
	// ErrConflict: the sandbox is not in a state that allows the operation.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: the node lacks capacity (network slots, memory).
	ErrUnavailable = errors.New("unavailable")
	// ErrNotSupported: the runtime driver cannot do this.
	ErrNotSupported = errors.New("not supported by this runtime")
)
