package network

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestCheckRangeFree(t *testing.T) {
	cfg := Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/16")}
	pfx := netip.MustParsePrefix
	tests := []struct {
		name  string
		nets  []hostNet
		pools []foreignPool
		want  []string // substrings of the error; nil: no conflict
	}{
		{"empty host", nil, nil, nil},
		{"default route and other ranges", []hostNet{
			{kind: "route", prefix: pfx("0.0.0.0/0"), link: "eth0"},
			{kind: "address", prefix: pfx("192.0.2.0/24"), link: "eth0"},
			{kind: "route", prefix: pfx("10.98.0.0/16"), link: "eth1"},
		}, nil, nil},
		{"own slots kept across a restart", []hostNet{
			{kind: "address", prefix: pfx("10.99.0.4/30"), link: "aenv1h"},
			{kind: "route", prefix: pfx("10.99.0.4/30"), link: "aenv1h"},
		}, []foreignPool{{prefix: "aenv", cidr: pfx("10.99.0.0/16")}}, nil},
		{"an interface's address", []hostNet{
			{kind: "address", prefix: pfx("10.99.3.0/24"), link: "docker0"},
		}, nil, []string{"10.99.0.0/16", "address 10.99.3.0/24 on docker0"}},
		{"a wider route", []hostNet{
			{kind: "route", prefix: pfx("10.0.0.0/8"), link: "wg0"},
		}, nil, []string{"route 10.0.0.0/8 on wg0"}},
		{"another server's sandbox", []hostNet{
			{kind: "address", prefix: pfx("10.99.0.8/30"), link: "aenvx2h"},
			{kind: "route", prefix: pfx("10.99.0.8/30"), link: "aenvx2h"},
		}, nil, []string{`address 10.99.0.8/30 on aenvx2h (a sandbox of another aenv server, net prefix "aenvx")`}},
		{"another server's range without slots", nil,
			[]foreignPool{{prefix: "other", cidr: pfx("10.99.128.0/24")}},
			[]string{`the range 10.99.128.0/24 of another aenv server (net prefix "other")`}},
		{"another server's range elsewhere", nil,
			[]foreignPool{{prefix: "other", cidr: pfx("10.100.0.0/24")}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkRangeFree(cfg, tt.nets, tt.pools)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("checkRangeFree: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrRangeConflict) {
				t.Fatalf("checkRangeFree: %v, want ErrRangeConflict", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "another aenv server"); n > 1 {
				t.Errorf("error %q names the other server %d times", err, n)
			}
		})
	}
}

func TestPoolCIDRFromRules(t *testing.T) {
	for _, cidr := range []string{"10.99.0.0/16", "10.200.7.0/24", "192.168.4.0/30"} {
		cfg := Config{Prefix: "aenv", CIDR: netip.MustParsePrefix(cidr)}
		rules := sharedRules(cfg, sharedChainDefs(firewallTable(cfg.Prefix)))
		got, ok := poolCIDRFromRules(rules)
		if !ok || got != cfg.CIDR {
			t.Errorf("poolCIDRFromRules(rules of %s) = %v, %v", cidr, got, ok)
		}
	}
}

// TestStartRefusesOverlappingRange: a second pool whose range overlaps a running
// one's is refused, naming the first, whether or not the first holds a slot in the
// overlap; the first restarting over its own range (keeping a slot) is not.
func TestStartRefusesOverlappingRange(t *testing.T) {
	requireRoot(t)
	first := newTestPool(t, 24, 0)
	ctx := t.Context()

	// No slot yet: only the first pool's nftables table tells its range.
	other := testConfig(t, 25, 0)
	other.CIDR = netip.PrefixFrom(first.cfg.CIDR.Addr(), 25)
	assertRefused(t, other, first.cfg.Prefix)

	s, err := first.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The first's slot address alone says it too.
	other.CIDR = netip.PrefixFrom(s.HostIP, 30).Masked()
	assertRefused(t, other, first.cfg.Prefix)

	// A restart of the first server over its own range, keeping the slot.
	first.shutdown()
	cfg := first.cfg
	startTestPool(t, cfg, []int{s.Index})
}

func assertRefused(t *testing.T, cfg Config, conflicting string) {
	t.Helper()
	p, err := NewPool(t.Context(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Start(t.Context(), nil)
	defer func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		assertNothingLeft(t, cfg.Prefix)
	}()
	if !errors.Is(err, ErrRangeConflict) || !strings.Contains(err.Error(), `"`+conflicting+`"`) {
		t.Fatalf("Start with %s: %v, want a conflict naming %q", cfg.CIDR, err, conflicting)
	}
}
