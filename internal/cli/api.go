package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// sandbox is the answer to create (E2B's Sandbox).
type sandbox struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	Alias           string `json:"alias"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// listedSandbox is one entry of the list (E2B's ListedSandbox); the detail
// of one sandbox adds the envd access token.
type listedSandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	EnvdAccessToken string            `json:"envdAccessToken"`
}

type createSandboxRequest struct {
	TemplateID string            `json:"templateID"`
	VCPU       int               `json:"vcpu,omitempty"`
	MemoryMB   int               `json:"memoryMB,omitempty"`
	Timeout    int               `json:"timeout,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
}

// template is one entry of GET /templates. Servers name templates either
// with "name" or E2B's "aliases"; both are read.
type template struct {
	TemplateID string   `json:"templateID"`
	Name       string   `json:"name"`
	Aliases    []string `json:"aliases"`
	Image      string   `json:"image"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
	CreatedAt  string   `json:"createdAt"`
}

// snapshot is one named snapshot.
type snapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	SandboxID  string   `json:"sandboxID"`
	CreatedAt  string   `json:"createdAt"`
}

// errorObject is the {"code","message"} error shape inside bodies; code is a
// number or a string depending on the server.
type errorObject struct {
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
}

// status returns the HTTP status the code stands for, or 0.
func (e *errorObject) status() int {
	n, err := strconv.Atoi(string(e.Code))
	if err == nil {
		return n
	}
	var s string
	if json.Unmarshal(e.Code, &s) == nil {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
		switch s {
		case "not_found":
			return http.StatusNotFound
		case "unauthenticated":
			return http.StatusUnauthorized
		}
	}
	return 0
}

func (e *errorObject) asError() error {
	return &APIError{Status: e.status(), Message: e.Message}
}

// forkResult is one child of a fork: a sandbox or an error.
type forkResult struct {
	Sandbox *sandbox     `json:"sandbox"`
	Error   *errorObject `json:"error"`
}

func (c *Client) createSandbox(ctx context.Context, req createSandboxRequest) (sandbox, json.RawMessage, error) {
	var raw json.RawMessage
	if _, err := c.doJSON(ctx, http.MethodPost, "/sandboxes", nil, req, &raw); err != nil {
		return sandbox{}, nil, templateContext(req.TemplateID, err)
	}
	var sb sandbox
	if err := json.Unmarshal(raw, &sb); err != nil {
		return sandbox{}, nil, fmt.Errorf("create sandbox: decode answer: %w", err)
	}
	return sb, raw, nil
}

// templateContext names the template in a not-found error.
func templateContext(id string, err error) error {
	if apiErr, ok := err.(*APIError); ok && apiErr.Status == http.StatusNotFound {
		return &APIError{Status: http.StatusNotFound, Message: fmt.Sprintf("template %q not found (see `aenv template ls`): %s", id, apiErr.Message)}
	}
	return err
}

// sandboxContext names the sandbox in a not-found error.
func sandboxContext(id string, err error) error {
	if apiErr, ok := err.(*APIError); ok && apiErr.Status == http.StatusNotFound {
		return &APIError{Status: http.StatusNotFound, Message: fmt.Sprintf("sandbox %q not found (see `aenv ls`): %s", id, apiErr.Message)}
	}
	return err
}

// listSandboxes follows X-Next-Token through every page.
func (c *Client) listSandboxes(ctx context.Context, state string) ([]listedSandbox, []json.RawMessage, error) {
	var all []listedSandbox
	var raws []json.RawMessage
	token := ""
	for {
		q := url.Values{"limit": {"100"}}
		if state != "" {
			q.Set("state", state)
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		var page []json.RawMessage
		header, err := c.doJSON(ctx, http.MethodGet, "/v2/sandboxes", q, nil, &page)
		if err != nil {
			return nil, nil, err
		}
		for _, raw := range page {
			var sb listedSandbox
			if err := json.Unmarshal(raw, &sb); err != nil {
				return nil, nil, fmt.Errorf("list sandboxes: decode answer: %w", err)
			}
			all = append(all, sb)
			raws = append(raws, raw)
		}
		token = header.Get("X-Next-Token")
		if token == "" || len(page) == 0 {
			return all, raws, nil
		}
	}
}

func (c *Client) getSandbox(ctx context.Context, id string) (listedSandbox, error) {
	var sb listedSandbox
	_, err := c.doJSON(ctx, http.MethodGet, "/sandboxes/"+escape(id), nil, nil, &sb)
	return sb, sandboxContext(id, err)
}

// sandboxAction posts to /sandboxes/{id}/{action} and ignores the answer.
func (c *Client) sandboxAction(ctx context.Context, id, action string, body any) error {
	_, err := c.doJSON(ctx, http.MethodPost, "/sandboxes/"+escape(id)+"/"+action, nil, body, nil)
	return sandboxContext(id, err)
}

func (c *Client) deleteSandbox(ctx context.Context, id string) error {
	_, err := c.doJSON(ctx, http.MethodDelete, "/sandboxes/"+escape(id), nil, nil, nil)
	return sandboxContext(id, err)
}

func (c *Client) fork(ctx context.Context, id string, count int) ([]forkResult, json.RawMessage, error) {
	var raw json.RawMessage
	_, err := c.doJSON(ctx, http.MethodPost, "/sandboxes/"+escape(id)+"/fork", nil, map[string]int{"count": count}, &raw)
	if err != nil {
		return nil, nil, sandboxContext(id, err)
	}
	var out []forkResult
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, nil, fmt.Errorf("fork: decode answer: %w", err)
	}
	return out, raw, nil
}

func (c *Client) createSnapshot(ctx context.Context, id, name string) (snapshot, json.RawMessage, error) {
	var raw json.RawMessage
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	_, err := c.doJSON(ctx, http.MethodPost, "/sandboxes/"+escape(id)+"/snapshots", nil, body, &raw)
	if err != nil {
		return snapshot{}, nil, sandboxContext(id, err)
	}
	var snap snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		return snapshot{}, nil, fmt.Errorf("snapshot: decode answer: %w", err)
	}
	return snap, raw, nil
}

// listJSON gets a JSON array, decoding each element into T and keeping the
// raw elements for -o json.
func listJSON[T any](ctx context.Context, c *Client, path string) ([]T, []json.RawMessage, error) {
	var raws []json.RawMessage
	if _, err := c.doJSON(ctx, http.MethodGet, path, nil, nil, &raws); err != nil {
		return nil, nil, err
	}
	out := make([]T, 0, len(raws))
	for _, raw := range raws {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, nil, fmt.Errorf("GET %s: decode answer: %w", path, err)
		}
		out = append(out, v)
	}
	return out, raws, nil
}

func (c *Client) deleteTemplate(ctx context.Context, id string) error {
	_, err := c.doJSON(ctx, http.MethodDelete, "/templates/"+escape(id), nil, nil, nil)
	if apiErr, ok := err.(*APIError); ok && apiErr.Status == http.StatusNotFound {
		return &APIError{Status: http.StatusNotFound, Message: fmt.Sprintf("%q not found: %s", id, apiErr.Message)}
	}
	return err
}
