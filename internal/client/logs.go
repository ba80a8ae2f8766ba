package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/aenv-dev/aenv/internal/wire"
)

// LogQuery selects entries of a sandbox's log (E2B's v2 log call).
type LogQuery struct {
	// Since bounds the entries: at or after it (at or before it when
	// Backward). Zero is no bound. The server counts in milliseconds.
	Since    time.Time
	Backward bool   // the newest Limit entries rather than the oldest
	Limit    int    // 0: the server's largest page, 1000
	Level    string // the lowest level: debug, info, warn or error; "" = all
	Search   string // a case-sensitive substring of the message
}

// SandboxLog reads what sandbox id's envd logged since the sandbox last
// started or resumed on its node, oldest first.
func (c *Client) SandboxLog(ctx context.Context, id string, q LogQuery) ([]wire.SandboxLogEntry, error) {
	v := url.Values{}
	if !q.Since.IsZero() {
		v.Set("cursor", strconv.FormatInt(max(q.Since.UnixMilli(), 0), 10))
	}
	if q.Backward {
		v.Set("direction", "backward")
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Level != "" {
		v.Set("level", q.Level)
	}
	if q.Search != "" {
		v.Set("search", q.Search)
	}
	var out wire.SandboxLogsV2
	if _, err := c.DoJSON(ctx, http.MethodGet, "/v2/sandboxes/"+url.PathEscape(id)+"/logs", v, nil, &out); err != nil {
		return nil, err
	}
	return out.Logs, nil
}
