package network

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/aenv-dev/aenv/internal/errdefs"
)

// netnsDir is where named network namespaces are pinned; `ip netns` uses the same place,
// so `ip netns exec <name>` works on our slots.
const netnsDir = "/var/run/netns"

// maxIfaceNameLen is IFNAMSIZ minus the terminating NUL.
const maxIfaceNameLen = 15

// slotPrefixBits is the size of one slot's subnet: a /30 holds the host address (.1)
// and the sandbox address (.2).
const slotPrefixBits = 30

// prefixPattern ends in a letter so that "<prefix><index>h" parses back to one
// (prefix, index) pair only: with digit endings, pools "a1" and "a" would both
// claim "a12h".
var prefixPattern = regexp.MustCompile(`^[a-z]([a-z0-9]*[a-z])?$`)

// Config describes one pool of network slots.
//
// Two pools on one host must not use prefixes where one is a prefix of the other
// ("aenv" and "aenvx"): the firewall matches host veths by name prefix.
type Config struct {
	// Prefix names everything the pool creates: netns "<prefix>-<index>",
	// host veth "<prefix><index>h" and the nftables table "<prefix>".
	Prefix string
	// CIDR is split into /30s; slot index i gets the i-th one.
	CIDR netip.Prefix
	// WarmPool is the number of free slots kept ready ahead of demand.
	WarmPool int

	// PrivateCIDRs are ranges no sandbox may reach whatever its policy says, on top
	// of the ones always denied: the host's own addresses, CIDR (other sandboxes),
	// 169.254.0.0/16 (link-local, cloud metadata) and 127.0.0.0/8. Nil means
	// DefaultPrivateCIDRs; an empty non-nil slice adds none.
	PrivateCIDRs []netip.Prefix
	// HostCIDRs are more addresses of this host or its services that sandboxes must
	// not reach: addresses the server is reached at that are not on this host's
	// interfaces (a load balancer in front of the API, say). The addresses on the
	// host's interfaces are added at Start without being listed here.
	HostCIDRs []netip.Prefix
	// DNSServers are the resolvers sandboxes may query on port 53 (UDP and TCP) even
	// though they sit in a denied range, as long as the sandbox's own policy allows
	// their address. Nil means the nameservers of the host's resolv.conf (see
	// HostDNSServers). A sandbox's /etc/resolv.conf must list them.
	DNSServers []netip.Addr
	// Uplinks are the interfaces sandbox traffic leaves the host through; IP
	// forwarding is turned on for them (replies come in through them) and for every
	// slot's host veth, not globally. Nil means the interfaces of the host's IPv4
	// default routes at Start.
	Uplinks []string
	// Egress is the node's egress gateway, nil for none. With one, every
	// slot's DNS (UDP and TCP port 53, whatever the address) goes to its DNS
	// port, and a slot whose policy allows host names sends its TCP
	// connections that the CIDR lists do not allow to its proxy port. Without
	// one, sandboxes query the resolvers directly and policies with names are
	// refused.
	Egress Egress
	// ProxyAllTCP sends every slot's TCP to the egress gateway, whatever its
	// policy: for a node-wide upstream proxy, which the gateway dials.
	ProxyAllTCP bool
}

// Egress is what the pool needs of the node's egress gateway
// (internal/egress).
type Egress interface {
	// Ports are where the gateway listens on the host's addresses: DNS
	// (UDP and TCP) and the transparent TCP proxy. Both must be open
	// before the pool starts.
	Ports() (dns, proxy uint16)
	// SetDenied gives the ranges no sandbox may reach whatever its policy
	// says (the pool's fixed deny list); called at Start.
	SetDenied(ranges []netip.Prefix)
	// SetSlot tells the gateway the policy of an in-use slot whose sandbox
	// has the address sandboxIP; dnsOpen says whether the policy lets the
	// sandbox ask the node's resolvers for any name (else only for names it
	// allows). It returns a function that puts back what the gateway held
	// before, for a policy the firewall then failed to take.
	SetSlot(index int, sandboxIP netip.Addr, pol Policy, dnsOpen bool) (undo func())
	// ClearSlot forgets a released slot.
	ClearSlot(index int)
}

// DefaultPrivateCIDRs are the private ranges denied to sandboxes by default: RFC 1918
// and the carrier-grade NAT range.
func DefaultPrivateCIDRs() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("100.64.0.0/10"),
	}
}

// alwaysDeniedCIDRs are denied whatever the configuration says.
func alwaysDeniedCIDRs() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("0.0.0.0/8"), // "this network": 0.0.0.0 reaches the host itself
	}
}

// validate reports the first problem with c.
func (c Config) validate() error {
	if !prefixPattern.MatchString(c.Prefix) {
		return fmt.Errorf("network prefix %q: want lowercase letters and digits, starting and ending with a letter", c.Prefix)
	}
	if !c.CIDR.IsValid() || !c.CIDR.Addr().Is4() {
		return fmt.Errorf("network CIDR %s: want an IPv4 prefix", c.CIDR)
	}
	if c.CIDR.Masked() != c.CIDR {
		return fmt.Errorf("network CIDR %s: host bits set (did you mean %s?)", c.CIDR, c.CIDR.Masked())
	}
	if c.CIDR.Bits() > slotPrefixBits {
		return fmt.Errorf("network CIDR %s: smaller than one /%d slot", c.CIDR, slotPrefixBits)
	}
	if longest := c.hostVethName(c.capacity() - 1); len(longest) > maxIfaceNameLen {
		return fmt.Errorf("network prefix %q with CIDR %s: veth name %q exceeds %d characters; shorten the prefix or the CIDR",
			c.Prefix, c.CIDR, longest, maxIfaceNameLen)
	}
	if c.WarmPool < 0 || c.WarmPool > c.capacity() {
		return fmt.Errorf("network warm pool %d: want 0..%d", c.WarmPool, c.capacity())
	}
	for _, lists := range [][]netip.Prefix{c.PrivateCIDRs, c.HostCIDRs} {
		for _, p := range lists {
			if !p.IsValid() || !p.Addr().Is4() {
				return fmt.Errorf("network denied CIDR %s: want an IPv4 prefix", p)
			}
		}
	}
	for _, a := range c.DNSServers {
		if !a.Is4() {
			return fmt.Errorf("network DNS server %s: want an IPv4 address", a)
		}
	}
	for _, name := range c.Uplinks {
		if name == "" || len(name) > maxIfaceNameLen || strings.HasPrefix(name, c.Prefix) {
			return fmt.Errorf("network uplink %q: want an interface name not starting with the prefix %q", name, c.Prefix)
		}
	}
	return nil
}

// capacity is the number of /30 slots in the CIDR.
func (c Config) capacity() int {
	return 1 << (slotPrefixBits - c.CIDR.Bits())
}

func (c Config) netnsName(index int) string {
	return c.Prefix + "-" + strconv.Itoa(index)
}

func (c Config) hostVethName(index int) string {
	return c.Prefix + strconv.Itoa(index) + "h"
}

// slot describes index without touching the kernel.
func (c Config) slot(index int) *Slot {
	base := c.CIDR.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(index) << (32 - slotPrefixBits)
	name := c.netnsName(index)
	return &Slot{
		Index:     index,
		Netns:     name,
		NetnsPath: netnsDir + "/" + name,
		HostVeth:  c.hostVethName(index),
		HostIP:    addrFromUint32(n + 1),
		SandboxIP: addrFromUint32(n + 2),
	}
}

func addrFromUint32(n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// indexFromNetns returns the slot index a netns name of this pool encodes.
func (c Config) indexFromNetns(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, c.Prefix+"-")
	if !ok {
		return 0, false
	}
	return c.parseIndex(rest)
}

// indexFromHostVeth returns the slot index a host veth name of this pool encodes.
func (c Config) indexFromHostVeth(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, c.Prefix)
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, "h")
	if !ok {
		return 0, false
	}
	return c.parseIndex(rest)
}

// parseIndex accepts only the canonical decimal form, so each name maps to one index
// and back ("07" is not ours).
func (c Config) parseIndex(s string) (int, bool) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// ErrExhausted means every slot of the CIDR is taken.
var ErrExhausted = errdefs.New(errdefs.ErrUnavailable, "network slots exhausted")

// ErrClosed means the pool was closed or destroyed.
var ErrClosed = errdefs.New(errdefs.ErrUnavailable, "network pool closed")
