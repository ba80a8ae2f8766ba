package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// AuditEvent is one change in the audit log (GET /audit).
type AuditEvent struct {
	Seq       int64           `json:"seq"`
	At        time.Time       `json:"at"`
	TeamID    string          `json:"teamID"`
	KeyID     string          `json:"keyID"`
	KeyName   string          `json:"keyName"`
	Admin     bool            `json:"admin"`
	Action    string          `json:"action"`
	Object    string          `json:"object"`
	Status    int             `json:"status"`
	Remote    string          `json:"remote"`
	RequestID string          `json:"requestID"`
	Raw       json.RawMessage `json:"-"`
}

// AuditFilter selects events; zero fields select everything.
type AuditFilter struct {
	Team, Action, Object string
	Since, Until         time.Time
	Before               int64 // page: events older than this seq
	Limit                int   // 0: the server's default (100)
}

// ListAudit reads the audit log, newest first (admin keys only).
func (c *Client) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error) {
	q := url.Values{}
	for name, v := range map[string]string{"team": f.Team, "action": f.Action, "object": f.Object} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		q.Set("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	if f.Before > 0 {
		q.Set("before", strconv.FormatInt(f.Before, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/audit", q, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(e *AuditEvent, raw json.RawMessage) { e.Raw = raw })
}
