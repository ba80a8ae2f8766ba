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

// metric reads one unlabelled sample of the gateway's metrics.
func (g *gateway) metric(tb testing.TB, name string) float64 {
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
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatalf("the gateway reports no %s", name)
	return 0
}

// dbQueries reads the gateway's count of database round trips made for
// requests (its node list refreshes are counted apart).
func (g *gateway) dbQueries(tb testing.TB) float64 {
	return g.metric(tb, "aenv_gateway_database_queries_total")
}

// viaBoth runs op b.N times straight to the node and b.N times through
// the gateway, alternating, so that both see the same machine; it reports
// each one's p50 and p99, what the gateway adds at p50, and the gateway's
// database round trips per call.
func viaBoth(b *testing.B, n *server, g *gateway, op func(api *client.Client) time.Duration) {
	b.Helper()
	var direct, through []time.Duration
	var queries float64
	b.ResetTimer()
	for range b.N {
		direct = append(direct, op(n.api))
		q0 := g.dbQueries(b)
		through = append(through, op(g.api))
		queries += g.dbQueries(b) - q0
	}
	b.StopTimer()
	d50, d99 := percentiles(direct)
	g50, g99 := percentiles(through)
	b.ReportMetric(d50, "direct-p50-ms")
	b.ReportMetric(d99, "direct-p99-ms")
	b.ReportMetric(g50, "gateway-p50-ms")
	b.ReportMetric(g99, "gateway-p99-ms")
	b.ReportMetric(g50-d50, "added-p50-ms")
	b.ReportMetric(queries/float64(b.N), "db-queries/call")
}

// BenchmarkGatewayExec: /execute of `true` in one sandbox, straight to its
// node and through a gateway.
func BenchmarkGatewayExec(b *testing.B) {
	c := newCluster(b)
	n := c.addNode("node-a")
	g := c.addGateway()
	g.waitReady(b, "node-a")
	id := g.create(b)
	exec := func(api *client.Client) time.Duration {
		start := time.Now()
		if _, err := api.Execute(context.Background(), id, client.ExecuteRequest{Command: "true"}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 3 {
		exec(n.api) // connections and the route warm
		exec(g.api)
	}
	viaBoth(b, n, g, exec)
}

// BenchmarkGatewayCreate: create (served by the warm pool) until the
// first /execute answers, straight to a node and through a gateway that
// places it.
func BenchmarkGatewayCreate(b *testing.B) {
	c := newCluster(b)
	n := c.addNode("node-a")
	g := c.addGateway()
	g.waitReady(b, "node-a")
	create := func(api *client.Client) time.Duration {
		b.StopTimer()
		time.Sleep(time.Second) // the warm pool refills between creates
		b.StartTimer()
		start := time.Now()
		sb, err := api.CreateSandbox(context.Background(), client.CreateSandboxRequest{TemplateID: "base"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := api.Execute(context.Background(), sb.SandboxID, client.ExecuteRequest{Command: "true"}); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		b.StopTimer()
		if err := api.DeleteSandbox(context.Background(), sb.SandboxID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return took
	}
	viaBoth(b, n, g, create)
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
			cpu0 := g.metric(b, "process_cpu_seconds_total")
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
			// What one create costs the gateway, for sizing gateways.
			b.ReportMetric((g.metric(b, "process_cpu_seconds_total")-cpu0)*1000/float64(len(made)), "gateway-cpu-ms/create")
			for _, id := range made {
				g.api.DeleteSandbox(context.Background(), id)
			}
		})
	}
}

// BenchmarkTeamKeyExec: what teams cost a call. /execute of `true`
// through a gateway, made with the operator's key and with a team's key
// (looked up in the cluster's database, at most every 0.5 s, and checked
// against the sandbox's team on the node), alternately on the same
// sandbox.
func BenchmarkTeamKeyExec(b *testing.B) {
	c := newCluster(b)
	c.addNode("node-a")
	g := c.addGateway()
	g.waitReady(b, "node-a")
	ctx := context.Background()
	if _, err := g.api.DoJSON(ctx, http.MethodPost, "/teams", nil, map[string]any{"teamID": "bench"}, nil); err != nil {
		b.Fatal(err)
	}
	var k struct {
		Key string `json:"key"`
	}
	if _, err := g.api.DoJSON(ctx, http.MethodPost, "/api-keys", nil, map[string]any{"teamID": "bench"}, &k); err != nil {
		b.Fatal(err)
	}
	team := client.New(client.Config{URL: g.url, APIKey: k.Key})
	sb, err := team.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: "base"})
	if err != nil {
		b.Fatal(err)
	}
	exec := func(api *client.Client) time.Duration {
		start := time.Now()
		if _, err := api.Execute(ctx, sb.SandboxID, client.ExecuteRequest{Command: "true"}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 3 {
		exec(g.api)
		exec(team)
	}
	var operator, teamKey []time.Duration
	b.ResetTimer()
	for range b.N {
		operator = append(operator, exec(g.api))
		teamKey = append(teamKey, exec(team))
	}
	b.StopTimer()
	o50, o99 := percentiles(operator)
	t50, t99 := percentiles(teamKey)
	b.ReportMetric(o50, "operator-p50-ms")
	b.ReportMetric(o99, "operator-p99-ms")
	b.ReportMetric(t50, "team-p50-ms")
	b.ReportMetric(t99, "team-p99-ms")
	b.ReportMetric(t50-o50, "added-p50-ms")
}

// BenchmarkTeamLimitBurst: 500 concurrent creates of one team, through two
// gateways over two nodes, against a limit of 8 sandboxes: exactly 8 are
// made; the others are refused, with 429 by the team's limit or, while
// the nodes' admission is full of creates in flight (each reserves its
// memory until its record, and with it the team's check, is written),
// with 503. It reports both counts, the burst's length and the 429s'
// latency.
func BenchmarkTeamLimitBurst(b *testing.B) {
	const limit, burst = 8, 500
	c := newCluster(b)
	c.addNode("node-a")
	c.addNode("node-b")
	g1, g2 := c.addGateway(), c.addGateway()
	g1.waitReady(b, "node-a", "node-b")
	e1, e2 := newEndpoint(b, g1.url), newEndpoint(b, g2.url)
	var lasted, refused []time.Duration
	full := 0
	for i := range b.N {
		team := fmt.Sprintf("burst-%d", i)
		e1.want(201, apiKey, "POST", "/teams", map[string]any{"teamID": team, "maxSandboxes": limit})
		var k struct {
			Key string `json:"key"`
		}
		e1.want(201, apiKey, "POST", "/api-keys", map[string]any{"teamID": team}).json(b, &k)
		type result struct {
			status int
			took   time.Duration
		}
		results := make(chan result, burst)
		start := time.Now()
		for j := range burst {
			e := []endpoint{e1, e2}[j%2]
			go func() {
				t0 := time.Now()
				r := e.call(k.Key, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 120})
				results <- result{r.status, time.Since(t0)}
			}()
		}
		made := 0
		for range burst {
			switch r := <-results; r.status {
			case 201:
				made++
			case 429:
				refused = append(refused, r.took)
			case 503:
				full++
			default:
				b.Errorf("create in a burst: status %d", r.status)
			}
		}
		lasted = append(lasted, time.Since(start))
		if made != limit {
			b.Fatalf("a burst of %d creates against a limit of %d made %d", burst, limit, made)
		}
		e1.want(200, apiKey, "DELETE", "/teams/"+team+"?force=true", nil)
	}
	r50, r99 := percentiles(refused)
	b.ReportMetric(float64(burst), "creates")
	b.ReportMetric(float64(limit), "made")
	b.ReportMetric(float64(len(refused))/float64(b.N), "refused-429")
	b.ReportMetric(float64(full)/float64(b.N), "node-full-503")
	b.ReportMetric(r50, "refusal-p50-ms")
	b.ReportMetric(r99, "refusal-p99-ms")
	l50, _ := percentiles(lasted)
	b.ReportMetric(l50, "burst-ms")
}
