package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Volume is a persistent volume; Token, the bearer token of its content
// API, is in the answers of CreateVolume and GetVolume only.
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
	// SizeMB bounds the volume's files (0: no bound; only a node with a
	// volume pool bounds volumes).
	SizeMB int64 `json:"sizeMB,omitempty"`
	// NodeID is the node keeping the volume, in a cluster; MovingTo the
	// node a move is taking it to, while it moves.
	NodeID   string          `json:"nodeID,omitempty"`
	MovingTo string          `json:"movingTo,omitempty"`
	Raw      json.RawMessage `json:"-"`
}

// CreateVolume makes an empty volume of the caller's team, of sizeMB MiB
// at most (0: the node's default; a node without a volume pool takes
// none).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (Volume, error) {
	body := map[string]any{"name": name}
	if sizeMB != 0 {
		body["sizeMB"] = sizeMB
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/volumes", nil, body, &raw); err != nil {
		return Volume{}, err
	}
	return decodeRaw[Volume](raw, func(v *Volume, raw json.RawMessage) { v.Raw = raw })
}

// ListVolumes lists the volumes the key sees, by name.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/volumes", nil, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(v *Volume, raw json.RawMessage) { v.Raw = raw })
}

// GetVolume finds a volume by ID or name.
func (c *Client) GetVolume(ctx context.Context, idOrName string) (Volume, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/volumes/"+url.PathEscape(idOrName), nil, nil, &raw); err != nil {
		return Volume{}, err
	}
	return decodeRaw[Volume](raw, func(v *Volume, raw json.RawMessage) { v.Raw = raw })
}

// DeleteVolume deletes a volume, by ID or name, and its content.
func (c *Client) DeleteVolume(ctx context.Context, idOrName string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(idOrName), nil, nil, nil)
	return err
}

// MoveVolume moves a volume nothing mounts to node (""; the readiest
// other node) of a cluster, through a gateway. With wait, it answers once
// the volume is there; without, once the move has begun (the volume's
// MovingTo says where it goes until the move ends).
func (c *Client) MoveVolume(ctx context.Context, idOrName, node string, wait bool) (Volume, error) {
	body := map[string]any{}
	if node != "" {
		body["nodeID"] = node
	}
	if !wait {
		body["wait"] = false
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/volumes/"+url.PathEscape(idOrName)+"/move", nil, body, &raw); err != nil {
		return Volume{}, err
	}
	return decodeRaw[Volume](raw, func(v *Volume, raw json.RawMessage) { v.Raw = raw })
}

// VolumeEntry describes a file, directory or link in a volume (E2B's
// VolumeEntryStat).
type VolumeEntry struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"` // from the volume's root, starting with /
	Type   string    `json:"type"` // "file", "directory", "symlink" or "unknown"
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	Mtime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"`
}

// VolumeFiles reaches a volume's content API with its token.
type VolumeFiles struct {
	c     *Client
	id    string
	token string
}

// Files returns the content API of v, whose Token must be set (as
// CreateVolume and GetVolume answer it).
func (c *Client) Files(v Volume) *VolumeFiles {
	return &VolumeFiles{c: c, id: v.VolumeID, token: v.Token}
}

func (f *VolumeFiles) send(ctx context.Context, method, route, path string, query url.Values, header http.Header,
	body io.Reader) (*http.Response, error) {
	if query == nil {
		query = url.Values{}
	}
	query.Set("path", path)
	if header == nil {
		header = http.Header{}
	}
	header.Set("Authorization", "Bearer "+f.token)
	return f.c.Send(ctx, method, "/volumecontent/"+url.PathEscape(f.id)+"/"+route, query, header, body)
}

func decodeEntry[T any](resp *http.Response, out *T) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("volume content: decode answer: %w", err)
	}
	return nil
}

// Stat describes path.
func (f *VolumeFiles) Stat(ctx context.Context, path string) (VolumeEntry, error) {
	resp, err := f.send(ctx, http.MethodGet, "path", path, nil, nil, nil)
	if err != nil {
		return VolumeEntry{}, err
	}
	var e VolumeEntry
	return e, decodeEntry(resp, &e)
}

// List lists directory path, depth levels down (1: its entries).
func (f *VolumeFiles) List(ctx context.Context, path string, depth int) ([]VolumeEntry, error) {
	resp, err := f.send(ctx, http.MethodGet, "dir", path, url.Values{"depth": {strconv.Itoa(depth)}}, nil, nil)
	if err != nil {
		return nil, err
	}
	var es []VolumeEntry
	return es, decodeEntry(resp, &es)
}

// MakeDir makes directory path and its missing parents; one that exists
// is not an error.
func (f *VolumeFiles) MakeDir(ctx context.Context, path string) error {
	resp, err := f.send(ctx, http.MethodPost, "dir", path, url.Values{"force": {"true"}}, nil, nil)
	if StatusOf(err) == http.StatusConflict {
		return nil
	}
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ReadFile opens file path; the caller closes the body. The length is the
// file's size.
func (f *VolumeFiles) ReadFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := f.send(ctx, http.MethodGet, "file", path, nil, nil, nil)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFile writes size bytes of r to file path, whole (a cut upload
// leaves the old file), making missing parents; mode 0 keeps the
// server's default.
func (f *VolumeFiles) WriteFile(ctx context.Context, path string, r io.Reader, size int64, mode uint32) error {
	q := url.Values{"force": {"true"}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 10))
	}
	header := http.Header{"Content-Type": {"application/octet-stream"}, "Content-Length": {strconv.FormatInt(size, 10)}}
	resp, err := f.send(ctx, http.MethodPut, "file", path, q, header, r)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
