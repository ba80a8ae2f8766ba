package cli

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/node"
)

// idleNode is a node the status commands never call into: GET /node and
// GET /cluster/nodes read nothing of it.
type idleNode struct{ node.Node }

func (idleNode) Transport() http.RoundTripper { return http.DefaultTransport }

// `aenv cluster status` against a single server (the real API handler):
// it says the URL is not a gateway and shows the server's own capacity and
// use, in the table and as JSON.
func TestClusterStatusOfSingleServer(t *testing.T) {
	info := api.NodeInfo{Address: "127.0.0.1:8000", State: "ready", StartedAt: time.Now().UTC(),
		Capacity: api.NodeCapacity{MemoryMB: 7937, VCPUs: 2},
		Use:      api.NodeUse{Sandboxes: 3, Starting: 1, MemoryMB: 1536}}
	srv := httptest.NewServer(api.New(api.Config{APIKey: "test-key", NodeInfo: func() api.NodeInfo { return info }},
		idleNode{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil))
	t.Cleanup(srv.Close)
	env := newCLIEnv(t, nil)
	env.vars[envURL], env.vars[envAPIKey] = srv.URL, "test-key"

	res := env.run("", "cluster", "status")
	if res.code != 0 {
		t.Fatalf("cluster status: exit %d\nstdout: %s\nstderr: %s", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, "is a single aenv server, not a cluster gateway") {
		t.Errorf("stderr does not say the URL is a single server: %q", res.stderr)
	}
	for _, want := range []string{"127.0.0.1:8000", "ready", "3/-", "1536/7937 MiB"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, res.stdout)
		}
	}

	res = env.run("", "cluster", "status", "-o", "json")
	if res.code != 0 {
		t.Fatalf("cluster status -o json: exit %d\nstderr: %s", res.code, res.stderr)
	}
	var nodes []api.NodeInfo
	if err := json.Unmarshal([]byte(res.stdout), &nodes); err != nil {
		t.Fatalf("decode %q: %v", res.stdout, err)
	}
	if len(nodes) != 1 || nodes[0].Use != info.Use || nodes[0].Capacity != info.Capacity || nodes[0].Cluster {
		t.Errorf("-o json: %+v, want [%+v]", nodes, info)
	}

	// A server that does not report itself (older than GET /node) still
	// gets a message saying what the URL is, not "no such endpoint".
	old := httptest.NewServer(api.New(api.Config{APIKey: "test-key"},
		idleNode{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil))
	t.Cleanup(old.Close)
	env.vars[envURL] = old.URL
	res = env.run("", "cluster", "status")
	if res.code == 0 || !strings.Contains(res.stderr, "is not a cluster gateway") {
		t.Errorf("against a server without GET /node: exit %d, stderr %q", res.code, res.stderr)
	}
}
