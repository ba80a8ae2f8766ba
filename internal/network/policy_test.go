package network

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestParsePolicy(t *testing.T) {
	no, yes := false, true
	tests := []struct {
		name          string
		allowInternet *bool
		allowOut      []string
		denyOut       []string
		want          Policy
		wantErr       string
	}{
		{"nothing: default", nil, nil, nil, Policy{AllowInternet: true}, ""},
		{"internet off", &no, nil, nil, Policy{}, ""},
		{"internet on", &yes, nil, nil, Policy{AllowInternet: true}, ""},
		{"E2B example", &no, []string{"1.1.1.1"}, []string{"0.0.0.0/0"},
			Policy{AllowOut: prefixes("1.1.1.1/32"), DenyOut: prefixes("0.0.0.0/0")}, ""},
		{"host bits are masked", nil, []string{"10.1.2.3/8"}, nil,
			Policy{AllowInternet: true, AllowOut: prefixes("10.0.0.0/8")}, ""},
		{"spaces trimmed", nil, nil, []string{" 192.168.0.0/16 "},
			Policy{AllowInternet: true, DenyOut: prefixes("192.168.0.0/16")}, ""},
		{"IPv4-mapped", nil, []string{"::ffff:203.0.113.0/120"}, nil,
			Policy{AllowInternet: true, AllowOut: prefixes("203.0.113.0/24")}, ""},
		{"names with addresses", &no, []string{"PyPI.org.", "1.1.1.1", "*.github.com", "pypi.org"}, []string{"0.0.0.0/0"},
			Policy{AllowOut: prefixes("1.1.1.1/32"), DenyOut: prefixes("0.0.0.0/0"), AllowNames: []string{"pypi.org", "*.github.com"}}, ""},
		{"name in denyOut", nil, nil, []string{"example.com"}, Policy{}, `denyOut[0] "example.com": host names are allowed in allowOut only`},
		{"two wildcards", nil, []string{"*.*.com"}, nil, Policy{}, "a wildcard must be the whole first label"},
		{"wildcard over a TLD", nil, []string{"*.com"}, nil, Policy{}, "a wildcard covers the names under a domain of two labels"},
		{"bare star", nil, []string{"*"}, nil, Policy{}, `allowOut[0] "*"`},
		{"space in a name", nil, []string{"exa mple.com"}, nil, Policy{}, `is not allowed in a host name`},
		{"name too long", nil, []string{strings.Repeat("a.", 127) + "com"}, nil, Policy{}, "at most 253"},
		{"label too long", nil, []string{strings.Repeat("a", 64) + ".com"}, nil, Policy{}, "want 1 to 63 characters"},
		{"hyphen at a label's end", nil, []string{"a-.com"}, nil, Policy{}, `cannot start or end with "-"`},
		{"numeric last label", nil, []string{"1.2.3.4.5"}, nil, Policy{}, `allowOut[0] "1.2.3.4.5": want an IPv4 address`},
		{"IPv6 address", nil, nil, []string{"10.0.0.0/8", "2001:db8::1"}, Policy{}, `denyOut[1] "2001:db8::1": IPv6 is not supported`},
		{"IPv6 prefix", nil, []string{"::/0"}, nil, Policy{}, "IPv6 is not supported"},
		{"bad length", nil, []string{"10.0.0.0/33"}, nil, Policy{}, `allowOut[0] "10.0.0.0/33": want an IPv4 address or CIDR`},
		{"empty", nil, []string{""}, nil, Policy{}, `allowOut[0] ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePolicy(tt.allowInternet, tt.allowOut, tt.denyOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParsePolicy() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePolicy() error = %v", err)
			}
			if !got.Equal(tt.want) {
				t.Errorf("ParsePolicy() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMatchHost(t *testing.T) {
	patterns := []string{"pypi.org", "*.github.com"}
	tests := []struct {
		host, want string
	}{
		{"pypi.org", "pypi.org"},
		{"PYPI.ORG.", "pypi.org"},
		{"files.pypi.org", ""},
		{"api.github.com", "*.github.com"},
		{"a.b.github.com", "*.github.com"},
		{"github.com", ""},
		{"evilgithub.com", ""},
		{"xpypi.org", ""},
		{"", ""},
		{"151.101.0.223", ""},
		{`evil\.github.com`, ""},
		{"evil\x00.github.com", ""},
		{"api.github.com:443", ""},
	}
	for _, tt := range tests {
		if got := MatchHost(patterns, tt.host); got != tt.want {
			t.Errorf("MatchHost(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
}

// TestPolicyAllows checks validate_egress's order: allowed, then denied, then the
// internet switch.
func TestPolicyAllows(t *testing.T) {
	pol := Policy{AllowInternet: true, AllowOut: prefixes("10.1.0.0/16"), DenyOut: prefixes("10.0.0.0/8", "203.0.113.7/32")}
	tests := []struct {
		addr string
		want bool
	}{
		{"10.1.2.3", true},     // allowed beats denied
		{"10.2.0.1", false},    // denied
		{"203.0.113.7", false}, // denied /32
		{"203.0.113.8", true},  // internet
	}
	for _, tt := range tests {
		if got := pol.Allows(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Allows(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
	pol.AllowInternet = false
	if pol.Allows(netip.MustParseAddr("203.0.113.8")) {
		t.Error("Allows(203.0.113.8) with internet off = true")
	}
}

func TestMergePrefixes(t *testing.T) {
	r := func(first, last string) addrRange {
		return addrRange{addrToUint32(netip.MustParseAddr(first)), addrToUint32(netip.MustParseAddr(last))}
	}
	tests := []struct {
		name string
		in   []netip.Prefix
		want []addrRange
	}{
		{"none", nil, nil},
		{"one /32", prefixes("1.2.3.4/32"), []addrRange{r("1.2.3.4", "1.2.3.4")}},
		{"contained", prefixes("10.0.0.0/8", "10.1.0.0/16"), []addrRange{r("10.0.0.0", "10.255.255.255")}},
		{"adjacent", prefixes("10.0.0.0/9", "10.128.0.0/9"), []addrRange{r("10.0.0.0", "10.255.255.255")}},
		{"unsorted, apart", prefixes("192.168.0.0/16", "10.0.0.0/8"),
			[]addrRange{r("10.0.0.0", "10.255.255.255"), r("192.168.0.0", "192.168.255.255")}},
		{"everything swallows all", prefixes("1.2.3.4/32", "0.0.0.0/0", "255.255.255.255/32"),
			[]addrRange{r("0.0.0.0", "255.255.255.255")}},
		{"IPv6 skipped", prefixes("::/0", "1.1.1.1/32"), []addrRange{r("1.1.1.1", "1.1.1.1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mergePrefixes(tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("mergePrefixes(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestIntervalElements(t *testing.T) {
	got := elementKeys(intervalElements(mergePrefixes(prefixes("10.0.0.0/8", "198.51.100.7/32", "255.0.0.0/8"))))
	want := []string{
		"10.0.0.0 start", "11.0.0.0 end",
		"198.51.100.7 start", "198.51.100.8 end",
		"255.0.0.0 start", // open to the top: no end element
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("elements %v, want %v", got, want)
	}
}

func TestCompilePolicy(t *testing.T) {
	resolvers := []netip.Addr{netip.MustParseAddr("10.255.255.53"), netip.MustParseAddr("8.8.8.8")}
	all := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	tests := []struct {
		name    string
		pol     Policy
		wantDNS []netip.Addr
	}{
		// The resolver in 10/8 is usable although 10/8 is in the fixed list.
		{"default", DefaultPolicy(), all("10.255.255.53", "8.8.8.8")},
		{"internet off", Policy{}, nil},
		{"internet off, one resolver allowed", Policy{AllowOut: prefixes("8.8.8.8/32")}, all("8.8.8.8")},
		{"private ranges denied by the user", Policy{AllowInternet: true, DenyOut: prefixes("10.0.0.0/8")}, all("8.8.8.8")},
		{"seed high_security", Policy{DenyOut: prefixes("0.0.0.0/0")}, nil},
		{"seed coding_agent", Policy{AllowInternet: true, AllowOut: prefixes("0.0.0.0/0"), DenyOut: prefixes("10.0.0.0/8")},
			all("10.255.255.53", "8.8.8.8")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := compilePolicy(tt.pol, resolvers)
			if !slices.Equal(c.dns, tt.wantDNS) {
				t.Errorf("dns = %v, want %v", c.dns, tt.wantDNS)
			}
			if c.internet != tt.pol.AllowInternet {
				t.Errorf("internet = %v, want %v", c.internet, tt.pol.AllowInternet)
			}
			if !slices.Equal(c.allow, mergePrefixes(tt.pol.AllowOut)) || !slices.Equal(c.deny, mergePrefixes(tt.pol.DenyOut)) {
				t.Errorf("sets = %v / %v, want the merged lists", c.allow, c.deny)
			}
		})
	}
}

func TestEgressRulesOrder(t *testing.T) {
	o := slotObjectDefs(firewallTable("aenv"), 3)
	rules := egressRules(o, compiledPolicy{dns: []netip.Addr{netip.MustParseAddr("10.0.0.53")}})
	// counter, established, non-IPv4, DNS udp, DNS tcp, fixed, allow, deny, default.
	if len(rules) != 9 {
		t.Fatalf("%d rules, want 9", len(rules))
	}
	var lookups []string
	for _, r := range rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok {
				lookups = append(lookups, l.SetName)
			}
		}
	}
	// The fixed list comes before the slot's own sets: AllowOut cannot override it.
	if want := []string{fixedDenySet, "allow-3", "deny-3"}; !slices.Equal(lookups, want) {
		t.Errorf("set lookups in order %v, want %v", lookups, want)
	}
}

func TestFixedDenyRanges(t *testing.T) {
	cfg := Config{Prefix: "aenv", CIDR: netip.MustParsePrefix("10.99.0.0/16")}
	host := prefixes("192.0.2.2/32", "10.99.0.1/32")
	got := elementKeys(intervalElements(fixedDenyRanges(cfg, host)))
	want := elementKeys(intervalElements(mergePrefixes(prefixes(
		"192.0.2.2/32", "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16",
		"169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8"))))
	if !slices.Equal(got, want) {
		t.Errorf("default fixed list %v, want %v", got, want)
	}

	cfg.PrivateCIDRs = []netip.Prefix{}
	cfg.HostCIDRs = prefixes("203.0.113.10/32")
	got = elementKeys(intervalElements(fixedDenyRanges(cfg, host)))
	want = elementKeys(intervalElements(mergePrefixes(prefixes(
		"192.0.2.2/32", "10.99.0.0/16", "203.0.113.10/32", "169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8"))))
	if !slices.Equal(got, want) {
		t.Errorf("fixed list without private ranges %v, want %v", got, want)
	}
}

func TestParseNameservers(t *testing.T) {
	conf := "# comment\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nsearch example\nnameserver 2001:db8::1\nnameserver 1.1.1.1\nnameserver bogus\n"
	got := parseNameservers([]byte(conf))
	want := []netip.Addr{netip.MustParseAddr("10.255.255.53"), netip.MustParseAddr("1.1.1.1")}
	if !slices.Equal(got, want) {
		t.Errorf("parseNameservers = %v, want %v", got, want)
	}
}

func TestSlotIndexFromObjectName(t *testing.T) {
	for name, want := range map[string]int{"egress-3": 3, "ingress-0": 0, "allow-12": 12, "deny-7": 7, "tx-1": 1, "rx-99": 99} {
		if i, ok := slotIndexFromObjectName(name); !ok || i != want {
			t.Errorf("slotIndexFromObjectName(%q) = %d, %v; want %d", name, i, ok, want)
		}
	}
	for _, name := range []string{"input", "forward", "fixed-deny", "slot-egress", "egress-", "egress-01", "egress--1", "sandbox-egress"} {
		if i, ok := slotIndexFromObjectName(name); ok {
			t.Errorf("slotIndexFromObjectName(%q) = %d, want no match", name, i)
		}
	}
}
