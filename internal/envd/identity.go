package envd

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
)

// errBadPath is returned for paths that cannot name a file (empty).
var errBadPath = errors.New("invalid path")

// userFromBasicAuth picks the account named by `Authorization: Basic
// base64("user:")`, or the default user when the header is absent.
func (s *Server) userFromBasicAuth(h http.Header) (account, error) {
	name := s.settings.user()
	if auth := h.Get("Authorization"); auth != "" {
		scheme, encoded, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Basic") {
			return account{}, fmt.Errorf("parse authorization: %w", errUnknownUser)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(encoded))
		if err != nil {
			return account{}, fmt.Errorf("decode authorization: %w", errUnknownUser)
		}
		user, _, _ := strings.Cut(string(raw), ":")
		if user != "" {
			name = user
		}
	}
	return s.users.lookupUser(name)
}

// userByName returns the named account, or the default user's for "".
func (s *Server) userByName(name string) (account, error) {
	if name == "" {
		name = s.settings.user()
	}
	return s.users.lookupUser(name)
}

// resolvePath makes p absolute: "~" and "~/x" expand to the user's home, and
// relative paths are taken from the home directory, like upstream envd.
func resolvePath(p string, user account) (string, error) {
	if p == "" {
		return "", fmt.Errorf("resolve path: %w", errBadPath)
	}
	switch {
	case p == "~":
		p = user.Home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(user.Home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(user.Home, p)
	}
	return filepath.Clean(p), nil
}
