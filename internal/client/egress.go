package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/aenv-dev/aenv/internal/wire"
)

// EgressEvent is one entry of a sandbox's egress log.
type EgressEvent struct {
	wire.EgressEvent
	Raw json.RawMessage `json:"-"`
}

// EgressLog reads the node's egress gateway log of sandbox id, oldest
// first: the connections it judged by name and the DNS queries it refused.
func (c *Client) EgressLog(ctx context.Context, id string) ([]EgressEvent, error) {
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/egress", nil, nil, &raws); err != nil {
		return nil, err
	}
	return decodeRaws(raws, func(e *EgressEvent, raw json.RawMessage) { e.Raw = raw })
}
