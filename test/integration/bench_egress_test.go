package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// Benchmarks of the egress gateway (make bench-egress): a sandbox whose
// policy allows a host by name (its connections go through the node's
// gateway, which reads their SNI and dials the name) next to one allowing
// the host's address (its connections go straight out, judged by the
// firewall alone), in the same run, against the same HTTPS host.

// handshakeScript times n new HTTPS connections (TCP, TLS, one GET, close)
// to host at addr from inside a sandbox and prints the milliseconds of each.
const handshakeScript = `python3 - "$@" <<'EOF'
import socket, ssl, sys, time
host, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
out = []
for i in range(n):
    t = time.perf_counter()
    s = ctx.wrap_socket(socket.create_connection((addr, 443)), server_hostname=host)
    s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()
    out.append((time.perf_counter() - t) * 1000)
print(" ".join("%.3f" % x for x in out))
EOF`

// egressBench starts a server whose sandboxes' DNS names one HTTPS host,
// allowed.test.
func egressBench(b *testing.B) (*server, *testCA, *namedHost) {
	ca := newTestCA(b)
	host := newNamedHost(b, ca, "a", "allowed.test")
	hosts := filepath.Join(b.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte(host.addr+" allowed.test\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	caFile := filepath.Join(b.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(ca.pem), 0o644); err != nil {
		b.Fatal(err)
	}
	s := newServer(b, "--dns-hosts-file", hosts, "--egress-upstream-ca-file", caFile)
	s.start()
	return s, ca, host
}

func BenchmarkEgress(b *testing.B) {
	s, ca, host := egressBench(b)
	denyAll := []string{"0.0.0.0/0"}
	direct := s.create(map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{host.addr}, "denyOut": denyAll}}).SandboxID
	named := s.create(map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"allowed.test"}, "denyOut": denyAll}}).SandboxID
	// The same host with a header transform: the gateway terminates TLS
	// with the node's CA, sets the header, and re-originates TLS.
	s.expect(s.do("POST", "/secrets", map[string]any{"name": "bench-key", "value": "bench-secret"}), 201, "secret")
	intercepted := s.create(map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"allowed.test"},
		"denyOut": denyAll, "rules": map[string]any{"allowed.test": []any{map[string]any{"transform": map[string]any{
			"headers": map[string]string{"Authorization": "Bearer ${e2b.secrets.bench-key}"}}}}}}}).SandboxID
	sh := func(id, cmd string) client.ExecuteResult {
		b.Helper()
		res := s.exec(id, client.ExecuteRequest{Command: cmd, Timeout: 600})
		if res.ExitCode != 0 {
			b.Fatalf("%s: %+v", cmd, res)
		}
		return res
	}
	writeCA := "cat > /tmp/ca.pem <<'EOF'\n" + ca.pem + "EOF"
	for _, id := range []string{direct, named} {
		sh(id, writeCA)
	}
	// The intercepted sandbox verifies the gateway's certificates.
	sh(intercepted, "cp /usr/local/share/ca-certificates/aenv-egress-ca.crt /tmp/ca.pem")

	// First request of a new connection, handshake included.
	handshakes := func(id string, n int) []time.Duration {
		b.Helper()
		out := sh(id, fmt.Sprintf("set -- allowed.test %s %d\n%s", host.addr, n, handshakeScript)).Stdout
		var samples []time.Duration
		for _, f := range strings.Fields(out) {
			ms, err := strconv.ParseFloat(f, 64)
			if err != nil {
				b.Fatalf("handshake times %q: %v", out, err)
			}
			samples = append(samples, time.Duration(ms*float64(time.Millisecond)))
		}
		return samples
	}
	// Throughput of one 100 MB download, in MB/s.
	download := func(id string) float64 {
		b.Helper()
		out := sh(id, fmt.Sprintf("curl -sS -o /dev/null -w '%%{speed_download}' --cacert /tmp/ca.pem --resolve allowed.test:443:%s https://allowed.test/bytes/%d",
			host.addr, 100<<20)).Stdout
		bps, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			b.Fatalf("download speed %q: %v", out, err)
		}
		return bps / 1e6
	}
	handshakes(direct, 5) // warm the host and the paths
	handshakes(named, 5)
	handshakes(intercepted, 5)

	var directLat, namedLat, interceptedLat []time.Duration
	var directMBps, namedMBps, interceptedMBps []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		directLat = append(directLat, handshakes(direct, 50)...)
		namedLat = append(namedLat, handshakes(named, 50)...)
		interceptedLat = append(interceptedLat, handshakes(intercepted, 50)...)
		directMBps = append(directMBps, download(direct))
		namedMBps = append(namedMBps, download(named))
		interceptedMBps = append(interceptedMBps, download(intercepted))
	}
	b.StopTimer()
	reportNamed(b, "direct-first-request", directLat)
	reportNamed(b, "gateway-first-request", namedLat)
	reportNamed(b, "intercepted-first-request", interceptedLat)
	dp, _ := percentiles(directLat)
	np, _ := percentiles(namedLat)
	ip, _ := percentiles(interceptedLat)
	b.ReportMetric(np-dp, "added-ms-p50")
	b.ReportMetric(ip-dp, "intercepted-added-ms-p50")
	b.ReportMetric(median(directMBps), "direct-MB/s")
	b.ReportMetric(median(namedMBps), "gateway-MB/s")
	b.ReportMetric(median(interceptedMBps), "intercepted-MB/s")
	b.ReportMetric(median(namedMBps)/median(directMBps), "throughput-ratio")
	b.ReportMetric(median(interceptedMBps)/median(directMBps), "intercepted-throughput-ratio")
}

// BenchmarkEgressConcurrent: 20 sandboxes allowing the host by name each
// open 10 HTTPS connections at once through the gateway (200 in all);
// every one must answer 200.
func BenchmarkEgressConcurrent(b *testing.B) {
	s, ca, _ := egressBench(b)
	const sandboxes, perSandbox = 20, 10
	ids := make([]string, sandboxes)
	for i := range ids {
		ids[i] = s.create(map[string]any{"templateID": "base",
			"network": map[string]any{"allowOut": []string{"allowed.test"}, "denyOut": []string{"0.0.0.0/0"}}}).SandboxID
		s.exec(ids[i], client.ExecuteRequest{Command: "cat > /tmp/ca.pem <<'EOF'\n" + ca.pem + "EOF"})
	}
	burst := fmt.Sprintf("seq %d | xargs -P %d -I{} curl -s -o /dev/null -m 60 -w '%%{http_code}\\n' --cacert /tmp/ca.pem https://allowed.test/bytes/1048576",
		perSandbox, perSandbox)
	var took []time.Duration
	errors := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for _, id := range ids {
			wg.Go(func() {
				res := s.exec(id, client.ExecuteRequest{Command: burst, Timeout: 300})
				ok := strings.Count(res.Stdout, "200")
				mu.Lock()
				errors += perSandbox - ok
				mu.Unlock()
			})
		}
		wg.Wait()
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	reportNamed(b, "burst-of-200", took)
	b.ReportMetric(float64(errors), "errors")
	if errors > 0 {
		b.Errorf("%d of %d connections failed", errors, b.N*sandboxes*perSandbox)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
