package network

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// requireRoot: see roottest.Require.
func requireRoot(t *testing.T) {
	t.Helper()
	roottest.Require(t)
}

// testPrefix is "t", three random [a-z0-9] and a random letter (a prefix must end in
// a letter).
func testPrefix(t *testing.T) string {
	const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte{'t'}
	for i := range 4 {
		n := len(alnum)
		if i == 3 {
			n = 26
		}
		r, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, alnum[r.Int64()])
	}
	return string(b)
}

// nextTestSubnet walks the /20s of 10.64.0.0/13 from a random start, so tests in one
// run never share addresses. The range is one no other tier uses (integration
// servers take 10.200-249, the E2B and Python suites 10.100-249), so that a
// pool here is never refused for overlapping a server running beside it.
var nextTestSubnet atomic.Int64

func init() {
	r, err := rand.Int(rand.Reader, big.NewInt(128))
	if err != nil {
		panic(err)
	}
	nextTestSubnet.Store(r.Int64())
}

// testCIDR returns a fresh prefix of the given size (at most a /20) inside 10.64.0.0/13.
func testCIDR(bits int) netip.Prefix {
	n := nextTestSubnet.Add(1) % 128 // 128 /20s in a /13
	base := uint32(10)<<24 | uint32(64)<<16 + uint32(n)<<12
	return netip.PrefixFrom(addrFromUint32(base), bits)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestPool starts a pool with a random prefix and CIDR and destroys it, checking
// that nothing is left, when the test ends.
func newTestPool(t *testing.T, cidrBits, warm int) *Pool {
	t.Helper()
	requireRoot(t)
	return startTestPool(t, testConfig(t, cidrBits, warm), nil)
}

// testConfig is a pool configuration that touches no interface but the pool's own:
// no uplink gets forwarding, and the DNS servers are fixed rather than the host's.
func testConfig(t *testing.T, cidrBits, warm int) Config {
	return Config{Prefix: testPrefix(t), CIDR: testCIDR(cidrBits), WarmPool: warm,
		Uplinks: []string{}, DNSServers: []netip.Addr{}}
}

func startTestPool(t *testing.T, cfg Config, inUse []int) *Pool {
	t.Helper()
	ctx := t.Context()
	p, err := NewPool(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		assertNothingLeft(t, cfg.Prefix)
	})
	if err := p.Start(ctx, inUse); err != nil {
		t.Fatal(err)
	}
	return p
}

// leftovers lists the kernel objects carrying prefix: links, netns pins, nft tables.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	var found []string
	links, err := listLinks()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			found = append(found, "link "+l.Attrs().Name)
		}
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			found = append(found, "netns "+e.Name())
		}
	}
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		if tbl.Name == prefix {
			found = append(found, "nft table "+tbl.Name)
		}
	}
	return found
}

func assertNothingLeft(t *testing.T, prefix string) {
	t.Helper()
	if found := leftovers(t, prefix); len(found) > 0 {
		t.Errorf("left behind: %v", found)
	}
}

// waitWarm waits until the filler has settled with n warm slots.
func waitWarm(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		warm, filling := p.warm, p.filling
		p.mu.Unlock()
		if warm == n && filling == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("warm pool did not settle at %d slots", n)
}

// inNetns runs fn on an OS thread moved into the netns at path. The thread stays
// locked, so the runtime discards it afterwards instead of reusing it elsewhere.
// Sockets fn opens stay in that netns after it returns.
func inNetns(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// netlinkIn returns a netlink handle for the netns at path.
func netlinkIn(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// assertConfigured checks both veth ends of s: addresses, links up, lo up, and a
// default route through the host end.
func assertConfigured(t *testing.T, s *Slot) {
	t.Helper()
	host, err := netlink.LinkByName(s.HostVeth)
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}
	assertLink(t, &netlink.Handle{}, host, s.HostIP, "host "+s.HostVeth)

	h := netlinkIn(t, s.NetnsPath)
	for _, name := range []string{"lo", sandboxIface} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("%s in %s: %v", name, s.Netns, err)
		}
		want := s.SandboxIP
		if name == "lo" {
			want = netip.MustParseAddr("127.0.0.1")
		}
		assertLink(t, h, l, want, name+" in "+s.Netns)
	}
	// Dumps are retried as the package's own are: tests of other packages
	// running at the same time change the host's links and addresses.
	routes, err := retryDump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			defaults = append(defaults, r.Gw.String())
		}
	}
	if len(defaults) != 1 || defaults[0] != s.HostIP.String() {
		t.Errorf("%s default routes via %v, want [%s]", s.Netns, defaults, s.HostIP)
	}
}

func assertLink(t *testing.T, h *netlink.Handle, l netlink.Link, want netip.Addr, what string) {
	t.Helper()
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is down", what)
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	wantBits := slotPrefixBits
	if want.IsLoopback() {
		wantBits = 8
	}
	if wantStr := fmt.Sprintf("%s/%d", want, wantBits); len(got) != 1 || got[0] != wantStr {
		t.Errorf("%s addresses = %v, want [%s]", what, got, wantStr)
	}
}

// assertGone checks that none of s's kernel objects exist.
func assertGone(t *testing.T, s *Slot) {
	t.Helper()
	if _, err := netlink.LinkByName(s.HostVeth); err == nil {
		t.Errorf("host veth %s still exists", s.HostVeth)
	}
	if _, err := os.Stat(s.NetnsPath); err == nil {
		t.Errorf("netns pin %s still exists", s.NetnsPath)
	}
}
