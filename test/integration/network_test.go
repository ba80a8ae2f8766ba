package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/aenv-dev/aenv/internal/client"
)

// fakeInternet is a host on "the internet" made for the test: a network
// namespace holding a public test address (TEST-NET-2), routed from the
// host through a veth. Nothing is routed anywhere else, so no packet can
// leave the machine even if the firewall failed.
type fakeInternet struct {
	addr string // where its HTTP server listens
}

func newFakeInternet(t *testing.T) *fakeInternet {
	t.Helper()
	ns, addr := newFakeHostNetns(t)
	l, err := listenInNetns(ns, addr+":8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the fake internet\n")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &fakeInternet{addr: addr}
}

var (
	fakeHostBase = int(randomLetters(1)[0] - 'a')
	fakeHostSeq  atomic.Int32
)

// newFakeHostNetns makes the namespace of a fake internet host and returns
// its name and the host's public test address.
func newFakeHostNetns(t testing.TB) (ns, addr string) {
	t.Helper()
	suffix := randomLetters(4)
	ns, hostIf, peerIf := "fi"+suffix, "fi"+suffix+"h", "fi"+suffix+"p"
	// Hosts of one test run get different addresses; a random start keeps
	// two runs on one machine apart.
	b := 10 + (fakeHostBase+int(fakeHostSeq.Add(1)))%50
	addr = fmt.Sprintf("198.51.100.%d", b)
	hostAddr := fmt.Sprintf("192.0.2.%d", b*4+1)
	peerAddr := fmt.Sprintf("192.0.2.%d", b*4+2)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() {
		exec.Command("ip", "route", "del", addr+"/32").Run()
		exec.Command("ip", "link", "del", hostIf).Run()
		exec.Command("ip", "netns", "del", ns).Run()
	})
	run("ip", "link", "add", hostIf, "type", "veth", "peer", "name", peerIf, "netns", ns)
	run("ip", "addr", "add", hostAddr+"/30", "dev", hostIf)
	run("ip", "link", "set", hostIf, "up")
	run("sysctl", "-qw", "net.ipv4.conf."+hostIf+".forwarding=1")
	run("ip", "route", "add", addr+"/32", "dev", hostIf)
	run("ip", "-n", ns, "addr", "add", peerAddr+"/30", "dev", peerIf)
	run("ip", "-n", ns, "addr", "add", addr+"/32", "dev", peerIf)
	run("ip", "-n", ns, "link", "set", peerIf, "up")
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", hostAddr)
	return ns, addr
}

// listenInNetns opens a TCP listener inside a named network namespace;
// the socket stays in that namespace whatever goroutine serves it.
func listenInNetns(ns, addr string) (net.Listener, error) {
	return inNetns(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// listenPacketInNetns is listenInNetns for UDP.
func listenPacketInNetns(ns, addr string) (net.PacketConn, error) {
	return inNetns(ns, func() (net.PacketConn, error) { return net.ListenPacket("udp4", addr) })
}

// inNetns runs open (which makes a socket) with the calling thread in the
// named network namespace.
func inNetns[T any](ns string, open func() (T, error)) (T, error) {
	var zero T
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return zero, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		return zero, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return zero, err
	}
	defer netns.Set(orig)
	return open()
}

// reaches tells whether the sandbox can fetch from addr:8080.
func (s *server) reaches(id, addr string) bool {
	s.t.Helper()
	res := s.exec(id, client.ExecuteRequest{Command: fmt.Sprintf("curl -s -o /dev/null -m 3 -w '%%{http_code}' http://%s:8080/", addr)})
	return res.Stdout == "200"
}

// TestEgressPolicy: the seed's and E2B's policy fields at create, the
// fixed deny list, PUT /network on a live sandbox, fork inheritance,
// byte counters, and DNS configuration.
func TestEgressPolicy(t *testing.T) {
	t.Parallel()
	inet := newFakeInternet(t)
	s := newServer(t)
	s.start()

	open := s.create(nil).SandboxID
	if !s.reaches(open, inet.addr) {
		t.Fatal("default policy: internet not reachable")
	}
	closed := s.create(map[string]any{"templateID": "base", "allowInternetAccess": false}).SandboxID
	if s.reaches(closed, inet.addr) {
		t.Fatal("allowInternetAccess=false: internet reachable")
	}
	var info struct {
		AllowInternetAccess *bool `json:"allowInternetAccess"`
	}
	s.expect(s.do("GET", "/sandboxes/"+closed, nil), 200, "get").json(t, &info)
	if info.AllowInternetAccess == nil || *info.AllowInternetAccess {
		t.Fatalf("detail allowInternetAccess: %v", info.AllowInternetAccess)
	}
	// E2B's shape: internet off, one address allowed.
	e2b := s.create(map[string]any{"templateID": "base", "allow_internet_access": false,
		"network": map[string]any{"allowOut": []string{inet.addr}}}).SandboxID
	if !s.reaches(e2b, inet.addr) {
		t.Fatal("allowOut: address not reachable")
	}
	// Seed's shape: deny one /32.
	denied := s.create(map[string]any{"templateID": "base", "alwaysDeniedCIDRs": []string{inet.addr + "/32"}}).SandboxID
	if s.reaches(denied, inet.addr) {
		t.Fatal("alwaysDeniedCIDRs: address reachable")
	}
	s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "alwaysDeniedCIDRs": []string{"not-a-cidr"}}), 400, "bad CIDR")

	// The fixed deny list: the host (the API itself) and other sandboxes,
	// even when allowOut names them.
	hostIP := s.exec(open, client.ExecuteRequest{Command: "ip route | awk '/default/ {print $3}'"}).Stdout
	hostIP = strings.TrimSpace(hostIP)
	if hostIP == "" {
		t.Fatal("no default route in the sandbox")
	}
	port := s.addr[strings.LastIndex(s.addr, ":")+1:]
	probe := fmt.Sprintf("python3 -c \"import socket; socket.create_connection(('%s', %s), 2)\" && echo reached || echo blocked", hostIP, port)
	if res := s.exec(open, client.ExecuteRequest{Command: probe}); !strings.Contains(res.Stdout, "blocked") {
		t.Fatalf("sandbox reached the host: %+v", res)
	}
	sneaky := s.create(map[string]any{"templateID": "base", "alwaysAllowedCIDRs": []string{"0.0.0.0/0"}}).SandboxID
	if res := s.exec(sneaky, client.ExecuteRequest{Command: probe}); !strings.Contains(res.Stdout, "blocked") {
		t.Fatalf("allowOut 0.0.0.0/0 opened the host: %+v", res)
	}
	otherIP := strings.Fields(s.exec(open, client.ExecuteRequest{Command: "hostname -I"}).Stdout)[0]
	toOther := fmt.Sprintf("python3 -c \"import socket; socket.create_connection(('%s', 49983), 2)\" && echo reached || echo blocked", otherIP)
	if res := s.exec(sneaky, client.ExecuteRequest{Command: toOther}); !strings.Contains(res.Stdout, "blocked") {
		t.Fatalf("sandbox reached another sandbox: %+v", res)
	}

	// Changing the policy of a running sandbox works at once.
	s.expect(s.do("PUT", "/sandboxes/"+open+"/network", map[string]any{"allow_internet_access": false}), 204, "update")
	if s.reaches(open, inet.addr) {
		t.Fatal("after update to internet off: reachable")
	}
	s.expect(s.do("PUT", "/sandboxes/"+open+"/network", map[string]any{"allowOut": []string{inet.addr}, "denyOut": []string{"0.0.0.0/0"}}), 204, "update")
	if !s.reaches(open, inet.addr) {
		t.Fatal("after update to allowOut: not reachable")
	}
	s.expect(s.do("PUT", "/sandboxes/nosuchsandbox0000000/network", map[string]any{}), 404, "update unknown")

	// Fork children inherit the policy.
	for _, c := range s.fork("/sandboxes/"+denied+"/fork", 1) {
		if s.reaches(c, inet.addr) {
			t.Fatal("fork child escaped the parent's deny list")
		}
	}

	// Byte counters in the metrics (which need the key: they name sandboxes).
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("X-API-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `aenv_sandbox_network_receive_bytes_total{sandbox_id="`+e2b+`"}`) {
		t.Fatalf("no network counter for %s in metrics", e2b)
	}

	// DNS: resolv.conf lists the resolvers the policy lets through.
	if res := s.exec(open, client.ExecuteRequest{Command: "grep -c nameserver /etc/resolv.conf"}); strings.TrimSpace(res.Stdout) == "0" {
		t.Fatalf("resolv.conf: %+v", res)
	}
}

// TestExposedPorts: <port>-<id>.<domain> reaches a server in the sandbox;
// private sandboxes need the traffic token.
func TestExposedPorts(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	public := s.create(nil).SandboxID
	var private client.Sandbox
	var privBody struct {
		SandboxID          string `json:"sandboxID"`
		TrafficAccessToken string `json:"trafficAccessToken"`
	}
	s.expect(s.do("POST", "/sandboxes", map[string]any{"templateID": "base",
		"network": map[string]any{"allowPublicTraffic": false}}), 201, "create private").json(t, &privBody)
	private.SandboxID = privBody.SandboxID
	if privBody.TrafficAccessToken == "" {
		t.Fatal("private sandbox has no traffic token")
	}
	for _, id := range []string{public, private.SandboxID} {
		s.exec(id, client.ExecuteRequest{Command: "mkdir -p /tmp/www && echo hello-" + id + " > /tmp/www/index.html && cd /tmp/www && nohup python3 -m http.server 8080 >/dev/null 2>&1 &"})
	}
	get := func(id string, headers ...string) (int, string) {
		req, _ := http.NewRequest("GET", s.url+"/index.html", nil)
		req.Host = "8080-" + id + ".localhost"
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, 10*time.Second, "server in the sandbox", func() bool { code, _ := get(public); return code == 200 })
	if code, body := get(public); code != 200 || body != "hello-"+public+"\n" {
		t.Fatalf("public port: %d %q", code, body)
	}
	if code, _ := get(private.SandboxID); code != 403 {
		t.Fatalf("private port without token: %d", code)
	}
	waitFor(t, 10*time.Second, "private server", func() bool {
		code, _ := get(private.SandboxID, "E2b-Traffic-Access-Token", privBody.TrafficAccessToken)
		return code == 200
	})
	if code, _ := get("nosuchsandbox0000000"); code != 502 {
		t.Fatalf("unknown sandbox port: %d", code)
	}
	req, _ := http.NewRequest("GET", s.url+"/", nil)
	req.Host = "9999-" + public + ".localhost"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 502 {
		t.Fatalf("closed port: %v %v", resp, err)
	}
}
