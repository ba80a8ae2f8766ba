package cli

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/aenv-dev/aenv/internal/client"
)

// notFound rewords a not-found answer with what the user asked for and
// where to look; other errors pass as they are.
func notFound(err error, format string, args ...any) error {
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		return err
	}
	return &client.APIError{Method: apiErr.Method, Path: apiErr.Path, Status: http.StatusNotFound,
		Message: fmt.Sprintf(format, args...) + ": " + apiErr.Message}
}

// templateContext names the template in a not-found error.
func templateContext(id string, err error) error {
	return notFound(err, "template %q not found (see `aenv template ls`)", id)
}

// sandboxContext names the sandbox in a not-found error.
func sandboxContext(id string, err error) error {
	return notFound(err, "sandbox %q not found (see `aenv ls`)", id)
}

// describe is the text the CLI prints for err: the server's own words,
// with what to do for the failures a user can fix here.
func describe(err error) string {
	var unreachable *client.UnreachableError
	var apiErr *client.APIError
	switch {
	case errors.As(err, &unreachable):
		return fmt.Sprintf("cannot reach the aenv server at %s (is `aenv server` running? set the address with `aenv auth`, --url or AENV_URL): %v",
			unreachable.URL, unreachable.Err)
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		return "the server rejected the API key (HTTP 401): run `aenv auth`, or set AENV_API_KEY or --api-key"
	}
	return err.Error()
}
