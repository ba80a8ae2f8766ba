package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
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
	// AllowNames are host names ("pypi.org") and wildcards ("*.github.com":
	// every name under github.com, not github.com itself) the sandbox may
	// reach whatever the CIDR lists say, lower case. A TCP connection that
	// the CIDR lists do not allow is judged by the name it carries (TLS SNI,
	// HTTP Host), by the node's egress gateway (see Egress).
	AllowNames []string
	// Upstream, if set, is a SOCKS5 proxy the sandbox's allowed TCP egress
	// goes through (the gateway dials it instead of the destination).
	Upstream *Upstream
	// Rules are header transforms for HTTPS requests to the hosts they
	// name (see HostRule); with any, all of the sandbox's TCP goes to the
	// egress gateway, which intercepts TLS to those hosts alone.
	Rules []HostRule
	// Team is whose secrets the rules' placeholders name.
	Team string
}

// Upstream is a SOCKS5 proxy (RFC 1928) with optional username and
// password (RFC 1929).
type Upstream struct {
	Address  string // host:port
	Username string
	Password string
}

// ParseUpstream checks a proxy's address and credentials.
func ParseUpstream(address, username, password string) (*Upstream, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(address))
	if err != nil || host == "" {
		return nil, fmt.Errorf("egress proxy address %q: want host:port", address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("egress proxy address %q: port %q: want 1 to 65535", address, port)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if _, err := ParseHostPattern(host); err != nil || strings.HasPrefix(host, "*") {
			return nil, fmt.Errorf("egress proxy address %q: want an IPv4 address or a host name", address)
		}
	}
	if len(username) > 255 || len(password) > 255 {
		return nil, fmt.Errorf("egress proxy: username and password are at most 255 bytes each")
	}
	if password != "" && username == "" {
		return nil, fmt.Errorf("egress proxy: a password needs a username")
	}
	return &Upstream{Address: net.JoinHostPort(host, port), Username: username, Password: password}, nil
}

// DefaultPolicy is what a sandbox gets when its request says nothing: the internet,
// minus the fixed deny list.
func DefaultPolicy() Policy {
	return Policy{AllowInternet: true}
}

// ParsePolicy builds a Policy from request fields. A nil allowInternet means true.
// Entries are CIDRs ("10.0.0.0/8") or bare addresses ("1.1.1.1", taken as a /32).
// Sandboxes have IPv4 only, so IPv6 entries are rejected rather than silently
// ignored. allowOut may also hold host names and wildcards (see
// ParseHostPattern); denyOut may not, as in E2B: a name cannot be denied
// against an address the sandbox reaches directly, only allowed through a
// denied range.
func ParsePolicy(allowInternet *bool, allowOut, denyOut []string) (Policy, error) {
	pol := DefaultPolicy()
	if allowInternet != nil {
		pol.AllowInternet = *allowInternet
	}
	for i, e := range allowOut {
		e = strings.TrimSpace(e)
		if isHostNameEntry(e) {
			name, err := ParseHostPattern(e)
			if err != nil {
				return Policy{}, fmt.Errorf("parse network policy: allowOut[%d] %q: %w", i, e, err)
			}
			if !slices.Contains(pol.AllowNames, name) {
				pol.AllowNames = append(pol.AllowNames, name)
			}
			continue
		}
		p, err := parseCIDR(e)
		if err != nil {
			return Policy{}, fmt.Errorf("parse network policy: allowOut[%d] %q: %w", i, e, err)
		}
		pol.AllowOut = append(pol.AllowOut, p)
	}
	for i, e := range denyOut {
		e = strings.TrimSpace(e)
		if isHostNameEntry(e) {
			return Policy{}, fmt.Errorf("parse network policy: denyOut[%d] %q: host names are allowed in allowOut only: deny by address or CIDR (0.0.0.0/0 for everything) and allow names", i, e)
		}
		p, err := parseCIDR(e)
		if err != nil {
			return Policy{}, fmt.Errorf("parse network policy: denyOut[%d] %q: %w", i, e, err)
		}
		pol.DenyOut = append(pol.DenyOut, p)
	}
	return pol, nil
}

// isHostNameEntry tells a list entry meant as a host name from one meant
// as an address or CIDR: names have a letter, an underscore or a "*" (the
// last label of a name is never all digits), addresses and CIDRs never
// (IPv6 ones have hex letters but also a ":").
func isHostNameEntry(e string) bool {
	if strings.ContainsAny(e, ":/") {
		return false
	}
	return strings.ContainsFunc(e, func(r rune) bool {
		return r == '*' || r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || r > 0x7f
	})
}

// maxHostNameLen is the longest DNS name in text form, without the final dot.
const maxHostNameLen = 253

// ParseHostPattern checks a host name ("pypi.org") or a wildcard
// ("*.github.com", whose "*" must be the whole first label) and returns it
// lower case, without a final dot.
func ParseHostPattern(s string) (string, error) {
	name := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), "."))
	switch {
	case name == "":
		return "", fmt.Errorf("empty host name")
	case len(name) > maxHostNameLen:
		return "", fmt.Errorf("host name of %d characters: at most %d", len(name), maxHostNameLen)
	}
	rest, wildcard := strings.CutPrefix(name, "*.")
	labels := strings.Split(rest, ".")
	if wildcard && len(labels) < 2 {
		return "", fmt.Errorf("a wildcard covers the names under a domain of two labels or more, as in *.example.com")
	}
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", err
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("not a host name (its last label is a number); addresses go as 203.0.113.7 or CIDRs")
	}
	return name, nil
}

// checkLabel checks one label of a host name: letters, digits, "-" (not
// first or last) and "_" (service labels), 1 to 63 characters.
func checkLabel(l string) error {
	if strings.Contains(l, "*") {
		return fmt.Errorf("a wildcard must be the whole first label, as in *.example.com")
	}
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q: want 1 to 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q: a label cannot start or end with \"-\"", l)
	}
	for _, r := range l {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("label %q: %q is not allowed in a host name (internationalized names go in their xn-- form)", l, r)
		}
	}
	return nil
}

// MatchHost returns the pattern of patterns that host matches ("" if none).
// host is a name a connection carries (TLS SNI, HTTP Host without port);
// case and a final dot do not matter. Addresses match no pattern.
func MatchHost(patterns []string, host string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || !plainHostName(host) {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*"); ok {
			if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
				return p
			}
			continue
		}
		if host == p {
			return p
		}
	}
	return ""
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
			return netip.Prefix{}, fmt.Errorf("want an IPv4 address or CIDR such as 203.0.113.0/24, or a host name")
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
	return p.AllowInternet == q.AllowInternet && slices.Equal(p.AllowOut, q.AllowOut) &&
		slices.Equal(p.DenyOut, q.DenyOut) && slices.Equal(p.AllowNames, q.AllowNames) &&
		(p.Upstream == nil) == (q.Upstream == nil) && (p.Upstream == nil || *p.Upstream == *q.Upstream) &&
		rulesEqual(p.Rules, q.Rules) && p.Team == q.Team
}

// String renders p for logs.
func (p Policy) String() string {
	s := fmt.Sprintf("allowInternet=%t allowOut=%v denyOut=%v", p.AllowInternet, p.AllowOut, p.DenyOut)
	if len(p.AllowNames) > 0 {
		s += fmt.Sprintf(" allowNames=%v", p.AllowNames)
	}
	if p.Upstream != nil {
		s += " egressProxy=" + p.Upstream.Address // never the password
	}
	for _, r := range p.Rules {
		s += " rule=" + r.Pattern // never the headers: they may hold credentials
	}
	return s
}

func containsAddr(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// plainHostName reports whether host has only the characters of a host name
// (letters, digits, "-", "_" and "."): an escaped dot (`evil\.github.com`) or any
// other character would let a name read one way here and another in DNS.
func plainHostName(host string) bool {
	for _, r := range host {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}
