package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// idemCreate posts a create of a base sandbox tagged idem=tag with an
// Idempotency-Key through base (a gateway's URL). A create whose tag
// starts with "cold" asks for a size the warm pool does not hold: it
// boots a sandbox, which takes a while.
func idemCreate(ctx context.Context, base, key, tag string) (int, string, error) {
	fields := map[string]any{"templateID": "base", "metadata": map[string]string{"idem": tag}}
	if strings.HasPrefix(tag, "cold") {
		fields["memoryMB"] = 640
	}
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/sandboxes", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-API-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	var out struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(raw, &out)
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, "", fmt.Errorf("create: %d %s", resp.StatusCode, truncate(raw))
	}
	return resp.StatusCode, out.SandboxID, nil
}

// tagged lists the cluster's sandboxes tagged idem=tag, by ID, with
// their nodes.
func (g *gateway) tagged(t testing.TB, tag string) map[string]string {
	t.Helper()
	var page []struct {
		SandboxID string `json:"sandboxID"`
		NodeID    string `json:"nodeID"`
	}
	q := url.Values{"metadata": {url.QueryEscape("idem=" + tag)}}
	if _, err := g.api.DoJSON(context.Background(), http.MethodGet, "/v2/sandboxes", q, nil, &page); err != nil {
		t.Fatalf("list tagged %s: %v", tag, err)
	}
	out := map[string]string{}
	for _, p := range page {
		out[p.SandboxID] = p.NodeID
	}
	return out
}

// dropAnswers is a TCP proxy to upstream that forwards requests and reads
// their answers whole, then cuts the client's connection without a byte
// of them: a create the client never hears the end of.
func dropAnswers(t *testing.T, upstream string) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	answered := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				resp, err := http.ReadResponse(bufio.NewReader(u), nil)
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered <- struct{}{}
			}()
		}
	}()
	return "http://" + l.Addr().String(), answered
}

// A create or fork retried with its Idempotency-Key through any gateway
// gets the first answer: a client that lost the answer of a create made
// through one gateway gets the same sandbox through another, concurrent
// creates with one key through both gateways make one sandbox, and the
// same key with another body is refused.
func TestClusterIdempotency(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("node-a")
	c.addNode("node-b")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(t, "node-a", "node-b")
	ctx := context.Background()

	t.Run("concurrent through both gateways", func(t *testing.T) {
		// First, while the nodes are equally free: without a shared key,
		// the creates would be spread over both nodes.
		const n = 8
		ids := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, ids[i], errs[i] = idemCreate(ctx, []*gateway{g1, g2}[i%2].url, "together-1", "together")
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("create %d: %v", i, errs[i])
			}
			if ids[i] != ids[0] {
				t.Errorf("create %d got %s, create 0 %s", i, ids[i], ids[0])
			}
		}
		if made := g1.tagged(t, "together"); len(made) != 1 {
			t.Errorf("the cluster holds %d sandboxes for one key: %v", len(made), made)
		}
	})

	t.Run("answer lost, node drained, retry elsewhere", func(t *testing.T) {
		// The first answer is made and kept, but never reaches the client.
		proxy, answered := dropAnswers(t, g1.addr)
		if _, _, err := idemCreate(ctx, proxy, "lost-1", "lost"); err == nil {
			t.Fatal("the proxy passed the answer on")
		}
		select {
		case <-answered:
		case <-time.After(2 * time.Minute):
			t.Fatal("gateway 1 did not answer the create")
		}
		made := g1.tagged(t, "lost")
		if len(made) != 1 {
			t.Fatalf("the first create made %d sandboxes: %v", len(made), made)
		}
		var firstID, firstNode string
		for firstID, firstNode = range made {
		}
		// Its node takes no more: a gateway placing the retry afresh
		// would make a second sandbox on the other node.
		if err := g1.api.DrainNode(ctx, firstNode, true); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "drain seen by gateway 2", func() bool { return g2.nodeStates(t)[firstNode].State == "draining" })
		_, id, err := idemCreate(ctx, g2.url, "lost-1", "lost")
		if err != nil {
			t.Fatalf("retry through gateway 2: %v", err)
		}
		if id != firstID {
			t.Errorf("retry got %s, want the first create's %s", id, firstID)
		}
		if made := g2.tagged(t, "lost"); len(made) != 1 {
			t.Errorf("the cluster holds %d sandboxes for one key: %v", len(made), made)
		}
		if err := g1.api.DrainNode(ctx, firstNode, false); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "undrain seen", func() bool {
			return g1.nodeStates(t)[firstNode].State == "ready" && g2.nodeStates(t)[firstNode].State == "ready"
		})
		// The same key with another body is refused, through either.
		if status, _, _ := idemCreate(ctx, g1.url, "lost-1", "other"); status != http.StatusUnprocessableEntity {
			t.Errorf("same key, other body: %d, want 422", status)
		}
	})

	t.Run("client left right after sending", func(t *testing.T) {
		// The client hangs up as soon as its request is out; the retry
		// through the other gateway, while the first may still run, gets
		// what the first made.
		cctx, cancel := context.WithCancel(ctx)
		trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { cancel() }}
		if _, _, err := idemCreate(httptrace.WithClientTrace(cctx, trace), g1.url, "left-1", "left"); err == nil {
			t.Log("the first create answered before the client left")
		}
		start := time.Now()
		_, id, err := idemCreate(ctx, g2.url, "left-1", "left")
		if err != nil {
			t.Fatalf("retry through gateway 2: %v", err)
		}
		// The first gateway claimed the key even though its client had
		// left: the retry waits for its create, not for a lapsed hold
		// (15 s) on a claim nobody serves.
		if took := time.Since(start); took >= 15*time.Second {
			t.Errorf("the retry took %s: it waited out the first claim's hold", took.Round(time.Millisecond))
		}
		_, again, err := idemCreate(ctx, g1.url, "left-1", "left")
		if err != nil || again != id {
			t.Fatalf("second retry through gateway 1: %s, %v; want %s", again, err, id)
		}
		made := g1.tagged(t, "left")
		if _, ok := made[id]; !ok || len(made) != 1 {
			t.Errorf("the cluster holds %v for one key, want only %s", made, id)
		}
	})

	t.Run("gateway killed mid-create, key taken over", func(t *testing.T) {
		// A third gateway dies as soon as the create is sent; its key,
		// pending, is taken over once its hold lapses, and the retry
		// gets one sandbox whatever the node had done.
		g3 := c.addGateway()
		db, err := pgx.Connect(ctx, c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close(ctx)
		first := make(chan error, 1)
		go func() { _, _, err := idemCreate(ctx, g3.url, "killed-1", "cold-killed"); first <- err }()
		// Killed once it has noted the node it sends the create to. The
		// note is pending only while the node creates (a cold create:
		// 100 ms or so on an idle machine), so it is looked for far more
		// often than waitFor's 200 ms.
		waitForEvery(t, time.Minute, 5*time.Millisecond, "the create's node noted", func() bool {
			var n int
			err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency WHERE note LIKE 'node:%' AND state = 'pending'`).Scan(&n)
			return err == nil && n == 1
		})
		g3.cmd.Process.Signal(syscall.SIGKILL)
		<-g3.exited
		g3.cmd = nil
		if err := <-first; err == nil {
			t.Log("the first create answered before its gateway died")
		}
		start := time.Now()
		_, id, err := idemCreate(ctx, g2.url, "killed-1", "cold-killed")
		if err != nil {
			t.Fatalf("retry through gateway 2: %v", err)
		}
		t.Logf("retry answered in %s", time.Since(start).Round(time.Millisecond))
		made := g2.tagged(t, "cold-killed")
		if _, ok := made[id]; !ok || len(made) != 1 {
			t.Errorf("the cluster holds %v for one key, want only %s", made, id)
		}
	})
}
