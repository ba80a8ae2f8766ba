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
	"time"
	"unicode/utf8"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
)

// executeRequest is the seed's exec body.
type executeRequest struct {
	Command string            `json:"command"`
	Cwd     string            `json:"cwd"`
	Envs    map[string]string `json:"envs"`
	Timeout *float64          `json:"timeout"` // seconds
	User    string            `json:"user"`
}

type executeResponse struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timedOut,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Error     string `json:"error,omitempty"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) error {
	var req executeRequest
	if err := decodeJSON(w, r, s.cfg.MaxJSONBytes, &req); err != nil {
		return err
	}
	if req.Command == "" {
		return badRequest("command is required")
	}
	timeout := s.cfg.DefaultExecTimeout
	if req.Timeout != nil {
		if *req.Timeout <= 0 || time.Duration(*req.Timeout*float64(time.Second)) > s.cfg.MaxExecTimeout {
			return badRequest(fmt.Sprintf("timeout must be between 0 and %d seconds", int(s.cfg.MaxExecTimeout.Seconds())))
		}
		timeout = time.Duration(*req.Timeout * float64(time.Second))
	}
	target, err := s.reachEnvd(r)
	if err != nil {
		return err
	}
	defer target.Release()
	res, err := target.Envd.Run(target.Ctx, envdclient.RunRequest{
		Command: req.Command, Cwd: req.Cwd, Envs: req.Envs, User: req.User, Timeout: timeout,
	})
	if err != nil {
		return callError(target, err)
	}
	out := executeResponse{ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr),
		TimedOut: res.TimedOut, Truncated: res.Truncated}
	if res.TimedOut {
		out.Error = fmt.Sprintf("command timed out after %s and was killed", timeout)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// writeFileRequest is the seed's file write body; encoding "base64" makes
// it binary-safe.
type writeFileRequest struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
	User     string `json:"user"`
}

func (s *Server) writeFileJSON(w http.ResponseWriter, r *http.Request) error {
	var req writeFileRequest
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
	writeJSON(w, http.StatusOK, map[string]any{"path": path, "size": counted.n})
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
	rc, _, err := target.Envd.ReadFile(target.Ctx, p, q.Get("user"))
	if err != nil {
		return callError(target, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, s.cfg.MaxJSONBytes+1))
	if err != nil {
		return callError(target, fmt.Errorf("read %s: %w", p, err))
	}
	if int64(len(data)) > s.cfg.MaxJSONBytes {
		return &apiError{http.StatusRequestEntityTooLarge,
			"file too large for a JSON response; use GET /sandboxes/{id}/files?path= for raw bytes"}
	}
	if encoding == "base64" {
		writeJSON(w, http.StatusOK, map[string]string{"content": base64.StdEncoding.EncodeToString(data), "encoding": "base64"})
		return nil
	}
	if encoding == "" && !utf8.Valid(data) {
		return badRequest("file is not valid UTF-8; ask for encoding=base64")
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": string(data)})
	return nil
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
// stopped meanwhile (killed, paused, expired or died).
func callError(target *node.Target, err error) error {
	if cause := context.Cause(target.Ctx); errors.Is(cause, node.ErrStopped) {
		return cause
	}
	return err
}
