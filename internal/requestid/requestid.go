// Package requestid gives each API request an ID that follows it from the
// gateway to the node: taken from the X-Request-Id header when the caller
// sent a usable one, made otherwise, forwarded with the request, echoed in
// the answer and added to every log line written with the request's
// context.
package requestid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
)

// Header carries the ID, in requests and in answers.
const Header = "X-Request-Id"

// LogKey is the attribute naming the ID in log lines.
const LogKey = "request_id"

// maxLen bounds an ID taken from a caller: it is copied into every log line
// of the request.
const maxLen = 128

type ctxKey struct{}

// FromContext is the request ID ctx carries ("" when none).
func FromContext(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// WithID returns ctx carrying id.
func WithID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// New makes an ID: 16 random bytes in hex.
func New() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(b[:])
}

// Valid tells whether a caller's ID is kept as it is: 1 to 128 printable
// ASCII characters, no spaces, so that it cannot break a log line or a
// header.
func Valid(id string) bool {
	if id == "" || len(id) > maxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// Middleware gives each request an ID (the caller's when valid, a new one
// otherwise) before next sees it: in the request's context, in its
// X-Request-Id header (so that a request forwarded with its headers carries
// it on) and in the answer's.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(Header)
		if !Valid(id) {
			id = New()
		}
		r = r.WithContext(WithID(r.Context(), id))
		// Handlers must not change the request they were given: the header
		// set is a copy.
		r.Header = r.Header.Clone()
		if r.Header == nil {
			r.Header = http.Header{}
		}
		r.Header.Set(Header, id)
		w.Header().Set(Header, id)
		next.ServeHTTP(w, r)
	})
}

// ContextAttr is an attribute a context may carry for the lines logged
// with it (a trace ID), or false.
type ContextAttr func(ctx context.Context) (slog.Attr, bool)

// LogHandler wraps h so that a record logged with a context carrying a
// request ID (logger.InfoContext(r.Context(), ...)) gets it as request_id,
// and the attributes more find in that context too.
func LogHandler(h slog.Handler, more ...ContextAttr) slog.Handler {
	if _, ok := h.(*logHandler); ok {
		return h
	}
	return &logHandler{next: h, more: more}
}

type logHandler struct {
	next slog.Handler
	more []ContextAttr
}

func (h *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h *logHandler) Handle(ctx context.Context, rec slog.Record) error {
	cloned := false
	add := func(a slog.Attr) {
		if !cloned {
			rec, cloned = rec.Clone(), true
		}
		rec.AddAttrs(a)
	}
	if id := FromContext(ctx); id != "" {
		add(slog.String(LogKey, id))
	}
	for _, attr := range h.more {
		if a, ok := attr(ctx); ok {
			add(a)
		}
	}
	return h.next.Handle(ctx, rec)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{next: h.next.WithAttrs(attrs), more: h.more}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{next: h.next.WithGroup(name), more: h.more}
}
