package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/image"
)

// What a hostile or broken image causes is the client's to fix: a status
// below 500 (or 503 for a layer this node's disk damaged, which a retry
// fetches anew) and a message saying what is wrong, never "internal error".
func TestImageErrorStatus(t *testing.T) {
	const layer = "sha256:0123abcd"
	tests := []struct {
		err  error
		want int
	}{
		{image.ErrUnsafePath, http.StatusBadRequest},
		{image.ErrInvalidLayer, http.StatusBadRequest},
		{image.ErrTooLarge, http.StatusRequestEntityTooLarge},
		{image.ErrCorruptLayer, http.StatusServiceUnavailable},
		{image.ErrNotFound, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			err := fmt.Errorf("unpack test/image: layer %s: %w: entry \"x\"", layer, tt.err)
			status, msg := imageErrorStatus(err)
			if status != tt.want {
				t.Errorf("status %d, want %d", status, tt.want)
			}
			if !strings.Contains(msg, layer) || !strings.Contains(msg, tt.err.Error()) {
				t.Errorf("message %q does not say what is wrong and where", msg)
			}
		})
	}
}
