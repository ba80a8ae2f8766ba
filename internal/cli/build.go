package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// buildRequest asks the server to make a template from an OCI image.
type buildRequest struct {
	Image    string `json:"image"`
	Name     string `json:"name,omitempty"`
	Platform string `json:"platform,omitempty"`
}

// buildEvent is one line of the POST /templates stream. Progress lines
// carry phase (and layer, current, total); the last line carries
// templateID on success or error on failure.
type buildEvent struct {
	Phase      string       `json:"phase"`
	Layer      string       `json:"layer"`
	Current    int64        `json:"current"`
	Total      int64        `json:"total"`
	Message    string       `json:"message"`
	TemplateID string       `json:"templateID"`
	Error      *errorObject `json:"error"`
}

// buildTemplate posts req and follows the progress stream to its result.
// A server answering with one plain JSON object works too: the decoder
// reads whole JSON values, lines or not.
func (c *Client) buildTemplate(ctx context.Context, req buildRequest, onProgress func(buildEvent)) (json.RawMessage, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("build template: %w", err)
	}
	header := http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/x-ndjson, application/json"},
	}
	resp, err := c.send(ctx, http.MethodPost, "/templates", nil, header, bytesReader(data))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, errors.New("build template: the server ended the stream before the build finished")
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("build template: read progress: %w", err)
		}
		var ev buildEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			return nil, fmt.Errorf("build template: decode progress: %w", err)
		}
		switch {
		case ev.Error != nil:
			return nil, ev.Error.asError()
		case ev.TemplateID != "":
			return raw, nil
		}
		onProgress(ev)
	}
}
