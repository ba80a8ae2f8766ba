package gvisor

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/runtime"
)

// runsc says why it failed only in text; runscError is the one adapter
// that reads it into kinds, and keeps the text for people.
func TestRunscErrorKinds(t *testing.T) {
	exitErr := &exec.ExitError{}
	long := strings.Repeat("x", 2*maxErrorText)
	tests := []struct {
		name     string
		output   string
		notFound bool
		noSpace  bool
	}{
		{"unknown container", `loading container: file does not exist`, true, false},
		{"disk full", `checkpoint: write /img/pages.img: no space left on device`, false, true},
		// The cause early in a long output is still read, although the
		// text kept in the error is only its end.
		{"disk full, long output", "creating rootfs: no space left on device\n" + long, false, true},
		{"other failure", `creating container: permission denied`, false, false},
		{"no output", ``, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := runscError("create", exitErr, tt.output)
			if got := errors.Is(err, runtime.ErrNotFound); got != tt.notFound {
				t.Errorf("is ErrNotFound = %v, want %v (%v)", got, tt.notFound, err)
			}
			if got := errors.Is(err, syscall.ENOSPC); got != tt.noSpace {
				t.Errorf("is ENOSPC = %v, want %v", got, tt.noSpace)
			}
			if tt.noSpace && errdefs.HTTPStatus(err) != 507 {
				t.Errorf("status %d, want 507", errdefs.HTTPStatus(err))
			}
			if len(err.Error()) > maxErrorText+100 {
				t.Errorf("error text is %d bytes, more than the %d kept", len(err.Error()), maxErrorText)
			}
		})
	}
}
