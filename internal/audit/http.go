package audit

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/requestid"
)

// Recorded says whether a request of method to action (a route pattern
// with its method, see actionOf) is a change to record. Reads are not,
// nor what works inside a sandbox rather than on it, which runs at the
// rate of an agent's steps: keep-alives (E2B's SDKs refresh a sandbox's
// timeout in a loop), commands and file transfers (as through envd, which
// is not recorded either). Nor build-context uploads.
func Recorded(method, action string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	_, path, _ := strings.Cut(action, " ")
	if rest, ok := strings.CutPrefix(path, "/sandboxes/{id}/"); ok {
		name, _, _ := strings.Cut(rest, "/")
		switch name {
		case "refreshes", "execute", "files":
			return false
		}
	}
	return action != "" && !strings.HasPrefix(path, "/build-uploads")
}

// Middleware records the changes asked through route pattern (see
// Recorded) once next has answered. Who asked is the principal that
// authentication put in the request's context, else the operator (a
// server's own calls). A nil Log records nothing.
func (l *Log) Middleware(pattern string, next http.Handler) http.Handler {
	if l == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		action := actionOf(pattern, r)
		if !Recorded(r.Method, action) {
			next.ServeHTTP(w, r)
			return
		}
		aw, at := NewWriter(w), time.Now()
		defer func() {
			p, ok := auth.FromContext(r.Context())
			if !ok {
				p = auth.Operator()
			}
			l.Record(aw.Event(r, p, action, pathObject(r), at))
		}()
		next.ServeHTTP(aw, r)
	})
}

// actionOf is what r to route pattern is recorded as: the pattern, with
// the request's method when the pattern names none. A subtree's
// {rest...} is named by its first segment, as a node's own route names
// it ("POST /sandboxes/{id}/pause"), never by the rest of a caller's
// path. The catch-all "/" (unknown paths) is "".
func actionOf(pattern string, r *http.Request) string {
	if pattern == "/" {
		return ""
	}
	if strings.Contains(pattern, "{rest...}") {
		name, _, _ := strings.Cut(r.PathValue("rest"), "/")
		pattern = strings.Replace(pattern, "{rest...}", name, 1)
	}
	if !strings.Contains(pattern, " ") {
		pattern = r.Method + " " + pattern
	}
	return pattern
}

// Writer captures the status of an answer, and the start of a created
// object's answer to find its ID in.
type Writer struct {
	http.ResponseWriter
	status int
	head   bytes.Buffer
}

// maxHead bounds the answer kept to find a created object's ID in.
const maxHead = 4096

// NewWriter wraps w.
func NewWriter(w http.ResponseWriter) *Writer { return &Writer{ResponseWriter: w} }

func (w *Writer) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status == http.StatusCreated || w.status == http.StatusOK {
		if room := maxHead - w.head.Len(); room > 0 {
			w.head.Write(p[:min(room, len(p))])
		}
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (flushes of
// streamed answers).
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes a flush on, for handlers that assert http.Flusher.
func (w *Writer) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Status is the answer's status (200 when the handler wrote none).
func (w *Writer) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Event is the record of r, made by p to the route pattern and answered
// through w; object is the path's object ("" for none: a create's answer
// names it).
func (w *Writer) Event(r *http.Request, p auth.Principal, pattern, object string, at time.Time) Event {
	if object == "" {
		object = createdID(w.head.Bytes())
	}
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		remote = r.RemoteAddr
	}
	return Event{At: at.UTC(), TeamID: p.TeamID, KeyID: p.KeyID, KeyName: p.KeyName, Admin: p.Admin,
		Action: clip(pattern), Object: clip(object), Status: w.Status(), Remote: remote,
		RequestID: clip(requestid.FromContext(r.Context()))}
}

// maxField bounds what an event keeps of a value a caller chose (a path,
// an ID), so that no request stores more than a line.
const maxField = 256

func clip(s string) string {
	if len(s) > maxField {
		return s[:maxField]
	}
	return s
}

// pathObjects are the path values that name a route's object, in order.
var pathObjects = []string{"id", "sandboxID", "templateID", "volumeID", "secretID", "team", "key", "buildID", "node"}

// pathObject is the object r's path names: the first of pathObjects its
// route has.
func pathObject(r *http.Request) string {
	for _, name := range pathObjects {
		if v := r.PathValue(name); v != "" {
			return v
		}
	}
	return ""
}

// createdID finds the ID a create's answer names: a sandbox, template,
// snapshot, volume, secret, team or key (in a list, the first).
func createdID(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		// A list cut at maxHead does not parse; its first element may.
		dec := json.NewDecoder(bytes.NewReader(body))
		var first json.RawMessage
		if _, err := dec.Token(); err != nil || !dec.More() || dec.Decode(&first) != nil {
			return ""
		}
		body = first
	}
	var ids struct {
		SandboxID  string `json:"sandboxID"`
		SnapshotID string `json:"snapshotID"`
		TemplateID string `json:"templateID"`
		VolumeID   string `json:"volumeID"`
		SecretID   string `json:"secretID"`
		TeamID     string `json:"teamID"`
		ID         string `json:"id"`
	}
	if json.Unmarshal(body, &ids) != nil {
		return ""
	}
	for _, id := range []string{ids.SandboxID, ids.SnapshotID, ids.TemplateID, ids.VolumeID, ids.SecretID, ids.ID, ids.TeamID} {
		if id != "" {
			return id
		}
	}
	return ""
}
