package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"

	"github.com/aenv-dev/aenv/internal/node"
)

const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
)

// isEnvdTraffic tells envd requests from control-plane ones: the E2B SDK
// marks every envd request with E2b-Sandbox-Id and never a control-plane
// one. Signed /files URLs (uploadUrl/downloadUrl) carry no header, but a
// signature.
func isEnvdTraffic(r *http.Request) bool {
	if r.Header.Get(headerSandboxID) != "" {
		return true
	}
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != ""
}

type envdProxy struct {
	sandboxes node.Node
	logger    *slog.Logger
	proxy     *httputil.ReverseProxy
}

// targetKey carries the upstream host:port of a proxied request.
type targetKey struct{}

func contextWithTarget(ctx context.Context, hostport string) context.Context {
	return context.WithValue(ctx, targetKey{}, hostport)
}

func newEnvdProxy(sandboxes node.Node, logger *slog.Logger) *envdProxy {
	p := &envdProxy{sandboxes: sandboxes, logger: logger}
	p.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Context().Value(targetKey{}).(string)
			pr.Out.Host = pr.In.Host // what the client asked for
			if masked, ok := pr.In.Context().Value(maskedHostKey{}).(string); ok {
				pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
				pr.Out.Host = masked
			}
		},
		Transport: sandboxes.Transport(),
		// Connect streams must reach the client frame by frame.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			logger.DebugContext(r.Context(), "envd proxy error", "err", err)
			writeSandboxGone(w, r.Header.Get(headerSandboxID))
		},
	}
	return p
}

func (p *envdProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(headerSandboxID)
	if id == "" {
		var ok bool
		if id, ok = p.sandboxForSignature(r); !ok {
			writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized,
				Message: "invalid or expired signature"})
			return
		}
	}
	port := node.EnvdPort
	if v := r.Header.Get(headerSandboxPort); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			writeJSON(w, http.StatusBadRequest, errorBody{Code: http.StatusBadRequest, Message: "invalid " + headerSandboxPort})
			return
		}
		port = n
	}
	target, err := p.sandboxes.Reach(r.Context(), id, port)
	if err != nil {
		writeSandboxGone(w, id)
		return
	}
	defer target.Release()
	p.forward(w, r, target)
}

// forward proxies r to hostport, streaming both ways. Full duplex: a
// Connect stream's first frame can come back before the client's (chunked)
// request body has been read to its end; Go's HTTP/1.1 server would
// otherwise close the request body at the first response write, which cuts
// the upstream connection mid-stream.
//
// The request runs in target.Ctx: when the sandbox stops (killed, paused,
// expired, died), the upstream call ends at once and so does the answer.
func (p *envdProxy) forward(w http.ResponseWriter, r *http.Request, target *node.Target) {
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		p.logger.DebugContext(r.Context(), "full duplex unavailable", "err", err)
	}
	p.proxy.ServeHTTP(w, r.WithContext(contextWithTarget(target.Ctx, target.Addr)))
}

// sandboxForSignature finds the sandbox whose envd access token produced a
// signed file URL's signature (see spec: v1_ + base64(sha256(...))).
func (p *envdProxy) sandboxForSignature(r *http.Request) (string, bool) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	sig := q.Get("signature")
	return p.sandboxes.SandboxByToken(func(token string) bool {
		return fileSignature(q.Get("path"), op, q.Get("username"), token, q.Get("signature_expiration")) == sig
	})
}

func fileSignature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// writeSandboxGone is upstream's answer for envd traffic to a sandbox that
// is unknown, dead, paused or killed; the SDK maps 502 to "not running".
func writeSandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway,
	})
}
