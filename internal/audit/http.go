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

// Recorded says whether a request of method to the route pattern is a
// change to record: reads are not, nor keep-alives (E2B's SDKs refresh a
// sandbox's timeout in a loop) nor build-context uploads.
func Recorded(method, pattern string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return pattern != "" && !strings.HasSuffix(pattern, "/refreshes") && !strings.HasPrefix(pattern, "PUT /build-uploads")
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
var pathObjects = []string{"id", "sandboxID", "templateID", "team", "key", "buildID", "node"}

// PathObject is the object r's path names under pattern, for a request
// the mux that matched pattern has not seen (a gateway records before its
// mux routes): the value of pattern's first wildcard among pathObjects.
func PathObject(pattern, path string) string {
	_, pat, _ := strings.Cut(pattern, " ")
	if pat == "" {
		pat = pattern
	}
	ps, vs := strings.Split(strings.Trim(pat, "/"), "/"), strings.Split(strings.Trim(path, "/"), "/")
	values := map[string]string{}
	for i, seg := range ps {
		if i >= len(vs) || !strings.HasPrefix(seg, "{") {
			continue
		}
		values[strings.TrimSuffix(strings.Trim(seg, "{}"), "...")] = vs[i]
	}
	for _, name := range pathObjects {
		if v := values[name]; v != "" {
			return v
		}
	}
	return ""
}

// createdID finds the ID a create's answer names: a sandbox, template,
// snapshot, team or key (in a list, the first).
func createdID(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var list []json.RawMessage
		// A list cut at maxHead does not parse; its first element may.
		dec := json.NewDecoder(bytes.NewReader(body))
		if _, err := dec.Token(); err == nil && dec.More() {
			var first json.RawMessage
			if dec.Decode(&first) == nil {
				list = append(list, first)
			}
		}
		if len(list) == 0 {
			return ""
		}
		body = list[0]
	}
	var ids struct {
		SandboxID  string `json:"sandboxID"`
		SnapshotID string `json:"snapshotID"`
		TemplateID string `json:"templateID"`
		TeamID     string `json:"teamID"`
		ID         string `json:"id"`
	}
	if json.Unmarshal(body, &ids) != nil {
		return ""
	}
	for _, id := range []string{ids.SandboxID, ids.SnapshotID, ids.TemplateID, ids.ID, ids.TeamID} {
		if id != "" {
			return id
		}
	}
	return ""
}

// Action is the action a route pattern records: the pattern itself, but
// "" for the catch-all of unknown paths.
func Action(pattern string) string {
	if pattern == "/" {
		return ""
	}
	return pattern
}

// WithMethod names the method in action when its pattern matches any.
func WithMethod(action, method string) string {
	if strings.Contains(action, " ") {
		return action
	}
	return method + " " + action
}
