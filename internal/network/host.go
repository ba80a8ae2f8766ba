package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
)

// resolvConfPaths are read in order by HostDNSServers. On systemd-resolved hosts the
// first lists only the 127.0.0.53 stub, which a sandbox cannot reach; the second
// lists the real upstream servers.
var resolvConfPaths = []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"}

// HostDNSServers returns the IPv4 nameservers of the host's resolv.conf, skipping
// loopback ones (a local stub is not reachable from a sandbox).
func HostDNSServers() ([]netip.Addr, error) {
	var errs []error
	for _, path := range resolvConfPaths {
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if servers := parseNameservers(b); len(servers) > 0 {
			return servers, nil
		}
	}
	return nil, fmt.Errorf("host DNS servers: no usable IPv4 nameserver in %v: %w", resolvConfPaths, errors.Join(errs...))
}

// parseNameservers returns the non-loopback IPv4 "nameserver" entries of a resolv.conf.
func parseNameservers(b []byte) []netip.Addr {
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || !a.Unmap().Is4() || a.Unmap().IsLoopback() || a.Unmap().IsUnspecified() {
			continue
		}
		out = append(out, a.Unmap())
	}
	return out
}

// hostAddrs returns every IPv4 address on the root netns's interfaces as /32s.
func hostAddrs() ([]netip.Prefix, error) {
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap().Is4() {
			out = append(out, netip.PrefixFrom(ip.Unmap(), 32))
		}
	}
	return out, nil
}

// defaultRouteLinks returns the names of the interfaces the host's IPv4 default
// routes leave through.
func defaultRouteLinks() ([]string, error) {
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	seen := map[int]bool{}
	var names []string
	for _, r := range routes {
		if (r.Dst != nil && !isDefaultDst(r.Dst.String())) || r.LinkIndex == 0 || seen[r.LinkIndex] {
			continue
		}
		seen[r.LinkIndex] = true
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			return nil, fmt.Errorf("find link %d: %w", r.LinkIndex, err)
		}
		names = append(names, l.Attrs().Name)
	}
	return names, nil
}

func isDefaultDst(s string) bool {
	return s == "0.0.0.0/0"
}

// enableStrictSource turns on strict reverse-path filtering for one interface:
// a packet whose source address is not routed back through the interface it came
// in on is dropped. On a slot's host veth this keeps a sandbox from sending with
// another slot's address (the egress gateway knows sandboxes by their address).
func enableStrictSource(iface string) error {
	path := "/proc/sys/net/ipv4/conf/" + iface + "/rp_filter"
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable reverse-path filtering on %s: %w", iface, err)
	}
	return nil
}

// enableForwarding turns on IPv4 forwarding for one interface. Linux checks the
// setting of the interface a packet arrives on, so this lets the host route what the
// interface brings in without making it a router for every interface.
func enableForwarding(iface string) error {
	path := "/proc/sys/net/ipv4/conf/" + iface + "/forwarding"
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding on %s: %w", iface, err)
	}
	return nil
}
