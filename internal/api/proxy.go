package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/proxybody"
	"github.com/aenv-dev/aenv/internal/store"
)

const (
	// HeaderSandboxID marks envd traffic and names its sandbox.
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
)

// IsEnvdTraffic tells envd requests from control-plane ones: the E2B SDK
// marks every envd request with E2b-Sandbox-Id and never a control-plane
// one. Signed /files URLs (uploadUrl/downloadUrl) carry no header, but a
// signature.
func IsEnvdTraffic(r *http.Request) bool {
	if r.Header.Get(HeaderSandboxID) != "" {
		return true
	}
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != ""
}

type envdProxy struct {
	sandboxes node.Node
	// isKey tells the node's own credential (its API key, or a node's
	// cluster secret) from anything else a client sends.
	isKey  func(string) bool
	logger *slog.Logger
	proxy  *httputil.ReverseProxy
}

// proxyTarget is where a proxied request goes, and which sandbox port it
// stands for (the error answer names both).
type proxyTarget struct {
	hostport  string
	sandboxID string
	port      int
}

// targetKey carries the proxyTarget of a proxied request.
type targetKey struct{}

func contextWithTarget(ctx context.Context, t proxyTarget) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

func targetOf(ctx context.Context) proxyTarget {
	t, _ := ctx.Value(targetKey{}).(proxyTarget)
	return t
}

func newEnvdProxy(sandboxes node.Node, isKey func(string) bool, logger *slog.Logger) *envdProxy {
	p := &envdProxy{sandboxes: sandboxes, isKey: isKey, logger: logger}
	p.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			t := targetOf(pr.In.Context())
			pr.Out.URL.Host = t.hostport
			StripCredentials(pr.Out.Header, t.port, p.isKey)
			pr.Out.Host = pr.In.Host // what the client asked for
			if masked, ok := pr.In.Context().Value(maskedHostKey{}).(string); ok {
				pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
				pr.Out.Host = masked
			}
		},
		Transport: sandboxes.Transport(),
		// Connect streams must reach the client frame by frame.
		FlushInterval: -1,
		ErrorHandler:  p.upstreamError,
		ModifyResponse: func(resp *http.Response) error {
			proxybody.EndsEarly(resp)
			return nil
		},
	}
	return p
}

// StripCredentials removes aenv's credentials from a request about to
// enter a sandbox, whose code may be hostile: an X-API-Key or a bearer
// Authorization that isKey says is one of aenv's keys (the user's key, or
// on a node the cluster secret a gateway put there). envd's port keeps no
// X-API-Key, only the Basic scheme of Authorization (the user E2B's SDK
// names) and its own X-Access-Token; other ports keep every other
// X-API-Key and Authorization and all cookies, which belong to the
// services running there (an X-API-Key guarding a sandbox's own service is
// common).
func StripCredentials(h http.Header, port int, isKey func(string) bool) {
	if port == node.EnvdPort || isKey != nil && isKey(strings.TrimSpace(h.Get("X-API-Key"))) {
		h.Del("X-API-Key")
	}
	auth := h.Get("Authorization")
	if auth == "" {
		return
	}
	scheme, value, _ := strings.Cut(auth, " ")
	switch {
	case port == node.EnvdPort && !strings.EqualFold(scheme, "Basic"):
		h.Del("Authorization")
	case strings.EqualFold(scheme, "Bearer") && isKey != nil && isKey(strings.TrimSpace(value)):
		h.Del("Authorization")
	}
}

// upstreamError answers a request the sandbox did not take: E2B's "port is
// not open" while the sandbox still runs, else its "sandbox not found".
func (p *envdProxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	defer proxybody.EndBody(w, r)
	t := targetOf(r.Context())
	p.logger.DebugContext(r.Context(), "envd proxy error", "sandbox", t.sandboxID, "port", t.port, "err", err)
	if errors.Is(context.Cause(r.Context()), node.ErrStopped) {
		WriteSandboxGone(w, t.sandboxID) // it stopped before answering
		return
	}
	if cause := context.Cause(r.Context()); errors.Is(cause, node.ErrUnavailable) {
		WriteErrorJSON(w, http.StatusServiceUnavailable, cause.Error()) // it stopped answering
		return
	}
	if r.Context().Err() != nil {
		return // the client left; nobody reads an answer
	}
	if target, err := p.sandboxes.Reach(r.Context(), t.sandboxID, t.port); err == nil {
		target.Release()
		writePortClosed(w, t.sandboxID, t.port)
		return
	}
	WriteSandboxGone(w, t.sandboxID)
}

func (p *envdProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(HeaderSandboxID)
	if id == "" {
		var ok bool
		if id, ok = p.sandboxForSignature(r); !ok {
			writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized,
				Message: "invalid or expired signature"})
			return
		}
	}
	port := node.EnvdPort
	if v := r.Header.Get(HeaderSandboxPort); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"sandboxId": id, "code": http.StatusBadRequest,
				"message": "invalid " + HeaderSandboxPort})
			return
		}
		port = n
	}
	p.servePort(w, r, id, port)
}

// servePort proxies r to port inside sandbox id, whichever way the client
// named them (E2b-Sandbox-Id/-Port headers or a <port>-<id>.<domain> Host).
// Both routes obey one rule: envd's own port is open to anyone, since envd
// checks its access token on every call; any other port of a sandbox
// created with allowPublicTraffic false needs its traffic access token.
func (p *envdProxy) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	target, err := p.reach(r.Context(), id, port)
	if errors.Is(err, node.ErrUnavailable) {
		// It runs but does not answer: not E2B's "not found", which SDKs
		// take as the sandbox's end.
		WriteErrorJSON(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err != nil {
		// Why is worth a line: "not found" is also what a sandbox that
		// could not be reached or resumed gets.
		p.logger.DebugContext(r.Context(), "sandbox port unreachable", "sandbox", id, "port", port, "err", err)
		WriteSandboxGone(w, id)
		return
	}
	defer target.Release()
	if port != node.EnvdPort && !trafficTokenOK(w, r, id, target.TrafficToken) {
		return
	}
	r.Header.Del(headerTrafficToken)
	if port != node.EnvdPort && target.MaskRequestHost != "" {
		// As E2B's proxy: the sandbox's maskRequestHost replaces the Host
		// of requests to its services (envd's own traffic keeps it).
		target.Ctx = contextWithMaskedHost(target.Ctx, expandMaskRequestHost(target.MaskRequestHost, port))
	}
	p.forward(w, r, target, proxyTarget{hostport: target.Addr, sandboxID: id, port: port})
}

// reach resolves port of sandbox id; a paused sandbox created with E2B's
// lifecycle.autoResume is resumed first, as E2B's proxy does. Concurrent
// requests resume it once (the node serialises them; the later ones find it
// running). A record already running while the sandbox cannot be reached
// is a resume (or pause) still in progress: the node records a resume
// before it lets traffic in, so such a request, too, goes through Resume,
// which waits for the operation and resumes what is still paused.
func (p *envdProxy) reach(ctx context.Context, id string, port int) (*node.Target, error) {
	target, err := p.sandboxes.Reach(ctx, id, port)
	if err == nil || !errors.Is(err, node.ErrConflict) {
		return target, err
	}
	sb, gerr := p.sandboxes.Get(ctx, id)
	if gerr != nil || !sb.AutoResume || (sb.State != store.StatePaused && sb.State != store.StateRunning) {
		return nil, err
	}
	_, resumed, rerr := p.sandboxes.Resume(ctx, id, 0, false)
	if rerr != nil {
		return nil, fmt.Errorf("resume on traffic: %w", rerr)
	}
	if resumed {
		p.logger.InfoContext(ctx, "sandbox resumed by traffic", "sandbox", id)
	}
	return p.sandboxes.Reach(ctx, id, port)
}

// trafficTokenOK checks the traffic access token of a private sandbox
// (token != ""), answering E2B's 403 when it is missing or wrong.
func trafficTokenOK(w http.ResponseWriter, r *http.Request, id, token string) bool {
	if token == "" {
		return true
	}
	got := r.Header.Get(headerTrafficToken)
	if got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
		return true
	}
	header := strings.ToLower(headerTrafficToken)
	msg := fmt.Sprintf("Sandbox is secured with traffic access token. Token header '%s' is missing", header)
	if got != "" {
		msg = fmt.Sprintf("Sandbox is secured with traffic access token. Provided token in header '%s' is invalid", header)
	}
	writeJSON(w, http.StatusForbidden, map[string]any{"sandboxId": id, "message": msg, "code": http.StatusForbidden})
	return false
}

// forward proxies r to hostport, streaming both ways. Full duplex: a
// Connect stream's first frame can come back before the client's (chunked)
// request body has been read to its end; Go's HTTP/1.1 server would
// otherwise close the request body at the first response write, which cuts
// the upstream connection mid-stream.
//
// The request runs in target.Ctx: when the sandbox stops (killed, paused,
// expired, died), the upstream call ends at once and so does the answer.
func (p *envdProxy) forward(w http.ResponseWriter, r *http.Request, target *node.Target, t proxyTarget) {
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		p.logger.DebugContext(r.Context(), "full duplex unavailable", "err", err)
	}
	p.proxy.ServeHTTP(w, proxybody.KeepBody(r.WithContext(contextWithTarget(target.Ctx, t))))
}

// sandboxForSignature finds the sandbox whose envd access token produced a
// signed file URL's signature (see spec: v1_ + base64(sha256(...))).
func (p *envdProxy) sandboxForSignature(r *http.Request) (string, bool) {
	sig := ParseFileSignature(r)
	return p.sandboxes.SandboxByToken(sig.MadeWith)
}

// SignedBy reports whether a signed file URL's signature was made with
// this envd access token (a signed URL names no sandbox; a gateway finds
// it among the cluster's tokens). A sandbox without a token (secure: false)
// has no signed URLs.
func SignedBy(r *http.Request, token string) bool {
	return ParseFileSignature(r).MadeWith(token)
}

// FileSignature is a signed file URL's signature and the message it
// signs but for the token, read from the request once: finding which of
// many tokens made it then costs one SHA-256 per token.
type FileSignature struct {
	before, after string // the message around the token
	sum           [sha256.Size]byte
	valid         bool // the signature decodes to a SHA-256
}

// ParseFileSignature reads r's signed file URL: path, operation (POST
// writes, anything else reads), username, expiration and signature.
func ParseFileSignature(r *http.Request) FileSignature {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	s := FileSignature{before: q.Get("path") + ":" + op + ":" + q.Get("username") + ":"}
	if exp := q.Get("signature_expiration"); exp != "" {
		s.after = ":" + exp
	}
	raw, ok := strings.CutPrefix(q.Get("signature"), "v1_")
	if sum, err := base64.RawStdEncoding.Strict().DecodeString(raw); ok && err == nil && len(sum) == sha256.Size {
		copy(s.sum[:], sum)
		s.valid = true
	}
	return s
}

// MadeWith reports whether token made the signature; an empty token makes
// none.
func (s FileSignature) MadeWith(token string) bool {
	if !s.valid || token == "" {
		return false
	}
	h := sha256.New()
	h.Write([]byte(s.before))
	h.Write([]byte(token))
	h.Write([]byte(s.after))
	var sum [sha256.Size]byte
	return subtle.ConstantTimeCompare(h.Sum(sum[:0]), s.sum[:]) == 1
}

// WriteSandboxGone is upstream's answer for envd traffic to a sandbox that
// is unknown, dead, paused or killed; the SDK maps 502 to "not running".
func WriteSandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway,
	})
}

// writePortClosed is upstream's answer for a running sandbox where nothing
// listens on the port.
func writePortClosed(w http.ResponseWriter, id string, port int) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port,
		"code": http.StatusBadGateway,
	})
}

// signatureLen is the length of what fileSignature makes: "v1_" and the
// unpadded base64 of a sha256.
var signatureLen = len("v1_") + base64.RawStdEncoding.EncodedLen(sha256.Size)

// SignaturePlausible reports whether a signed file URL can be valid at all,
// from the URL alone: a signature of fileSignature's shape and an expiry,
// if any, that is a number. A gateway refuses the rest, and expired ones
// (SignatureExpired), without looking for their signer in the database.
func SignaturePlausible(r *http.Request) bool {
	q := r.URL.Query()
	sig := q.Get("signature")
	if len(sig) != signatureLen || !strings.HasPrefix(sig, "v1_") {
		return false
	}
	if _, err := base64.RawStdEncoding.DecodeString(sig[len("v1_"):]); err != nil {
		return false
	}
	if exp := q.Get("signature_expiration"); exp != "" {
		if _, err := strconv.ParseInt(exp, 10, 64); err != nil {
			return false
		}
	}
	return true
}

// SignatureExpired reports whether r's file URL signature carries an
// expiry that has passed. The answer to it is envd's own (E2B's SDKs and
// tests match the text), whoever gives it.
func SignatureExpired(r *http.Request, now time.Time) bool {
	n, err := strconv.ParseInt(r.URL.Query().Get("signature_expiration"), 10, 64)
	return err == nil && n < now.Unix()
}

// ExpiredSignatureMessage is what envd answers an expired signature.
const ExpiredSignatureMessage = "signature is already expired"
