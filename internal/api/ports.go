package api

import (
	"net"
	"net/http"
	"strconv"
	"strings"
)

// headerTrafficToken carries the traffic access token of a sandbox whose
// exposed ports are not public (E2B's spelling).
const headerTrafficToken = "E2b-Traffic-Access-Token"

// exposedPort parses a Host of the form <port>-<sandboxID>.<domain>.
func (s *Server) exposedPort(host string) (id string, port int, ok bool) {
	if s.cfg.Domain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(s.cfg.Domain))
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
