package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Policy is one sandbox's egress policy, with the semantics of the seed's
// validate_egress: a destination in AllowOut is allowed; else one in DenyOut is
// denied; else AllowInternet decides. The pool's fixed deny list (Config) is checked
// before all of it, so AllowOut cannot open the host, other sandboxes or the private
// ranges.
type Policy struct {
	AllowInternet bool
	AllowOut      []netip.Prefix // seed alwaysAllowedCIDRs, E2B network.allowOut
	DenyOut       []netip.Prefix // seed alwaysDeniedCIDRs, E2B network.denyOut
}

// DefaultPolicy is what a sandbox gets when its request says nothing: the internet,
// minus the fixed deny list.
func DefaultPolicy() Policy {
	return Policy{AllowInternet: true}
}

// ParsePolicy builds a Policy from request fields. A nil allowInternet means true.
// Entries are CIDRs ("10.0.0.0/8") or bare addresses ("1.1.1.1", taken as a /32).
// Sandboxes have IPv4 only, so IPv6 entries are rejected rather than silently
// ignored; so are domain names, which E2B accepts and this enforcement cannot.
func ParsePolicy(allowInternet *bool, allowOut, denyOut []string) (Policy, error) {
	pol := DefaultPolicy()
	if allowInternet != nil {
		pol.AllowInternet = *allowInternet
	}
	var err error
	if pol.AllowOut, err = parseCIDRList("allowOut", allowOut); err != nil {
		return Policy{}, err
	}
	if pol.DenyOut, err = parseCIDRList("denyOut", denyOut); err != nil {
		return Policy{}, err
	}
	return pol, nil
}

func parseCIDRList(field string, entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, e := range entries {
		p, err := parseCIDR(strings.TrimSpace(e))
		if err != nil {
			return nil, fmt.Errorf("parse network policy: %s[%d] %q: %w", field, i, e, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseCIDR(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("want an IPv4 address or CIDR such as 203.0.113.0/24")
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("want an IPv4 address or CIDR such as 203.0.113.0/24 (domain names are not supported)")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Zone() != "" || !p.Addr().Unmap().Is4() {
		return netip.Prefix{}, fmt.Errorf("IPv6 is not supported: sandboxes have IPv4 only")
	}
	if p.Addr().Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			return netip.Prefix{}, fmt.Errorf("IPv4-mapped prefix shorter than /96")
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), bits)
	}
	// Host bits are tolerated, as Python's strict=False would: 10.1.2.3/8 is 10.0.0.0/8.
	return p.Masked(), nil
}

// Allows reports whether p lets a sandbox open a connection to dst, ignoring the
// pool's fixed deny list. It is the reference the nftables rules implement.
func (p Policy) Allows(dst netip.Addr) bool {
	if containsAddr(p.AllowOut, dst) {
		return true
	}
	if containsAddr(p.DenyOut, dst) {
		return false
	}
	return p.AllowInternet
}

// Equal reports whether p and q are the same policy, list order included.
func (p Policy) Equal(q Policy) bool {
	return p.AllowInternet == q.AllowInternet && slices.Equal(p.AllowOut, q.AllowOut) && slices.Equal(p.DenyOut, q.DenyOut)
}

// String renders p for logs.
func (p Policy) String() string {
	return fmt.Sprintf("allowInternet=%t allowOut=%v denyOut=%v", p.AllowInternet, p.AllowOut, p.DenyOut)
}

func containsAddr(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
