package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// Volume is a persistent volume; Token, the bearer token of its content
// API, is in the answers of CreateVolume and GetVolume only.
type Volume struct {
	VolumeID string          `json:"volumeID"`
	Name     string          `json:"name"`
	Token    string          `json:"token,omitempty"`
	Raw      json.RawMessage `json:"-"`
}

// CreateVolume makes an empty volume of the caller's team.
func (c *Client) CreateVolume(ctx context.Context, name string) (Volume, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/volumes", nil, map[string]string{"name": name}, &raw); err != nil {
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
