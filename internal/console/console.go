// Package console serves the web console at /console on a server's and a
// gateway's API port: a single-page application embedded in the binary
// (no CDN, works offline) that drives the same API users do.
//
// A user logs in with an API key. The key is kept in an HttpOnly cookie
// scoped to /console, so the page's scripts never hold it. The page calls
// the API under /console/api/; this handler checks the session and the
// request's origin, puts the key where the API looks for it, and hands the
// request to the API handler. Every rule of the API (teams, quotas, audit)
// applies unchanged. Revoking the key ends its sessions: each call is
// authenticated afresh.
//
// The terminal talks to the sandbox's envd as the E2B SDK does (same
// origin, E2b-Sandbox-Id, the sandbox's access token): not through this
// handler.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
)

// Prefix is where the console is served.
const Prefix = "/console"

// Cookie is the session cookie's name over plain HTTP; its value is the
// API key. Over HTTPS it is SecureCookie: a cookie of that prefix must be
// Secure, host-only and for path /, so a page of a sandbox's exposed port
// (a sibling host <port>-<id>.<domain>) cannot plant one for the API's
// host. Over plain HTTP a request that carries two session cookies (one
// planted beside the real one) is refused.
const (
	Cookie       = "aenv_console"
	SecureCookie = "__Host-aenv_console"
)

// SessionTTL is how long a login lasts without a new one.
const SessionTTL = 12 * time.Hour

// CSRFHeader must be on every call to /console/api/ and on login and
// logout. A page of another origin cannot send a custom header without a
// CORS preflight, which nothing here answers, so its forged requests
// carry none; the cookie is SameSite=Strict as well.
const CSRFHeader = "X-Aenv-Console"

// maxLoginBytes bounds a login's body: a key is well under 100 bytes.
const maxLoginBytes = 4 << 10

// page is the application's shell; bundle holds what `make build`
// bundles from web/ (see tools/consolebundle): app.js and app.css.
//
//go:embed web/index.html
var page []byte

//go:embed all:dist
var bundle embed.FS

// Handler serves /console and its subtree; every other request goes to
// next, the API.
type Handler struct {
	api    http.Handler
	next   http.Handler
	domain string
	bundle *Bundle
}

// Bundle is the console's scripts and styles as served, by file name
// (none when the binary was built without them).
type Bundle struct {
	files map[string]*asset
}

// Built reports whether the binary holds the console's bundle.
func (b *Bundle) Built() bool { return len(b.files) > 0 }

// asset is a file of the bundle, kept compressed as well: the bundle is
// mostly the terminal component, a third of its size gzipped.
type asset struct {
	plain, gzipped []byte
	etag           string
	contentType    string
}

// LoadBundle reads and compresses the bundle's files, once, at start.
func LoadBundle() (*Bundle, error) {
	out := map[string]*asset{}
	entries, err := fs.ReadDir(bundle, "dist")
	if err != nil {
		return nil, fmt.Errorf("console bundle: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "README.md" {
			continue
		}
		data, err := fs.ReadFile(bundle, "dist/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("console bundle: %w", err)
		}
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		if err != nil {
			return nil, fmt.Errorf("console bundle: compress %s: %w", e.Name(), err)
		}
		if _, err := zw.Write(data); err != nil {
			return nil, fmt.Errorf("console bundle: compress %s: %w", e.Name(), err)
		}
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("console bundle: compress %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(data)
		ct := mime.TypeByExtension(path.Ext(e.Name()))
		if ct == "" {
			ct = "application/octet-stream"
		}
		out[e.Name()] = &asset{plain: data, gzipped: gz.Bytes(), etag: `"` + hex.EncodeToString(sum[:12]) + `"`, contentType: ct}
	}
	if _, ok := out["app.js"]; !ok {
		return &Bundle{}, nil
	}
	return &Bundle{files: out}, nil
}

// New serves the console (b, from LoadBundle) over apiHandler (the
// handler its calls go to) in front of next (what every other request
// reaches). On a server both are the API; on a gateway, the gateway.
// domain is the sandboxes' domain: a request to a sandbox's exposed port
// is never the console's.
func New(b *Bundle, apiHandler, next http.Handler, domain string) *Handler {
	return &Handler{api: apiHandler, next: next, domain: domain, bundle: b}
}

// ServeHTTP serves the console's requests and hands every other one to
// next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _, exposed := api.ExposedPort(r.Host, h.domain)
	// The console's: a path under /console that is neither a sandbox's
	// (envd traffic) nor sent to a sandbox's host name.
	owns := (r.URL.Path == Prefix || strings.HasPrefix(r.URL.Path, Prefix+"/")) && !exposed && !api.IsEnvdTraffic(r)
	if !owns {
		if !exposed {
			// The console's origin also serves what sandboxes answer
			// (envd, signed /files URLs): such a document must not run
			// script as this origin, where it could call the console's
			// API with a logged-in user's session. Nor does the session
			// cookie (sent on every path over HTTPS) go on to them.
			w.Header().Set("Content-Security-Policy", "sandbox")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			dropSessionCookie(r)
		}
		h.next.ServeHTTP(w, r)
		return
	}
	securityHeaders(w.Header())
	rest := strings.TrimPrefix(r.URL.Path, Prefix)
	switch {
	case rest == "":
		http.Redirect(w, r, Prefix+"/", http.StatusFound)
	case strings.HasPrefix(rest, "/api/"):
		h.proxy(w, r, strings.TrimPrefix(rest, "/api"))
	case rest == "/login":
		h.login(w, r)
	case rest == "/logout":
		h.logout(w, r)
	case strings.HasPrefix(rest, "/assets/"):
		h.asset(w, r, strings.TrimPrefix(rest, "/assets/"))
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		// Every other path is a page of the application, which routes
		// by the URL's fragment: the shell.
		h.shell(w)
	default:
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// securityHeaders keeps the console's pages from running anything but
// its own scripts (no inline script, no eval: metadata shown on a page
// cannot become code), from being framed, and from leaking URLs.
func securityHeaders(h http.Header) {
	// Inline styles are allowed: the terminal (xterm) sizes and colours
	// its cells with style elements it makes. Scripts stay 'self' only.
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "+
		"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
}

func (h *Handler) shell(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	if !h.bundle.Built() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotImplemented)
		io.WriteString(w, "This aenv was built without its console: build it with `make build`, which bundles the console's scripts into the binary.\n")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(page)
}

func (h *Handler) asset(w http.ResponseWriter, r *http.Request, name string) {
	a := h.bundle.files[name]
	if a == nil {
		http.NotFound(w, r)
		return
	}
	// The bundle changes only with the binary and the shell names no
	// version, so a browser asks each load, and its ETag makes the answer
	// a 304 when nothing changed.
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", a.etag)
	w.Header().Set("Content-Type", a.contentType)
	w.Header().Add("Vary", "Accept-Encoding")
	body := a.plain
	if acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		body = a.gzipped
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(body))
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.TrimSpace(q) != "q=0" {
			return true
		}
	}
	return false
}

// sameOrigin reports whether r came from a page of this origin: the CSRF
// header is there, and Origin, when the browser sends one, names this
// host.
func sameOrigin(r *http.Request) bool {
	if r.Header.Get(CSRFHeader) == "" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	// Behind a reverse proxy that rewrites Host, the browser's host is
	// the one the proxy forwards.
	return u.Host == r.Host || (u.Host != "" && u.Host == r.Header.Get("X-Forwarded-Host"))
}

// secure reports whether the browser reached the console over HTTPS,
// here or at a proxy in front.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// sessionCookie makes the session cookie for key (an empty key and a
// negative maxAge remove it).
func sessionCookie(r *http.Request, key string, maxAge int) *http.Cookie {
	if secure(r) {
		return &http.Cookie{Name: SecureCookie, Value: key, Path: "/", MaxAge: maxAge,
			HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode}
	}
	return &http.Cookie{Name: Cookie, Value: key, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode}
}

// sessionKey is the key of r's session: "" when there is none, or more
// than one (a planted cookie beside the real one). Over HTTPS only the
// __Host- cookie counts: a plain one there can only have been planted.
func sessionKey(r *http.Request) string {
	name := Cookie
	if secure(r) {
		name = SecureCookie
	}
	var key string
	n := 0
	for _, c := range r.Cookies() {
		if c.Name == name {
			key = c.Value
			n++
		}
	}
	if n != 1 {
		return ""
	}
	return key
}

// dropSessionCookie removes the session cookies from r's Cookie header,
// so that what r reaches (the API, a sandbox's envd) never sees the key.
// Other cookies pass byte for byte: they are a sandbox's application's.
func dropSessionCookie(r *http.Request) {
	lines := r.Header.Values("Cookie")
	dropped := false
	var kept []string
	for _, line := range lines {
		var pieces []string
		for _, piece := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(piece), "=")
			if name == Cookie || name == SecureCookie {
				dropped = true
				continue
			}
			pieces = append(pieces, piece)
		}
		if len(pieces) > 0 {
			kept = append(kept, strings.TrimSpace(strings.Join(pieces, ";")))
		}
	}
	if !dropped {
		return
	}
	r.Header.Del("Cookie")
	for _, line := range kept {
		r.Header.Add("Cookie", line)
	}
}

// proxy hands a call of the page to the API as the session's key.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request, apiPath string) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, "the console's API takes calls from the console's own pages only")
		return
	}
	key := sessionKey(r)
	if key == "" {
		writeError(w, http.StatusUnauthorized, "not logged in")
		return
	}
	h.callAPI(w, r, key, apiPath)
}

// callAPI hands r to the API as a call to apiPath made with key, without
// the console's cookie and header.
func (h *Handler) callAPI(w http.ResponseWriter, r *http.Request, key, apiPath string) {
	r2 := r.Clone(r.Context())
	r2.URL.Path = apiPath
	r2.URL.RawPath = ""
	r2.RequestURI = ""
	dropSessionCookie(r2)
	r2.Header.Del("Authorization")
	r2.Header.Del(CSRFHeader)
	r2.Header.Set("X-API-Key", key)
	h.api.ServeHTTP(w, r2)
}

type loginRequest struct {
	Key string `json:"key"`
}

// fromPage reports whether r is a POST from the console's own page
// (what a login and a logout must be), answering when it is not.
func fromPage(w http.ResponseWriter, r *http.Request, what string) bool {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, what+" with POST")
		return false
	}
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, what+" from the console's own page")
		return false
	}
	return true
}

// login asks the API who the key is (GET /api-keys/current) and answers
// with what it says; a 200 also sets the session cookie. Any other answer
// (401 for a bad key, 429 when keys are being guessed at) passes as it is.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !fromPage(w, r, "log in") {
		return
	}
	var req loginRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxLoginBytes))
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "want a JSON body {\"key\": \"...\"}")
		return
	}
	req.Key = strings.TrimSpace(req.Key)
	if req.Key == "" {
		writeError(w, http.StatusBadRequest, "key: empty")
		return
	}
	check := r.Clone(r.Context())
	check.Method, check.Body, check.ContentLength = http.MethodGet, http.NoBody, 0
	check.URL.RawQuery = ""
	check.Header.Del("Content-Type")
	check.Header.Del("Content-Length")
	h.callAPI(&cookieOnOK{ResponseWriter: w, cookie: sessionCookie(r, req.Key, int(SessionTTL/time.Second))},
		check, req.Key, "/api-keys/current")
}

// cookieOnOK sets cookie on the answer if it is a 200.
type cookieOnOK struct {
	http.ResponseWriter
	cookie *http.Cookie
	wrote  bool
}

func (c *cookieOnOK) WriteHeader(code int) {
	if !c.wrote && code == http.StatusOK {
		http.SetCookie(c.ResponseWriter, c.cookie)
		c.Header().Set("Cache-Control", "no-store")
	}
	c.wrote = true
	c.ResponseWriter.WriteHeader(code)
}

func (c *cookieOnOK) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	return c.ResponseWriter.Write(p)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !fromPage(w, r, "log out") {
		return
	}
	http.SetCookie(w, sessionCookie(r, "", -1))
	w.WriteHeader(http.StatusNoContent)
}

// writeError answers in the API's error shape.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}
