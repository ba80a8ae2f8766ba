package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/aenv-dev/aenv/internal/wire"
)

// Template is one entry of GET /templates: a base, an image or a
// snapshot. Servers name templates with "name" or E2B's "aliases".
type Template struct {
	TemplateID string   `json:"templateID"`
	Name       string   `json:"name"`
	Aliases    []string `json:"aliases"`
	Kind       string   `json:"kind"` // rootfs, snapshot or sandbox
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
	CreatedAt  string   `json:"createdAt"` // RFC 3339
	// BuildStatus is the state of the template's newest build on the
	// server (waiting, building, ready, error); "" when not built there.
	BuildStatus string `json:"buildStatus"`
	// Upload is where the template's upload to the cluster's object store
	// stands (pending, uploading, uploaded, failed); "" without one.
	Upload      string `json:"upload"`
	UploadError string `json:"uploadError"`

	Raw json.RawMessage `json:"-"`
}

// ListTemplates lists every template, snapshots included.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	out, _, err := getList(ctx, c, "/templates", nil, func(t *Template, raw json.RawMessage) { t.Raw = raw })
	return out, err
}

// DeleteTemplate removes a template or snapshot, by ID or name.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, "/templates/"+url.PathEscape(ref), nil, nil, nil)
	return err
}

// CreateTemplate makes a template named name of a sandbox's files (the
// seed's POST /templates) and returns its ID.
func (c *Client) CreateTemplate(ctx context.Context, sandboxID, name string) (string, error) {
	var out wire.TemplateRef
	body := wire.NewTemplate{SandboxID: sandboxID, Name: name}
	if _, err := c.DoJSON(ctx, http.MethodPost, "/templates", nil, body, &out); err != nil {
		return "", err
	}
	if out.TemplateID == "" {
		return "", errors.New("create template: the answer has no templateID")
	}
	return out.TemplateID, nil
}

// BuildRequest asks the server to make a template from an OCI image.
type BuildRequest struct {
	Image    string `json:"image"`
	Name     string `json:"name,omitempty"`
	Platform string `json:"platform,omitempty"`
}

// BuildEvent is one line of the POST /templates stream. Progress lines
// carry Phase (and Layer, Current, Total); the last line carries
// TemplateID on success or Error on failure.
type BuildEvent struct {
	Phase      string       `json:"phase"`
	Layer      string       `json:"layer"`
	Current    int64        `json:"current"`
	Total      int64        `json:"total"`
	Message    string       `json:"message"`
	TemplateID string       `json:"templateID"`
	Error      *ErrorObject `json:"error"`

	Raw json.RawMessage `json:"-"`
}

// BuildTemplate posts req and follows the progress stream to its result,
// the last event. A server answering with one plain JSON object works too:
// the decoder reads whole JSON values, lines or not.
func (c *Client) BuildTemplate(ctx context.Context, req BuildRequest, onProgress func(BuildEvent)) (BuildEvent, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return BuildEvent{}, fmt.Errorf("build template: %w", err)
	}
	header := http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/x-ndjson, application/json"},
	}
	resp, err := c.Send(ctx, http.MethodPost, "/templates", nil, header, bytes.NewReader(data))
	if err != nil {
		return BuildEvent{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return BuildEvent{}, errors.New("build template: the server ended the stream before the build finished")
			}
			if ctx.Err() != nil {
				return BuildEvent{}, ctx.Err()
			}
			return BuildEvent{}, fmt.Errorf("build template: read progress: %w", err)
		}
		var ev BuildEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			return BuildEvent{}, fmt.Errorf("build template: decode progress: %w", err)
		}
		ev.Raw = raw
		switch {
		case ev.Error != nil:
			return BuildEvent{}, ev.Error.Err()
		case ev.TemplateID != "":
			return ev, nil
		}
		if onProgress != nil {
			onProgress(ev)
		}
	}
}

// Snapshot is one snapshot of a sandbox's memory and files.
type Snapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	SandboxID  string   `json:"sandboxID"`
	CreatedAt  string   `json:"createdAt"` // RFC 3339
	// Upload: as Template.Upload.
	Upload string `json:"upload"`
	// With an object store, once uploaded: the image's logical size, the
	// bytes its upload stored anew, and the snapshot or template whose
	// pages it shares.
	Bytes       int64  `json:"bytes"`
	StoredBytes int64  `json:"storedBytes"`
	ParentID    string `json:"parentID"`

	Raw json.RawMessage `json:"-"`
}

// CreateSnapshot snapshots a running or paused sandbox; name may be empty.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (Snapshot, error) {
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "snapshots"), nil, body, &raw); err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: decode answer: %w", err)
	}
	if snap.SnapshotID == "" {
		return Snapshot{}, errors.New("snapshot: the answer has no snapshotID")
	}
	snap.Raw = raw
	return snap, nil
}

// GetSnapshot returns one snapshot, by ID or name.
func (c *Client) GetSnapshot(ctx context.Context, ref string) (Snapshot, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(ref), nil, nil, &raw); err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: decode answer: %w", ref, err)
	}
	snap.Raw = raw
	return snap, nil
}

// ListSnapshots lists the server's snapshots.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	out, _, err := getList(ctx, c, "/snapshots", nil, func(s *Snapshot, raw json.RawMessage) { s.Raw = raw })
	return out, err
}
