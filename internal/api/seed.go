package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/wire"
)

func (s *Server) execute(w http.ResponseWriter, r *http.Request) error {
	var req wire.ExecuteRequest
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.Command == "" {
		return badRequest("command is required")
	}
	timeout := s.cfg.DefaultExecTimeout
	if req.Timeout != nil {
		var err error
		if timeout, err = execTimeout(*req.Timeout, s.cfg.MaxExecTimeout); err != nil {
			return err
		}
	}
	if err := checkEnv("envs", req.Envs); err != nil {
		return err
	}
	target, err := s.reachEnvd(r)
	if err != nil {
		return err
	}
	defer target.Release()
	// The output is kept in chunks reserved from the node's budget until
	// the answer has been written: many calls at once wait for each other
	// instead of holding gigabytes (see outputBudget).
	share := s.execOutput.call()
	defer share.done()
	var truncated bool
	stdout := &outputBuffer{ctx: target.Ctx, call: share, max: s.execOutput.streamLimit(), truncated: &truncated}
	stderr := &outputBuffer{ctx: target.Ctx, call: share, max: s.execOutput.streamLimit(), truncated: &truncated}
	res, err := target.Envd.Run(target.Ctx, envdclient.RunRequest{
		Command: req.Command, Cwd: req.Cwd, Envs: req.Envs, User: req.User, Timeout: timeout,
		Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		return callError(target, err)
	}
	// wire.ExecuteResult, streamed: the output is the one part that can
	// be large.
	out := startJSON(w, http.StatusOK)
	out.Int("exitCode", res.ExitCode)
	stdout.writeString(out, "stdout")
	stderr.writeString(out, "stderr")
	if res.TimedOut {
		out.Bool("timedOut", true)
	}
	if truncated {
		out.Bool("truncated", true)
	}
	if res.TimedOut {
		out.String("error", []byte(fmt.Sprintf("command timed out after %s and was killed", timeout)))
	}
	if err := out.Close(); err != nil {
		s.logger.DebugContext(r.Context(), "execute answer cut short", "err", err)
	}
	return nil
}

// writeFileJSON writes the seed's file body; encoding "base64" makes it
// binary-safe.
func (s *Server) writeFileJSON(w http.ResponseWriter, r *http.Request) error {
	var req wire.WriteFileRequest
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if err := checkSandboxPath(req.Path); err != nil {
		return err
	}
	data := []byte(req.Content)
	switch req.Encoding {
	case "", "utf-8", "utf8", "text":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(req.Content); err != nil {
			return badRequest("content is not valid base64")
		}
	default:
		return badRequest(fmt.Sprintf("unknown encoding %q (utf-8 or base64)", req.Encoding))
	}
	return s.writeFile(w, r, req.Path, req.User, bytes.NewReader(data))
}

func (s *Server) writeFileRaw(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if err := checkSandboxPath(p); err != nil {
		return err
	}
	if r.ContentLength > s.cfg.MaxFileBytes {
		return &http.MaxBytesError{Limit: s.cfg.MaxFileBytes}
	}
	return s.writeFile(w, r, p, r.URL.Query().Get("user"), http.MaxBytesReader(w, r.Body, s.cfg.MaxFileBytes))
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, path, user string, body io.Reader) error {
	target, err := s.reachEnvd(r)
	if err != nil {
		return err
	}
	defer target.Release()
	counted := &countingReader{r: body}
	if err := target.Envd.WriteFile(target.Ctx, path, counted, user); err != nil {
		return callError(target, err)
	}
	writeJSON(w, http.StatusOK, wire.WrittenFile{Path: path, Size: counted.n})
	return nil
}

func (s *Server) readFileJSON(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := q.Get("path")
	if err := checkSandboxPath(p); err != nil {
		return err
	}
	encoding := q.Get("encoding")
	if encoding != "" && encoding != "base64" && encoding != "utf-8" {
		return badRequest(fmt.Sprintf("unknown encoding %q (utf-8 or base64)", encoding))
	}
	target, err := s.reachEnvd(r)
	if err != nil {
		return err
	}
	defer target.Release()
	rc, size, err := target.Envd.ReadFile(target.Ctx, p, q.Get("user"))
	if err != nil {
		return callError(target, err)
	}
	defer rc.Close()
	// The answer is a wire.FileContent. The raw bytes are held (text must
	// be checked for UTF-8 before the answer starts) but never a second,
	// encoded copy: see jsonStream.
	if size > s.cfg.MaxJSONBytes {
		return fileTooLargeForJSON()
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(size, 0)+1))
	if _, err := buf.ReadFrom(io.LimitReader(rc, s.cfg.MaxJSONBytes+1)); err != nil {
		return callError(target, fmt.Errorf("read %s: %w", p, err))
	}
	data := buf.Bytes()
	if int64(len(data)) > s.cfg.MaxJSONBytes {
		return fileTooLargeForJSON()
	}
	if encoding == "" && !utf8.Valid(data) {
		return badRequest("file is not valid UTF-8; ask for encoding=base64")
	}
	out := startJSON(w, http.StatusOK)
	if encoding == "base64" {
		out.Base64("content", data)
		out.String("encoding", []byte("base64"))
	} else {
		out.String("content", data)
	}
	if err := out.Close(); err != nil {
		s.logger.DebugContext(r.Context(), "file answer cut short", "err", err)
	}
	return nil
}

func fileTooLargeForJSON() error {
	return &apiError{http.StatusRequestEntityTooLarge,
		"file too large for a JSON response; use GET /sandboxes/{id}/files?path= for raw bytes"}
}

func (s *Server) readFileRaw(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if err := checkSandboxPath(p); err != nil {
		return err
	}
	target, err := s.reachEnvd(r)
	if err != nil {
		return err
	}
	defer target.Release()
	rc, size, err := target.Envd.ReadFile(target.Ctx, p, r.URL.Query().Get("user"))
	if err != nil {
		return callError(target, err)
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// reachEnvd resolves the envd of the request's sandbox for one call. The
// call must run in the target's context, which ends when the sandbox
// stops; the caller releases the target.
func (s *Server) reachEnvd(r *http.Request) (*node.Target, error) {
	return s.sandboxes.Reach(r.Context(), r.PathValue("id"), node.EnvdPort)
}

// callError is err, or the reason the call was cut when its sandbox
// stopped meanwhile (killed, paused, expired or died) or stopped
// answering.
func callError(target *node.Target, err error) error {
	if cause := context.Cause(target.Ctx); errors.Is(cause, node.ErrStopped) || errors.Is(cause, node.ErrUnavailable) {
		return cause
	}
	return err
}
