package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// Secret is a secret's record (E2B's Secret); no answer holds its value.
type Secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
	Raw            json.RawMessage   `json:"-"`
}

// CreateSecret makes a secret of the caller's team holding value.
func (c *Client) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (Secret, error) {
	body := map[string]any{"name": name, "value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/secrets", nil, body, &raw); err != nil {
		return Secret{}, err
	}
	return decodeRaw[Secret](raw, func(s *Secret, raw json.RawMessage) { s.Raw = raw })
}

// UpdateSecret makes value the next version of secret idOrName; metadata,
// when not nil, replaces its metadata.
func (c *Client) UpdateSecret(ctx context.Context, idOrName, value string, metadata map[string]string) (Secret, error) {
	body := map[string]any{"value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/secrets/"+url.PathEscape(idOrName), nil, body, &raw); err != nil {
		return Secret{}, err
	}
	return decodeRaw[Secret](raw, func(s *Secret, raw json.RawMessage) { s.Raw = raw })
}

// ListSecrets follows X-Next-Token through every page of the secrets the
// key sees, oldest first.
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out []Secret
	token := ""
	for {
		q := url.Values{"limit": {"100"}}
		if token != "" {
			q.Set("nextToken", token)
		}
		var raws []json.RawMessage
		header, err := c.DoJSON(ctx, http.MethodGet, "/secrets", q, nil, &raws)
		if err != nil {
			return nil, err
		}
		page, err := decodeRaws(raws, func(s *Secret, raw json.RawMessage) { s.Raw = raw })
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if token = header.Get("X-Next-Token"); token == "" {
			return out, nil
		}
	}
}

// GetSecret finds a secret by ID or name.
func (c *Client) GetSecret(ctx context.Context, idOrName string) (Secret, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/secrets/"+url.PathEscape(idOrName), nil, nil, &raw); err != nil {
		return Secret{}, err
	}
	return decodeRaw[Secret](raw, func(s *Secret, raw json.RawMessage) { s.Raw = raw })
}

// DeleteSecret destroys a secret, by ID or name, and every version of it.
func (c *Client) DeleteSecret(ctx context.Context, idOrName string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, "/secrets/"+url.PathEscape(idOrName), nil, nil, nil)
	return err
}
