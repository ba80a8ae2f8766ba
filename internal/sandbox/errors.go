package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

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

// ErrInsufficientStorage: the disk is full (a checkpoint could not be
// written); nothing partial is kept.
var ErrInsufficientStorage = errors.New("insufficient storage")

// requireCapability refuses an operation the runtime driver declares it
// cannot do, so that the API says so (501) instead of failing obscurely.
func requireCapability(has bool, driver, what string) error {
	if !has {
		return fmt.Errorf("%w: %s (runtime %s)", ErrNotSupported, what, driver)
	}
	return nil
}

// classifyRuntimeError tags runtime failures whose cause a client can act
// on; runsc reports them only as text.
func classifyRuntimeError(err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "no space left on device") || errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %v", ErrInsufficientStorage, err)
	}
	return err
}
