package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/aenv-dev/aenv/internal/wire"
)

// PutFile streams r into path inside the sandbox (raw bytes; PUT
// /sandboxes/{id}/files). size is r's length, or -1 when unknown.
func (c *Client) PutFile(ctx context.Context, id, path string, r io.Reader, size int64) error {
	header := http.Header{"Content-Type": {"application/octet-stream"}}
	if size >= 0 {
		header.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	resp, err := c.Send(ctx, http.MethodPut, sandboxPath(id, "files"), url.Values{"path": {path}}, header, r)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// GetFile opens path inside the sandbox (raw bytes). The caller closes
// the reader.
func (c *Client) GetFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.Send(ctx, http.MethodGet, sandboxPath(id, "files"), url.Values{"path": {path}}, nil, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteText writes a text file through the seed's JSON endpoint.
func (c *Client) WriteText(ctx context.Context, id, path, content string) error {
	body := map[string]string{"path": path, "content": content}
	_, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "files", "write"), nil, body, nil)
	return err
}

// ReadText reads a text file through the seed's JSON endpoint.
func (c *Client) ReadText(ctx context.Context, id, path string) (string, error) {
	var out wire.FileContent
	if _, err := c.DoJSON(ctx, http.MethodGet, sandboxPath(id, "files", "read"), url.Values{"path": {path}}, nil, &out); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return out.Content, nil
}
