package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// TeamUsage is one team's use on one day (GET /usage).
type TeamUsage struct {
	TeamID          string  `json:"teamID"`
	Day             string  `json:"day"`
	SandboxSeconds  float64 `json:"sandboxSeconds"`
	MemoryMBSeconds float64 `json:"memoryMBSeconds"`
	VCPUSeconds     float64 `json:"vcpuSeconds"`
	CPUSeconds      float64 `json:"cpuSeconds"`
	// StoredMBSeconds is what the team kept stored (snapshots' images,
	// volumes' files; MiB) weighed by the time kept.
	StoredMBSeconds float64         `json:"storedMBSeconds"`
	Raw             json.RawMessage `json:"-"`
}

// ListTeamUsage reads the teams' use by day: team's ("" every team's, for
// an admin key; a team's key gets its own), from and to days (YYYY-MM-DD,
// "" unbounded).
func (c *Client) ListTeamUsage(ctx context.Context, team, from, to string) ([]TeamUsage, error) {
	q := url.Values{}
	for name, v := range map[string]string{"team": team, "from": from, "to": to} {
		if v != "" {
			q.Set(name, v)
		}
	}
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/usage", q, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(u *TeamUsage, raw json.RawMessage) { u.Raw = raw })
}
