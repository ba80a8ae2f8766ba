package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Team is a team, as GET /teams reports it.
type Team struct {
	TeamID       string    `json:"teamID"`
	CreatedAt    time.Time `json:"createdAt"`
	MaxSandboxes int       `json:"maxSandboxes"` // 0: no limit
	MaxMemoryMB  int       `json:"maxMemoryMB"`  // 0: no limit
	MaxVCPUs     int       `json:"maxVCPUs"`     // 0: no limit
	MaxStarting  int       `json:"maxStarting"`  // 0: no limit
	// CreatesPerSecond bounds creates, fork children included; 0: no limit.
	CreatesPerSecond int `json:"createsPerSecond"`
	// MaxSnapshots bounds the snapshots and templates of sandboxes it
	// keeps; 0: no limit.
	MaxSnapshots int `json:"maxSnapshots"`
	// MaxVolumes bounds the volumes it keeps, and MaxVolumeMB their sizes
	// summed; 0: no limit.
	MaxVolumes  int `json:"maxVolumes"`
	MaxVolumeMB int `json:"maxVolumeMB"`
	// MaxSnapshotMB bounds the MiB its snapshots and templates of
	// sandboxes take; 0: no limit.
	MaxSnapshotMB int             `json:"maxSnapshotMB"`
	Raw           json.RawMessage `json:"-"`
}

// TeamLimits are limits to give a team; 0 is none. A nil one is left
// out: unlimited for a new team, unchanged for SetTeamLimits.
type TeamLimits struct {
	MaxSandboxes *int `json:"maxSandboxes,omitempty"`
	MaxMemoryMB  *int `json:"maxMemoryMB,omitempty"`
	MaxVCPUs     *int `json:"maxVCPUs,omitempty"`
	MaxStarting  *int `json:"maxStarting,omitempty"`
	// CreatesPerSecond bounds creates, fork children included.
	CreatesPerSecond *int `json:"createsPerSecond,omitempty"`
	// MaxSnapshots bounds the snapshots and templates of sandboxes kept.
	MaxSnapshots *int `json:"maxSnapshots,omitempty"`
	// MaxVolumes bounds the volumes kept, MaxVolumeMB their sizes summed.
	MaxVolumes  *int `json:"maxVolumes,omitempty"`
	MaxVolumeMB *int `json:"maxVolumeMB,omitempty"`
	// MaxSnapshotMB bounds the MiB of snapshots and templates of
	// sandboxes kept.
	MaxSnapshotMB *int `json:"maxSnapshotMB,omitempty"`
}

// APIKey is an API key's record; Key holds the key itself only in the
// answer to its creation.
type APIKey struct {
	ID        string          `json:"id"`
	TeamID    string          `json:"teamID"`
	Name      string          `json:"name"`
	Prefix    string          `json:"prefix"`
	Admin     bool            `json:"admin"`
	CreatedAt time.Time       `json:"createdAt"`
	ExpiresAt time.Time       `json:"expiresAt"`
	LastUsed  time.Time       `json:"lastUsed"`
	RevokedAt time.Time       `json:"revokedAt"`
	Key       string          `json:"key,omitempty"`
	Raw       json.RawMessage `json:"-"`
}

// NewAPIKey asks for a key: of TeamID ("" the caller's), valid for
// ExpiresIn (0: forever).
type NewAPIKey struct {
	Name      string
	TeamID    string
	Admin     bool
	ExpiresIn time.Duration
}

// DeletedTeam answers a team's deletion.
type DeletedTeam struct {
	TeamID string   `json:"teamID"`
	Killed []string `json:"killed"`
}

// newerField is the field of a team that tells whether a server knows
// every limit l sets, "" when any server does: servers before a limit
// ignore it (they know only maxSandboxes, then up to createsPerSecond,
// then maxSnapshots, then maxVolumes).
func (l TeamLimits) newerField() string {
	switch {
	case l.MaxSnapshotMB != nil:
		return "maxSnapshotMB"
	case l.MaxVolumes != nil || l.MaxVolumeMB != nil:
		return "maxVolumes"
	case l.MaxSnapshots != nil:
		return "maxSnapshots"
	case l.MaxMemoryMB != nil || l.MaxVCPUs != nil || l.MaxStarting != nil || l.CreatesPerSecond != nil:
		return "createsPerSecond"
	}
	return ""
}

// checkKnowsLimits refuses limits the server would ignore: a server of a
// release before them does not read them, and a PATCH of one could set
// another to 0. It asks for team id (any team the key sees when "") and
// looks for field in the answer.
func (c *Client) checkKnowsLimits(ctx context.Context, id, field string) error {
	var raw json.RawMessage
	if id != "" {
		if _, err := c.DoJSON(ctx, http.MethodGet, "/teams/"+url.PathEscape(id), nil, nil, &raw); err != nil {
			return err
		}
	} else {
		var raws []json.RawMessage
		if _, err := c.DoJSON(ctx, http.MethodGet, "/teams", nil, nil, &raws); err != nil {
			return err
		}
		if len(raws) == 0 {
			return nil
		}
		raw = raws[0]
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("read team: %w", err)
	}
	if _, ok := fields[field]; !ok {
		return fmt.Errorf("the server does not know the team limit %s: upgrade it (or every gateway) before setting it", field)
	}
	return nil
}

// CreateTeam makes a team (admin keys only) with limits.
func (c *Client) CreateTeam(ctx context.Context, id string, limits TeamLimits) (Team, error) {
	if f := limits.newerField(); f != "" {
		if err := c.checkKnowsLimits(ctx, "", f); err != nil {
			return Team{}, err
		}
	}
	var raw json.RawMessage
	body := struct {
		TeamID string `json:"teamID"`
		TeamLimits
	}{id, limits}
	if _, err := c.DoJSON(ctx, http.MethodPost, "/teams", nil, body, &raw); err != nil {
		return Team{}, err
	}
	return decodeRaw[Team](raw, func(t *Team, raw json.RawMessage) { t.Raw = raw })
}

// SetTeamLimits changes the limits given of a team (admin keys only).
func (c *Client) SetTeamLimits(ctx context.Context, id string, limits TeamLimits) (Team, error) {
	if f := limits.newerField(); f != "" {
		if err := c.checkKnowsLimits(ctx, id, f); err != nil {
			return Team{}, err
		}
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPatch, "/teams/"+url.PathEscape(id), nil, limits, &raw); err != nil {
		return Team{}, err
	}
	return decodeRaw[Team](raw, func(t *Team, raw json.RawMessage) { t.Raw = raw })
}

// ListTeams lists the teams the key sees: all for an admin, else its own.
func (c *Client) ListTeams(ctx context.Context) ([]Team, error) {
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/teams", nil, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(t *Team, raw json.RawMessage) { t.Raw = raw })
}

// DeleteTeam deletes a team and its keys; force kills its sandboxes first.
func (c *Client) DeleteTeam(ctx context.Context, id string, force bool) (DeletedTeam, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	var out DeletedTeam
	_, err := c.DoJSON(ctx, http.MethodDelete, "/teams/"+url.PathEscape(id), q, nil, &out)
	return out, err
}

// CreateAPIKey makes a key; the answer holds the key, shown this once.
func (c *Client) CreateAPIKey(ctx context.Context, req NewAPIKey) (APIKey, error) {
	body := map[string]any{"name": req.Name}
	if req.TeamID != "" {
		body["teamID"] = req.TeamID
	}
	if req.Admin {
		body["admin"] = true
	}
	if req.ExpiresIn > 0 {
		body["expiresIn"] = int64(req.ExpiresIn / time.Second)
	}
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/api-keys", nil, body, &raw); err != nil {
		return APIKey{}, err
	}
	k, err := decodeRaw[APIKey](raw, func(k *APIKey, raw json.RawMessage) { k.Raw = raw })
	if err == nil && k.Key == "" {
		err = fmt.Errorf("create API key: the answer has no key")
	}
	return k, err
}

// ListAPIKeys lists keys: of team ("" every team's the caller sees).
func (c *Client) ListAPIKeys(ctx context.Context, team string) ([]APIKey, error) {
	var q url.Values
	if team != "" {
		q = url.Values{"teamID": {team}}
	}
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/api-keys", q, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(k *APIKey, raw json.RawMessage) { k.Raw = raw })
}

// RevokeAPIKey revokes a key by ID.
func (c *Client) RevokeAPIKey(ctx context.Context, id string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, "/api-keys/"+url.PathEscape(id), nil, nil, nil)
	return err
}

func decodeRaw[T any](raw json.RawMessage, keep func(*T, json.RawMessage)) (T, error) {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("decode answer: %w", err)
	}
	keep(&v, raw)
	return v, nil
}

func decodeRaws[T any](raws []json.RawMessage, keep func(*T, json.RawMessage)) ([]T, error) {
	out := make([]T, 0, len(raws))
	for _, raw := range raws {
		v, err := decodeRaw(raw, keep)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
