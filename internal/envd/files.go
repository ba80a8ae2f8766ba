package envd

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileEntry is the OpenAPI EntryInfo that POST /files returns.
type fileEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// httpError is an error with the status /files answers it with.
type httpError struct {
	status int
	err    error
}

func (e *httpError) Error() string { return e.err.Error() }
func (e *httpError) Unwrap() error { return e.err }

func statusErr(status int, format string, args ...any) error {
	return &httpError{status: status, err: fmt.Errorf(format, args...)}
}

// writeFilesError answers err with its status, mapping filesystem errors
// the way upstream does (missing → 404, no space → 507).
func writeFilesError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var he *httpError
	switch {
	case errors.As(err, &he):
		status = he.status
	case errors.Is(err, fs.ErrNotExist):
		status = http.StatusNotFound
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		status = http.StatusInsufficientStorage
	case errors.Is(err, errUnknownUser):
		status = http.StatusUnauthorized
	case errors.Is(err, errBadPath), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR),
		errors.Is(err, syscall.EROFS), errors.Is(err, syscall.ETXTBSY):
		status = http.StatusBadRequest
	case errors.Is(err, fs.ErrPermission):
		status = http.StatusForbidden
	}
	writeJSONError(w, status, err.Error())
}

// handleFilesGet serves GET /files: the raw bytes with an exact
// Content-Length (0 for an empty file, which the SDK relies on), gzipped
// when the client asks for it, and streamed without a length when the file's
// size is unknown until read (procfs and sysfs files).
func (s *Server) handleFilesGet(w http.ResponseWriter, r *http.Request) {
	if err := s.authorizeFiles(r, "read"); err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	q := r.URL.Query()
	user, err := s.userByName(q.Get("username"))
	if err != nil {
		writeFilesError(w, err)
		return
	}
	path, err := resolvePath(q.Get("path"), user)
	if err != nil {
		writeFilesError(w, err)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeFilesError(w, fmt.Errorf("open %s: %w", path, err))
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		writeFilesError(w, fmt.Errorf("stat %s: %w", path, err))
		return
	}
	if info.IsDir() {
		writeFilesError(w, statusErr(http.StatusBadRequest, "path %s is a directory", path))
		return
	}
	size, sized := sizeKnown(f, info)
	// ServeContent learns the size by seeking to the end, which some device
	// files refuse; that is the request's problem, not a 500.
	if !sized && !info.Mode().IsRegular() {
		writeFilesError(w, statusErr(http.StatusBadRequest, "path %s cannot be read as a file: it is not a regular file", path))
		return
	}
	// A file streamed without a known size is read once before the answer
	// starts, so that one that cannot be read at all (/proc/1/mem,
	// /proc/sysrq-trigger) gets a 400 saying so rather than an empty 200.
	var src io.Reader = f
	if sized {
		// Up to the known size, gzipped or not: a device such as
		// /dev/urandom seeks to 0 and would never end.
		src = io.LimitReader(f, size)
	} else {
		br := bufio.NewReaderSize(f, 32<<10)
		if _, err := br.Peek(1); err != nil && !errors.Is(err, io.EOF) {
			writeFilesError(w, statusErr(http.StatusBadRequest, "path %s cannot be read: %v", path, err))
			return
		}
		src = br
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	w.Header().Set("Vary", "Accept-Encoding")
	// Ranges and conditional requests keep ServeContent's identity answers
	// (206, 304): an encoding is only ever offered, never required.
	conditional := r.Header.Get("Range") != "" || r.Header.Get("If-Range") != "" ||
		r.Header.Get("If-Modified-Since") != "" || r.Header.Get("If-None-Match") != ""
	switch {
	case acceptsGzip(r.Header.Get("Accept-Encoding")) && !conditional:
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		if _, err := io.Copy(gz, src); err != nil {
			// The status is sent; a cut gzip stream tells the client.
			s.log.Warn("file read cut short", "path", path, "err", err)
			return
		}
		if err := gz.Close(); err != nil {
			s.log.Warn("file read cut short", "path", path, "err", err)
		}
	case sized:
		http.ServeContent(w, r, "", info.ModTime(), f)
	default:
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		if _, err := io.Copy(w, src); err != nil {
			s.log.Warn("file read cut short", "path", path, "err", err)
		}
	}
}

// sizeKnown reports whether stat's size is f's content length. procfs and
// sysfs generate a file's content on read and report 0 or a page size for
// it (gVisor's procfs also refuses to seek), so such files are streamed.
// The size is where a seek to the end lands, as ServeContent finds it.
func sizeKnown(f *os.File, info fs.FileInfo) (size int64, known bool) {
	if info.Mode().IsRegular() && generatedOnRead(f) {
		return 0, false
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, false
	}
	_, err = f.Seek(0, io.SeekStart)
	return size, err == nil
}

// generatedOnRead reports whether f lives on procfs or sysfs.
func generatedOnRead(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var st unix.Statfs_t
	var statErr error
	if err := rc.Control(func(fd uintptr) { statErr = unix.Fstatfs(int(fd), &st) }); err != nil || statErr != nil {
		return false
	}
	return st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC
}

// acceptsGzip reports whether an Accept-Encoding header prefers gzip to the
// identity encoding: gzip (or "*") with a non-zero quality at least
// identity's. Without the header, or with an unknown coding only, the
// answer is identity.
func acceptsGzip(header string) bool {
	gzipQ, identityQ, anyQ := -1.0, -1.0, -1.0
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		q := 1.0
		for param := range strings.SplitSeq(params, ";") {
			if v, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(param)), "q="); ok {
				if parsed, err := strconv.ParseFloat(v, 64); err == nil {
					q = parsed
				}
			}
		}
		switch strings.ToLower(strings.TrimSpace(coding)) {
		case "gzip", "x-gzip":
			gzipQ = q
		case "identity":
			identityQ = q
		case "*":
			anyQ = q
		}
	}
	if gzipQ < 0 {
		// "*" stands for gzip only when identity is refused outright.
		if identityQ != 0 {
			return false
		}
		gzipQ = anyQ
	}
	return gzipQ > 0 && gzipQ >= identityQ
}

// handleFilesPost serves POST /files, multipart or raw octet-stream.
func (s *Server) handleFilesPost(w http.ResponseWriter, r *http.Request) {
	if err := s.authorizeFiles(r, "write"); err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return
	}
	q := r.URL.Query()
	user, err := s.userByName(q.Get("username"))
	if err != nil {
		writeFilesError(w, err)
		return
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeFilesError(w, statusErr(http.StatusBadRequest, "gzip body: %w", err))
			return
		}
		defer gz.Close()
		body = gz
	}
	metadata := metadataHeaders(r.Header)
	if err := validateMetadata(metadata); err != nil {
		writeFilesError(w, statusErr(http.StatusBadRequest, "invalid metadata: %w", err))
		return
	}
	up := upload{srv: s, user: user, queryPath: q.Get("path"), metadata: metadata, seen: map[string]bool{}}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mediaType == "multipart/form-data" {
		err = up.multipart(multipart.NewReader(body, params["boundary"]))
	} else {
		err = up.raw(body)
	}
	if err != nil {
		writeFilesError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(up.written)
}

// metadataHeaders collects X-Metadata-<key> headers with lowercased keys.
func metadataHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-")
		if ok && key != "" && len(v) > 0 {
			out[key] = v[0]
		}
	}
	return out
}

// upload writes the files of one POST /files request.
type upload struct {
	srv       *Server
	user      account
	queryPath string
	metadata  map[string]string
	seen      map[string]bool
	written   []fileEntry
}

func (u *upload) raw(body io.Reader) error {
	if u.queryPath == "" {
		return statusErr(http.StatusBadRequest, "path query parameter is required for octet-stream uploads")
	}
	return u.write(u.queryPath, body)
}

// multipart writes each part named "file". The target is the path query
// when given, else the part's filename, read from the raw header because
// Part.FileName drops the directories.
func (u *upload) multipart(mr *multipart.Reader) error {
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return statusErr(http.StatusBadRequest, "read multipart: %w", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := u.queryPath
		if target == "" {
			target = rawFileName(part.Header.Get("Content-Disposition"))
		}
		err = u.write(target, part)
		part.Close()
		if err != nil {
			return err
		}
	}
	if len(u.written) == 0 {
		return statusErr(http.StatusBadRequest, "no file part in request")
	}
	return nil
}

// rawFileName returns the filename parameter of a Content-Disposition
// header exactly as sent, directories included.
func rawFileName(disposition string) string {
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return ""
	}
	return params["filename"]
}

// write stores one file for the user: parents created and owned by the
// user, the file itself owned by the user, metadata as xattrs.
func (u *upload) write(target string, body io.Reader) error {
	path, err := resolvePath(target, u.user)
	if err != nil {
		return statusErr(http.StatusBadRequest, "file path is missing")
	}
	if u.seen[path] {
		return statusErr(http.StatusBadRequest, "path %s is written twice in one request", path)
	}
	u.seen[path] = true
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		return statusErr(http.StatusBadRequest, "path %s is a directory", path)
	}
	if err := mkdirAllAs(filepath.Dir(path), u.user); err != nil {
		return err
	}
	if err := writeFileAs(path, body, u.user); err != nil {
		return err
	}
	// Written even when empty: an overwrite clears the old metadata.
	supported, err := writeMetadata(path, u.metadata)
	if err != nil {
		return err
	}
	if !supported && len(u.metadata) > 0 {
		u.srv.log.Warn("xattrs unsupported, metadata dropped", "path", path)
	}
	entry := fileEntry{Path: path, Name: filepath.Base(path), Type: "file", Metadata: readMetadata(path)}
	u.written = append(u.written, entry)
	return nil
}

func writeFileAs(path string, body io.Reader, user account) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := os.Chown(path, int(user.UID), int(user.GID)); err != nil {
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}
