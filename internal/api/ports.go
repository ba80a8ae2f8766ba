package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// headerTrafficToken carries the traffic access token of a sandbox whose
// exposed ports are not public (E2B's spelling).
const headerTrafficToken = "E2b-Traffic-Access-Token"

// exposedPort parses a Host of the form <port>-<sandboxID>.<domain>.
func (s *Server) exposedPort(host string) (id string, port int, ok bool) {
	return ExposedPort(host, s.cfg.Domain)
}

// ExposedPort parses a Host of the form <port>-<sandboxID>.<domain>; an
// empty domain matches nothing.
func ExposedPort(host, domain string) (id string, port int, ok bool) {
	if domain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(domain))
	if !ok {
		return "", 0, false
	}
	portText, id, ok := strings.Cut(label, "-")
	if !ok || len(id) != 20 || strings.Contains(id, ".") {
		return "", 0, false
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	return id, port, true
}

// serveExposedPort proxies HTTP (WebSocket included) to a port inside a
// sandbox; servePort checks the traffic token of private sandboxes.
func (s *Server) serveExposedPort(w http.ResponseWriter, r *http.Request, id string, port int) {
	s.proxy.servePort(w, r, id, port)
}

// portPlaceholder in a maskRequestHost stands for the port the request
// was addressed to (E2B's spelling).
const portPlaceholder = "${PORT}"

func expandMaskRequestHost(mask string, port int) string {
	return strings.ReplaceAll(mask, portPlaceholder, strconv.Itoa(port))
}

// checkMaskRequestHost accepts a host or host:port (once the placeholder
// is filled in) in ASCII: what can go into a Host header.
func checkMaskRequestHost(mask string) error {
	bad := badRequest(fmt.Sprintf("network.maskRequestHost %q must be a host or host:port (%s may stand for the port)", mask, portPlaceholder))
	host := expandMaskRequestHost(mask, 1)
	if len(host) > 255 {
		return bad
	}
	for _, c := range host {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("/?#@\\", c) {
			return bad
		}
	}
	u, err := url.Parse("http://" + host)
	if err != nil || u.Host != host || u.Hostname() == "" {
		return bad
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad
		}
	}
	return nil
}

// maskedHostKey carries the Host a proxied request must reach the
// sandbox with (see envdProxy's Rewrite).
type maskedHostKey struct{}

func contextWithMaskedHost(ctx context.Context, host string) context.Context {
	return context.WithValue(ctx, maskedHostKey{}, host)
}
