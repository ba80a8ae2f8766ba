package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// Calls with a body to a sandbox whose node has just died are answered
// (502/503) on the client's own connection, call after call: the
// forwarding's body reads end with the call, so none runs into the
// server's reading of the connection's next request.
func TestForwardToDeadNodeKeepsConnection(t *testing.T) {
	dead := newFakeNode(t, "a", nil) // refuses connections: its process is gone
	db := newFakeStore()
	db.nodes = []postgres.Node{nodeRecord(dead, 10, 0, false)} // its heartbeat not yet stale
	g := newTestGateway(t, db)
	g.routes.put("sb1", "a")
	srv := httptest.NewServer(g)
	defer srv.Close()
	client := srv.Client()
	for i := range 50 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/sandboxes/sb1/execute",
			strings.NewReader(`{"command":"echo hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", testKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("call %d: status %d", i, resp.StatusCode)
		}
	}
}
