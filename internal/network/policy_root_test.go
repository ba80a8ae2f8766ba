package network

import (
	"bytes"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/nftables"
)

// slotChains lists the per-slot chains of the pool's table, sorted.
func slotChains(t *testing.T, prefix string) []string {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range chains {
		if c.Table.Name == prefix && !sharedChains[c.Name] {
			out = append(out, c.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Releasing a slot drops its policy: the next sandbox on it starts with none (no
// egress) and with zero counters.
func TestReleaseDropsPolicy(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	if err := e.pool.SetPolicy(ctx, e.slot.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	if err := e.targets[toWeb1](ctx); err != nil {
		t.Fatalf("default policy: %v", err)
	}
	if err := e.pool.Release(ctx, e.slot.Index); err != nil {
		t.Fatal(err)
	}
	if err := e.pool.SetPolicy(ctx, e.slot.Index, DefaultPolicy()); err == nil {
		t.Error("SetPolicy on a released slot succeeded")
	}
	want := []string{egressChainName(e.other.Index), ingressChainName(e.other.Index), natChainName(e.other.Index)}
	if got := slotChains(t, e.pool.cfg.Prefix); !slices.Equal(got, want) {
		t.Errorf("slot chains after release: %v, want %v", got, want)
	}

	again, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again.Index != e.slot.Index {
		t.Fatalf("reacquired index %d, want %d", again.Index, e.slot.Index)
	}
	waitOperUp(t, again)
	if got := e.reachable(ctx); len(got) != 0 {
		t.Errorf("reacquired slot without a policy reaches %v", got)
	}
	if rx, tx, err := e.pool.Counters(ctx, again.Index); err != nil || rx != 0 || tx != 0 {
		t.Errorf("counters of reacquired slot: %d, %d, %v; want 0, 0, nil", rx, tx, err)
	}
	if err := e.pool.SetPolicy(ctx, again.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	if err := e.targets[toWeb1](ctx); err != nil {
		t.Errorf("reacquired slot with default policy: %v", err)
	}
}

// A restarted server keeps the policies (and counters) of the slots it adopts and
// removes every other slot's, and a repeated SetPolicy is harmless.
func TestStartKeepsAdoptedPolicies(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	if err := e.pool.SetPolicy(ctx, e.slot.Index, mustPolicy(t, false, []string{e.inet.web2.String()}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := e.targets[toWeb2](ctx); err != nil {
		t.Fatal(err)
	}
	_, txBefore, err := e.pool.Counters(ctx, e.slot.Index)
	if err != nil {
		t.Fatal(err)
	}
	e.pool.shutdown() // the process dies

	cfg := e.pool.cfg
	restarted, err := NewPool(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Start(ctx, []int{e.slot.Index}); err != nil {
		t.Fatal(err)
	}
	e.pool = restarted // the environment's cleanup destroys the first pool's table anyway
	want := []string{egressChainName(e.slot.Index), ingressChainName(e.slot.Index), natChainName(e.slot.Index)}
	if got := slotChains(t, cfg.Prefix); !slices.Equal(got, want) {
		t.Errorf("slot chains after restart: %v, want %v", got, want)
	}
	if got, want := e.reachable(ctx), []string{toWeb2}; !slices.Equal(got, want) {
		t.Errorf("adopted slot reaches %v before SetPolicy, want %v", got, want)
	}
	_, txAfter, err := restarted.Counters(ctx, e.slot.Index)
	if err != nil {
		t.Fatal(err)
	}
	if txAfter <= txBefore {
		t.Errorf("tx counter %d after restart, want above %d", txAfter, txBefore)
	}
	for range 2 {
		if err := restarted.SetPolicy(ctx, e.slot.Index, mustPolicy(t, false, []string{e.inet.web1.String()}, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := e.reachable(ctx), []string{toWeb1}; !slices.Equal(got, want) {
		t.Errorf("after SetPolicy on the adopted slot: reaches %v, want %v", got, want)
	}
}

// TestFirewallRuleset pins the table as nft prints it, which is also the layout
// documented in firewall.go and slotpolicy.go. The fixed deny set depends on the
// host's addresses and is compared as data.
func TestFirewallRuleset(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t, 24, 0)
	cfg.DNSServers = []netip.Addr{netip.MustParseAddr("172.31.0.53")}
	egress := &fakeEgress{}
	cfg.Egress = egress
	p := startTestPool(t, cfg, nil)
	ctx := t.Context()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pol := mustPolicy(t, false, []string{"198.51.100.0/24", "198.51.100.7", "172.31.0.53", "pypi.org"}, []string{"0.0.0.0/0"})
	if err := p.SetPolicy(ctx, s.Index, pol); err != nil {
		t.Fatal(err)
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skip("nft command not installed")
	}
	out, err := exec.CommandContext(ctx, nft, "list", "table", "inet", cfg.Prefix).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	fixedSet := regexp.MustCompile(`(?s)\tset fixed-deny \{.*?\n\t\}\n`)
	got := fixedSet.ReplaceAllString(string(out), "\tset fixed-deny {...}\n")
	want := strings.NewReplacer("PREFIX", cfg.Prefix, "CIDR", cfg.CIDR.String()).Replace(`table inet PREFIX {
	counter tx-0 {
		packets 0 bytes 0
	}

	counter rx-0 {
		packets 0 bytes 0
	}

	set fixed-deny {...}

	map slot-egress {
		type ifname : verdict
		elements = { "PREFIX0h" : jump egress-0 }
	}

	map slot-ingress {
		type ifname : verdict
		elements = { "PREFIX0h" : jump ingress-0 }
	}

	map slot-nat {
		type ifname : verdict
		elements = { "PREFIX0h" : jump nat-0 }
	}

	set allow-0 {
		type ipv4_addr
		flags interval
		elements = { 172.31.0.53, 198.51.100.0/24 }
	}

	set deny-0 {
		type ipv4_addr
		flags interval
		elements = { 0.0.0.0/0 }
	}

	chain input {
		type filter hook input priority filter; policy accept;
		iifname "PREFIX*" ct state established,related accept
		iifname "PREFIX*" ct status dnat tcp dport 15001 accept
		iifname "PREFIX*" ct status dnat udp dport 5353 accept
		iifname "PREFIX*" ct status dnat tcp dport 5353 accept
		iifname "PREFIX*" drop
		tcp dport 15001 drop
		udp dport 5353 drop
		tcp dport 5353 drop
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname "PREFIX*" iifname vmap @slot-egress
		iifname "PREFIX*" drop
		oifname "PREFIX*" oifname vmap @slot-ingress
		oifname "PREFIX*" drop
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr CIDR oifname != "PREFIX*" masquerade
	}

	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "PREFIX*" meta nfproto ipv4 udp dport 53 redirect to :5353
		iifname "PREFIX*" meta nfproto ipv4 tcp dport 53 redirect to :5353
		iifname "PREFIX*" iifname vmap @slot-nat
	}

	chain proxy {
		meta nfproto ipv4 meta l4proto tcp redirect to :15001
	}

	chain egress-0 {
		counter name "tx-0"
		ct state established,related accept
		meta nfproto != ipv4 drop
		ip daddr 172.31.0.53 udp dport 53 accept
		ip daddr 172.31.0.53 tcp dport 53 accept
		ip daddr @fixed-deny drop
		ip daddr @allow-0 accept
		ip daddr @deny-0 drop
		drop
	}

	chain ingress-0 {
		counter name "rx-0"
		ct state established,related accept
		drop
	}

	chain nat-0 {
		ip daddr @allow-0 return
		jump proxy
	}
}
`)
	if got != want {
		t.Errorf("nft list table:\n%s\nwant:\n%s", got, want)
	}

	addrs, err := hostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	elems, err := conn.GetSetElements(fixedDenySetDef(firewallTable(cfg.Prefix)))
	if err != nil {
		t.Fatal(err)
	}
	if gotKeys, wantKeys := elementKeys(elems), elementKeys(intervalElements(fixedDenyRanges(cfg, addrs))); !slices.Equal(gotKeys, wantKeys) {
		t.Errorf("fixed-deny elements %v, want %v", gotKeys, wantKeys)
	}
}

// elementKeys renders interval set elements as sorted "start"/"end" strings.
func elementKeys(els []nftables.SetElement) []string {
	var out []string
	for _, e := range els {
		kind := "start"
		if e.IntervalEnd {
			kind = "end"
		}
		a, _ := netip.AddrFromSlice(bytes.Clone(e.Key))
		out = append(out, a.String()+" "+kind)
	}
	slices.Sort(out)
	return out
}

// fakeEgress stands for the egress gateway: fixed ports, and what the pool
// told it.
type fakeEgress struct {
	mu      sync.Mutex
	denied  []netip.Prefix
	slots   map[int]Policy
	dnsOpen map[int]bool
}

func (f *fakeEgress) Ports() (dns, proxy uint16) { return 5353, 15001 }

func (f *fakeEgress) SetDenied(ranges []netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.denied = ranges
}

func (f *fakeEgress) SetSlot(index int, _ netip.Addr, pol Policy, dnsOpen bool) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slots == nil {
		f.slots, f.dnsOpen = map[int]Policy{}, map[int]bool{}
	}
	f.slots[index], f.dnsOpen[index] = pol, dnsOpen
	return func() {}
}

func (f *fakeEgress) ClearSlot(index int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.slots, index)
}
