package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// The cluster's benchmarks: what a gateway adds to a call (against the
// same call straight to the node, in the same run), how many database
// round trips it makes per call, and creates per second through one
// gateway as nodes are added. Run with `make bench-go`.

// dbQueries reads the gateway's count of database round trips.
func (g *gateway) dbQueries(tb testing.TB) float64 {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.url+"/metrics", nil)
	req.Header.Set("X-API-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "aenv_gateway_database_queries_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatal("the gateway reports no database query count")
	return 0
}

// BenchmarkGatewayExec: /execute of `true` in one sandbox, straight to its
// node and through a gateway.
func BenchmarkGatewayExec(b *testing.B) {
	c := newCluster(b)
	n := c.addNode("node-a")
	g := c.addGateway()
	g.waitReady(b, "node-a")
	id := g.create(b)
	for _, via := range []struct {
		name string
		api  *client.Client
	}{{"direct", n.api}, {"gateway", g.api}} {
		b.Run(via.name, func(b *testing.B) {
			exec := func() {
				if _, err := via.api.Execute(context.Background(), id, client.ExecuteRequest{Command: "true"}); err != nil {
					b.Fatal(err)
				}
			}
			for range 3 {
				exec() // connections and routes warm
			}
			q0 := g.dbQueries(b)
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				exec()
				samples = append(samples, time.Since(start))
			}
			b.StopTimer()
			reportLatencies(b, samples)
			if via.name == "gateway" {
				b.ReportMetric((g.dbQueries(b)-q0-1)/float64(b.N), "db-queries/op")
			}
		})
	}
}

// BenchmarkGatewayCreate: create (warm pool) until the first /execute
// answers, straight to a node and through a gateway placing it.
func BenchmarkGatewayCreate(b *testing.B) {
	c := newCluster(b)
	n := c.addNode("node-a")
	g := c.addGateway()
	g.waitReady(b, "node-a")
	for _, via := range []struct {
		name string
		api  *client.Client
	}{{"direct", n.api}, {"gateway", g.api}} {
		b.Run(via.name, func(b *testing.B) {
			var ids []string
			samples := make([]time.Duration, 0, b.N)
			q0 := g.dbQueries(b)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				time.Sleep(time.Second) // the warm pool refills between creates
				b.StartTimer()
				start := time.Now()
				sb, err := via.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := via.api.Execute(context.Background(), sb.SandboxID, client.ExecuteRequest{Command: "true"}); err != nil {
					b.Fatal(err)
				}
				samples = append(samples, time.Since(start))
				ids = append(ids, sb.SandboxID)
			}
			b.StopTimer()
			reportLatencies(b, samples)
			if via.name == "gateway" {
				// Less the scrapes' own and the node list refreshes of
				// the run (one per refresh interval, whatever the load).
				b.ReportMetric((g.dbQueries(b)-q0-1)/float64(b.N), "db-queries/op(incl-refresh)")
			}
			for _, id := range ids {
				via.api.DeleteSandbox(context.Background(), id)
			}
		})
	}
}

// BenchmarkGatewayCreateRate: creates per second through one gateway,
// 8 at a time, with one node and with three (all on this machine, so
// they share its cores: the figure shows the gateway's overhead and the
// placement's spread, not three machines' capacity).
func BenchmarkGatewayCreateRate(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			c := newCluster(b)
			var ids []string
			for i := range nodes {
				c.addNode(fmt.Sprintf("node-%d", i))
				ids = append(ids, fmt.Sprintf("node-%d", i))
			}
			g := c.addGateway()
			g.waitReady(b, ids...)
			const parallel = 8
			var mu sync.Mutex
			var made []string
			sem := make(chan struct{}, parallel)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					sb, err := g.api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					made = append(made, sb.SandboxID)
					mu.Unlock()
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(len(made))/elapsed.Seconds(), "creates/s")
			for _, id := range made {
				g.api.DeleteSandbox(context.Background(), id)
			}
		})
	}
}
