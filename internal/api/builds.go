package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/template"
	"github.com/aenv-dev/aenv/internal/wire"
)

// E2B's template builds (docs/e2b-compat.md has the wire): request a
// build, upload the files of its COPY steps, start it, poll its status.
// A template's E2B ID is its name.

func (s *Server) routeBuilds() {
	if s.cfg.Builds == nil {
		return
	}
	s.route("POST /v3/templates", s.requestBuild)
	s.route("GET /templates/{templateID}/files/{hash}", s.buildUploadLink)
	s.route("POST /v2/templates/{templateID}/builds/{buildID}", s.startBuild)
	s.route("GET /templates/{templateID}/builds/{buildID}/status", s.buildStatus)
	s.routeTags()
	// The SDK uploads to the link without the API key; the link is signed.
	s.mux.Handle("PUT /build-uploads/{hash}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.putBuildUpload(w, r); err != nil {
			writeError(w, r, s.logger, err)
		}
	}))
}

// requestBuild is E2B's POST /v3/templates: 202 with the template's ID
// (its name) and a new build's ID. A tag in the name ("name:tag") is
// accepted; aenv keeps one version of each template.
func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) error {
	var req wire.NewTemplateBuild
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	if name == "" {
		return badRequest("name is required")
	}
	tags := append([]string{}, req.Tags...)
	if base, tag, ok := cutTag(name); ok {
		name, tags = base, append(tags, tag)
	}
	if req.CpuCount < 0 || req.MemoryMB < 0 {
		return badRequest("cpuCount and memoryMB must not be negative")
	}
	p := principal(r)
	if err := s.nameFree(r.Context(), p, name); err != nil {
		return err
	}
	buildID, err := s.cfg.Builds.Request(name, p.TeamID, p.Admin, req.CpuCount, req.MemoryMB)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, wire.TemplateBuildRef{TemplateID: name, BuildID: buildID,
		Names: []string{name}, Aliases: []string{name}, Tags: tags, Public: false})
	return nil
}

// uploadLinkTTL is how long an upload link works: the SDK uploads right
// after it asks for one.
const uploadLinkTTL = time.Hour

// buildUploadLink is E2B's GET /templates/{templateID}/files/{hash}: 201
// {"present"} and, when the files are not stored yet, a signed link to
// PUT their archive to. The link is the template's only, for that hash,
// and expires.
func (s *Server) buildUploadLink(w http.ResponseWriter, r *http.Request) error {
	templateID := r.PathValue("templateID")
	if err := template.CheckName(templateID); err != nil {
		return badRequest(err.Error())
	}
	hash := r.PathValue("hash")
	if !validHash(hash) {
		return badRequest("hash must be 64 lower-case hex digits")
	}
	expires := strconv.FormatInt(time.Now().Add(uploadLinkTTL).Unix(), 10)
	query := url.Values{"template": {templateID}, "expires": {expires},
		"signature": {s.uploadSignature(templateID, hash, expires)}}
	if s.cfg.NodeID != "" {
		// A gateway routes the upload to this node by it.
		query.Set("node", s.cfg.NodeID)
	}
	link := url.URL{Scheme: RequestScheme(r), Host: r.Host, Path: "/build-uploads/" + hash, RawQuery: query.Encode()}
	// The SDK uploads whenever it gets a link and forces the upload, so
	// the link is given even when the files are present.
	writeJSON(w, http.StatusCreated, wire.TemplateFilesUpload{
		Present: s.cfg.Builds.Uploads().Present(templateID, hash), URL: link.String(),
	})
	return nil
}

// HeaderForwardedProto is the scheme a client used to reach a proxy in
// front of the server: a gateway, or an operator's TLS terminator.
const HeaderForwardedProto = "X-Forwarded-Proto"

// RequestScheme is the scheme the client used: https when the request
// came over TLS here, or a proxy in front says it did. The header is
// trusted because only links handed back to the same caller are made from
// it: a caller who lies about it gets a link that does not work for
// itself, nothing more.
func RequestScheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	if p := strings.ToLower(r.Header.Get(HeaderForwardedProto)); p == "https" || p == "http" {
		return p
	}
	return "http"
}

// uploadSignature authorises one upload link: an HMAC, keyed by the API
// key, of the template, the hash and the link's expiry.
func (s *Server) uploadSignature(templateID, hash, expires string) string {
	m := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	m.Write([]byte("build-upload\x00" + templateID + "\x00" + hash + "\x00" + expires))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) putBuildUpload(w http.ResponseWriter, r *http.Request) error {
	hash := r.PathValue("hash")
	q := r.URL.Query()
	templateID, expires, sig := q.Get("template"), q.Get("expires"), q.Get("signature")
	// Expiry first: a link past it says so, whatever else is wrong.
	exp, err := strconv.ParseInt(expires, 10, 64)
	if err == nil && time.Now().Unix() > exp {
		return &apiError{http.StatusForbidden, "the upload link expired; ask for a new one"}
	}
	if err != nil || !validHash(hash) || template.CheckName(templateID) != nil ||
		!hmac.Equal([]byte(sig), []byte(s.uploadSignature(templateID, hash, expires))) {
		return &apiError{http.StatusForbidden, "invalid upload link"}
	}
	if err := s.cfg.Builds.Uploads().Put(r.Context(), templateID, hash, r.Body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// startBuild is E2B's POST /v2/templates/{templateID}/builds/{buildID}:
// 202 once the build is checked and started.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) error {
	var spec build.Spec
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &spec); err != nil {
		return err
	}
	if err := s.cfg.Builds.Start(r.PathValue("templateID"), r.PathValue("buildID"), spec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// maxBuildLogsLimit is E2B's largest (and default) page of build logs.
const maxBuildLogsLimit = 100

// buildStatus is E2B's GET .../builds/{buildID}/status?logsOffset=&limit=.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	offset, err := queryInt(q, "logsOffset")
	if err != nil {
		return err
	}
	limit, err := queryInt(q, "limit")
	if err != nil {
		return err
	}
	if limit > maxBuildLogsLimit {
		// E2B's bound; a page is what the build service answers at most.
		return badRequest(fmt.Sprintf("limit must be at most %d", maxBuildLogsLimit))
	}
	info, err := s.cfg.Builds.Status(r.PathValue("templateID"), r.PathValue("buildID"), offset, limit)
	if err != nil {
		return err
	}
	logs := info.Logs
	if level := q.Get("level"); level != "" {
		logs = filterLevel(logs, level)
	}
	out := wire.TemplateBuildInfo{TemplateID: info.TemplateID, BuildID: info.BuildID,
		Status: wire.TemplateBuildInfoStatus(info.Status), LogEntries: wireLogEntries(logs), Logs: []string{}}
	if info.Reason != nil {
		out.Reason = wireReason(info.Reason)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listBuilds lists the builds of a template this node remembers (its
// last 256 builds of any template), newest first: the console's way to a
// build's live log.
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("templateID")
	p := principal(r)
	builds := s.cfg.Builds.Builds(name, p.Sees)
	if len(builds) == 0 {
		// None remembered: a template of the caller's has none; a name
		// it cannot see is no template of its.
		t, err := s.visibleTemplate(r.Context(), p, name)
		if err != nil {
			return err
		}
		if t == nil {
			return fmt.Errorf("%w: template %q", errdefs.ErrNotFound, name)
		}
	}
	out := make([]wire.TemplateBuild, 0, len(builds))
	for _, b := range builds {
		tb := wire.TemplateBuild{BuildID: b.BuildID, Status: wire.BuildStatus(b.Status), CreatedAt: b.Created.UTC(),
			UpdatedAt: b.Updated.UTC(), CpuCount: b.VCPU, MemoryMB: b.MemoryMB}
		if !b.Finished.IsZero() {
			at := b.Finished.UTC()
			tb.FinishedAt = &at
		}
		out = append(out, tb)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// wireReason converts why a build failed. A reason without log entries
// (a build canceled before it ran) has an empty list: E2B's schema has no
// null there.
func wireReason(r *build.Reason) *wire.BuildStatusReason {
	return &wire.BuildStatusReason{Message: r.Message, Step: r.Step, LogEntries: wireLogEntries(r.LogEntries)}
}

// wireLogEntries converts build log entries; none is an empty list, never
// null.
func wireLogEntries(entries []build.LogEntry) []wire.BuildLogEntry {
	out := make([]wire.BuildLogEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, wire.BuildLogEntry{Timestamp: e.Timestamp, Level: wire.LogLevel(e.Level),
			Message: e.Message, Step: e.Step})
	}
	return out
}

func queryInt(q url.Values, name string) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, badRequest(fmt.Sprintf("%s must be a non-negative integer", name))
	}
	return n, nil
}

var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// filterLevel keeps entries at level or above. The SDK counts the entries
// it gets to advance its offset, so it sends no level.
func filterLevel(entries []build.LogEntry, level string) []build.LogEntry {
	min, ok := logLevels[level]
	if !ok {
		return entries
	}
	out := []build.LogEntry{}
	for _, e := range entries {
		if logLevels[e.Level] >= min {
			out = append(out, e)
		}
	}
	return out
}
