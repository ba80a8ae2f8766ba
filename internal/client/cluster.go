package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// Node is one node of a cluster, as GET /cluster/nodes reports it.
type Node struct {
	ID             string `json:"id"`
	Address        string `json:"address"`
	State          string `json:"state"` // ready, draining, unreachable or incompatible
	StateReason    string `json:"stateReason"`
	Version        string `json:"version"`
	Protocol       int    `json:"protocol"`
	StartedAt      string `json:"startedAt"`
	HeartbeatAgeMS int64  `json:"heartbeatAgeMs"`
	Capacity       struct {
		MaxSandboxes int `json:"maxSandboxes"`
		MemoryMB     int `json:"memoryMB"`
		VCPUs        int `json:"vcpus"`
	} `json:"capacity"`
	Use struct {
		Sandboxes int `json:"sandboxes"`
		Starting  int `json:"starting"`
		MemoryMB  int `json:"memoryMB"`
	} `json:"use"`
	// Cluster is set by GET /node on a node of a cluster (false on a
	// single server).
	Cluster bool            `json:"cluster"`
	Raw     json.RawMessage `json:"-"`
}

// ClusterNodes lists the nodes of the cluster behind a gateway.
func (c *Client) ClusterNodes(ctx context.Context) ([]Node, error) {
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/cluster/nodes", nil, nil, &raws); err != nil {
		return nil, err
	}
	out := make([]Node, 0, len(raws))
	for _, raw := range raws {
		var n Node
		if err := json.Unmarshal(raw, &n); err != nil {
			return nil, err
		}
		n.Raw = raw
		out = append(out, n)
	}
	return out, nil
}

// RemoveNode forgets a node that is gone for good, with its records.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, "/cluster/nodes/"+url.PathEscape(id), nil, nil, nil)
	return err
}

// DrainNode drains a node of the cluster (it takes no new sandboxes), or
// with drain false undrains it.
func (c *Client) DrainNode(ctx context.Context, id string, drain bool) error {
	verb := "drain"
	if !drain {
		verb = "undrain"
	}
	_, err := c.DoJSON(ctx, http.MethodPost, "/cluster/nodes/"+url.PathEscape(id)+"/"+verb, nil, nil, nil)
	return err
}

// ThisNode describes the server at the client's URL itself (GET /node):
// a single server or one node of a cluster, in the shape of a Node.
func (c *Client) ThisNode(ctx context.Context) (Node, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, "/node", nil, nil, &raw); err != nil {
		return Node{}, err
	}
	var n Node
	if err := json.Unmarshal(raw, &n); err != nil {
		return Node{}, err
	}
	n.Raw = raw
	return n, nil
}
