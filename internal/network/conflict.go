package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrRangeConflict means the pool's CIDR overlaps addresses or routes the host
// already has, or another aenv server's range: sandboxes there would be
// unreachable, or reachable by the wrong server (one server's envd /init landing in
// another's sandbox).
var ErrRangeConflict = errors.New("sandbox range conflicts with the host's network")

// maxConflictsNamed bounds the conflicts an error lists: a foreign pool with many
// slots holds three entries per slot (address, link route, local route).
const maxConflictsNamed = 5

// hostNet is an IPv4 address or route of the root netns, as the range check sees it.
type hostNet struct {
	kind   string // "address" or "route"
	prefix netip.Prefix
	link   string // the interface it is on; "" for routes without one
}

// foreignPool is the pool of another aenv server on this host, found by its
// nftables table.
type foreignPool struct {
	prefix string
	cidr   netip.Prefix
}

// foreignVethPattern parses a host veth name of any pool, "<prefix><index>h".
var foreignVethPattern = regexp.MustCompile(`^([a-z](?:[a-z0-9]*[a-z])?)(?:0|[1-9][0-9]*)h$`)

// checkRangeFree refuses cfg's CIDR when it overlaps what the host holds. Objects of
// cfg's own prefix are not conflicts: they are the slots a restarted server keeps
// (Start has removed its other leftovers before this runs).
func checkRangeFree(cfg Config, nets []hostNet, pools []foreignPool) error {
	var conflicts []string
	// Another server is named once, by its range or by its first sandbox
	// found, not once per address and route of each of its slots.
	named := map[string]bool{}
	for _, p := range pools {
		if p.prefix != cfg.Prefix && p.cidr.Overlaps(cfg.CIDR) {
			conflicts = append(conflicts, fmt.Sprintf("the range %s of another aenv server (net prefix %q)", p.cidr, p.prefix))
			named[p.prefix] = true
		}
	}
	for _, n := range nets {
		// A default route covers every range without claiming any.
		if n.prefix.Bits() == 0 || !n.prefix.Overlaps(cfg.CIDR) {
			continue
		}
		if _, ours := cfg.indexFromHostVeth(n.link); ours {
			continue
		}
		what := fmt.Sprintf("%s %s", n.kind, n.prefix)
		if n.link != "" {
			what += " on " + n.link
		}
		if m := foreignVethPattern.FindStringSubmatch(n.link); m != nil && m[1] != cfg.Prefix {
			if named[m[1]] {
				continue
			}
			named[m[1]] = true
			what += fmt.Sprintf(" (a sandbox of another aenv server, net prefix %q)", m[1])
		}
		if !slices.Contains(conflicts, what) {
			conflicts = append(conflicts, what)
		}
	}
	if len(conflicts) == 0 {
		return nil
	}
	more := ""
	if len(conflicts) > maxConflictsNamed {
		more = fmt.Sprintf(" and %d more", len(conflicts)-maxConflictsNamed)
		conflicts = conflicts[:maxConflictsNamed]
	}
	return fmt.Errorf("%w: --sandbox-cidr %s (net prefix %q) overlaps %s%s; choose a range nothing else on this host uses",
		ErrRangeConflict, cfg.CIDR, cfg.Prefix, strings.Join(conflicts, "; "), more)
}

// hostNets lists the IPv4 addresses of the root netns and its routes in every table.
func hostNets() ([]hostNet, error) {
	links, err := listLinks()
	if err != nil {
		return nil, err
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	var out []hostNet
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet.IP, a.IPNet.Mask); ok {
			out = append(out, hostNet{kind: "address", prefix: p, link: names[a.LinkIndex]})
		}
	}
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue // a default route
		}
		if p, ok := prefixOf(r.Dst.IP, r.Dst.Mask); ok {
			out = append(out, hostNet{kind: "route", prefix: p, link: names[r.LinkIndex]})
		}
	}
	return out, nil
}

// prefixOf turns a netlink address and mask into a masked IPv4 prefix.
func prefixOf(ip net.IP, mask net.IPMask) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || !a.Unmap().Is4() {
		return netip.Prefix{}, false
	}
	ones, bits := mask.Size()
	switch bits {
	case 32:
	case 128:
		ones -= 96
	default:
		ones = 32 // no mask: the address alone
	}
	if ones < 0 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

// foreignPools finds the other aenv servers' pools on this host by their nftables
// tables: an inet table with the pool's chains and fixed-deny set, whose
// postrouting rule names the pool's CIDR. A server with no slot yet has no address
// to find, but its table is there from its start.
func foreignPools(cfg Config) ([]foreignPool, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var out []foreignPool
	for _, t := range tables {
		if t.Name == cfg.Prefix || !prefixPattern.MatchString(t.Name) {
			continue
		}
		sets, err := conn.GetSets(t)
		if err != nil {
			return nil, fmt.Errorf("list sets of table inet %s: %w", t.Name, err)
		}
		if !hasSet(sets, fixedDenySet) {
			continue
		}
		rules, err := conn.GetRules(t, &nftables.Chain{Name: postroutingChain, Table: t})
		if err != nil {
			// Not a pool's table after all: it has no postrouting chain.
			continue
		}
		if cidr, ok := poolCIDRFromRules(rules); ok {
			out = append(out, foreignPool{prefix: t.Name, cidr: cidr})
		}
	}
	return out, nil
}

func hasSet(sets []*nftables.Set, name string) bool {
	for _, s := range sets {
		if s.Name == name {
			return true
		}
	}
	return false
}

// poolCIDRFromRules reads a pool's CIDR back from its postrouting rule, the source
// match ipAddrInPrefix builds: payload (IPv4 source), bitwise mask, compare.
func poolCIDRFromRules(rules []*nftables.Rule) (netip.Prefix, bool) {
	for _, r := range rules {
		for i := 0; i+2 < len(r.Exprs); i++ {
			pl, ok := r.Exprs[i].(*expr.Payload)
			if !ok || pl.Base != expr.PayloadBaseNetworkHeader || pl.Offset != ipSaddrOffset || pl.Len != 4 {
				continue
			}
			bw, ok1 := r.Exprs[i+1].(*expr.Bitwise)
			cmp, ok2 := r.Exprs[i+2].(*expr.Cmp)
			if !ok1 || !ok2 || len(bw.Mask) != 4 || len(cmp.Data) != 4 || cmp.Op != expr.CmpOpEq {
				continue
			}
			if p, ok := prefixOf(cmp.Data, bw.Mask); ok {
				return p, true
			}
		}
	}
	return netip.Prefix{}, false
}

// checkHostRange refuses cfg's CIDR when the host's addresses, routes or another
// aenv server's pool overlap it.
func checkHostRange(cfg Config) error {
	nets, err := hostNets()
	if err != nil {
		return fmt.Errorf("check sandbox range: %w", err)
	}
	pools, err := foreignPools(cfg)
	if err != nil {
		return fmt.Errorf("check sandbox range: %w", err)
	}
	return checkRangeFree(cfg, nets, pools)
}
