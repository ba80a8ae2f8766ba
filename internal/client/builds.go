package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/wire"
)

// E2B's template build API, as its SDK uses it: request a build, upload
// the files of its COPY steps by content hash, start it, poll its status
// and logs.

// TemplateBuildRequest is POST /v3/templates.
type TemplateBuildRequest struct {
	Name     string   `json:"name"`
	Tags     []string `json:"tags,omitempty"`
	CPUCount int      `json:"cpuCount,omitempty"`
	MemoryMB int      `json:"memoryMB,omitempty"`
}

// TemplateBuildRef names a requested build.
type TemplateBuildRef struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
}

// TemplateBuildSpec is what starts a build: its base and steps.
type TemplateBuildSpec struct {
	FromImage    string         `json:"fromImage,omitempty"`
	FromTemplate string         `json:"fromTemplate,omitempty"`
	StartCmd     string         `json:"startCmd,omitempty"`
	ReadyCmd     string         `json:"readyCmd,omitempty"`
	Force        bool           `json:"force,omitempty"`
	Steps        []TemplateStep `json:"steps"`
}

// TemplateStep is one step: RUN, COPY, ENV, WORKDIR or USER.
type TemplateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// TemplateBuildStatus is a build's state and its log from an offset.
type TemplateBuildStatus struct {
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"` // waiting, building, ready, error
	LogEntries []BuildLogEntry    `json:"logEntries"`
	Reason     *BuildStatusReason `json:"reason"`

	Raw json.RawMessage `json:"-"`
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step"`
}

// BuildStatusReason says why a build failed.
type BuildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step"`
	LogEntries []BuildLogEntry `json:"logEntries"`
}

// RequestTemplateBuild registers a build of a template.
func (c *Client) RequestTemplateBuild(ctx context.Context, req TemplateBuildRequest) (TemplateBuildRef, error) {
	var out TemplateBuildRef
	if _, err := c.DoJSON(ctx, http.MethodPost, "/v3/templates", nil, req, &out); err != nil {
		return out, err
	}
	if out.TemplateID == "" || out.BuildID == "" {
		return out, errors.New("request build: the answer has no templateID or buildID")
	}
	return out, nil
}

// UploadTemplateFiles stores the archive of a COPY step's files under
// hash unless the server has it; it reports whether it uploaded. size is
// the archive's length.
func (c *Client) UploadTemplateFiles(ctx context.Context, templateID, hash string, archive io.Reader, size int64) (bool, error) {
	var link wire.TemplateFilesUpload
	p := "/templates/" + url.PathEscape(templateID) + "/files/" + url.PathEscape(hash)
	if _, err := c.DoJSON(ctx, http.MethodGet, p, nil, nil, &link); err != nil {
		return false, err
	}
	if link.Present {
		return false, nil
	}
	if link.URL == "" {
		return false, errors.New("upload files: the server gave no upload link")
	}
	// The link is signed: it goes without the API key, like the SDK's.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, link.URL, archive)
	if err != nil {
		return false, fmt.Errorf("upload files: %w", err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Length", strconv.FormatInt(size, 10))
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return false, &UnreachableError{URL: c.cfg.URL, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return false, readAPIError(http.MethodPut, "upload link", resp)
	}
	return true, nil
}

// StartTemplateBuild starts a requested build.
func (c *Client) StartTemplateBuild(ctx context.Context, ref TemplateBuildRef, spec TemplateBuildSpec) error {
	p := "/v2/templates/" + url.PathEscape(ref.TemplateID) + "/builds/" + url.PathEscape(ref.BuildID)
	_, err := c.DoJSON(ctx, http.MethodPost, p, nil, spec, nil)
	return err
}

// TemplateBuildStatus reads a build's state and its log entries from
// logsOffset on.
func (c *Client) TemplateBuildStatus(ctx context.Context, ref TemplateBuildRef, logsOffset int) (TemplateBuildStatus, error) {
	var raw json.RawMessage
	p := "/templates/" + url.PathEscape(ref.TemplateID) + "/builds/" + url.PathEscape(ref.BuildID) + "/status"
	q := url.Values{"logsOffset": {strconv.Itoa(logsOffset)}}
	if _, err := c.DoJSON(ctx, http.MethodGet, p, q, nil, &raw); err != nil {
		return TemplateBuildStatus{}, err
	}
	var st TemplateBuildStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return TemplateBuildStatus{}, fmt.Errorf("build status: decode answer: %w", err)
	}
	st.Raw = raw
	return st, nil
}
