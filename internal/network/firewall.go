package network

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The pool's nftables table (family inet, named after the prefix), with slot 3 in use:
//
//	table inet <prefix> {
//		set fixed-deny { type ipv4_addr; flags interval; elements = { ... } }
//		map slot-egress { type ifname : verdict; elements = { "<prefix>3h" : jump egress-3 } }
//		map slot-ingress { type ifname : verdict; elements = { "<prefix>3h" : jump ingress-3 } }
//		map slot-nat { type ifname : verdict; elements = { "<prefix>3h" : jump nat-3 } }
//		chain input {
//			type filter hook input priority filter; policy accept;
//			iifname "<prefix>*" ct state established,related accept
//			iifname "<prefix>*" ct status dnat tcp dport PROXY accept   (*)
//			iifname "<prefix>*" ct status dnat udp dport DNS accept     (*)
//			iifname "<prefix>*" ct status dnat tcp dport DNS accept     (*)
//			iifname "<prefix>*" drop
//			tcp dport PROXY drop                                        (*)
//			udp dport DNS drop                                          (*)
//			tcp dport DNS drop                                          (*)
//		}
//		chain forward {
//			type filter hook forward priority filter; policy accept;
//			iifname "<prefix>*" iifname vmap @slot-egress
//			iifname "<prefix>*" drop
//			oifname "<prefix>*" oifname vmap @slot-ingress
//			oifname "<prefix>*" drop
//		}
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			meta nfproto ipv4 ip saddr <CIDR> oifname != "<prefix>*" masquerade
//		}
//		chain prerouting {
//			type nat hook prerouting priority dstnat; policy accept;
//			iifname "<prefix>*" meta nfproto ipv4 udp dport 53 redirect to :DNS  (*)
//			iifname "<prefix>*" meta nfproto ipv4 tcp dport 53 redirect to :DNS  (*)
//			iifname "<prefix>*" iifname vmap @slot-nat
//		}
//		chain proxy {
//			meta nfproto ipv4 meta l4proto tcp redirect to :PROXY                      (*)
//		}
//		(per slot, see slotpolicy.go: sets allow-3 and deny-3, counters tx-3 and
//		rx-3, chains egress-3, ingress-3 and nat-3)
//	}
//
// The rules marked (*) are there when the pool has an egress gateway (Config.Egress),
// whose ports are DNS and PROXY: every slot's DNS goes to the gateway, and so do the
// TCP connections of a slot whose nat chain jumps to proxy (its policy allows names).
// A redirected packet goes to the host (input), not through forward. The gateway
// listens on all the host's addresses, so its ports are closed to anything that was
// not redirected there.
//
// input: a sandbox may only answer connections the host opened; it cannot reach the
// server's API or any other host service. forward: what a sandbox sends is judged by
// its slot's egress chain; a slot without a policy sends nothing. Into a sandbox only
// replies pass. postrouting: what leaves for the outside carries the host's address.
const (
	inputChain       = "input"
	forwardChain     = "forward"
	postroutingChain = "postrouting"
	preroutingChain  = "prerouting"
	proxyChain       = "proxy"
	fixedDenySet     = "fixed-deny"
	slotEgressMap    = "slot-egress"
	slotIngressMap   = "slot-ingress"
	slotNatMap       = "slot-nat"
)

// sharedChains are the chains installFirewall owns; any other chain of the table
// belongs to a slot or is debris.
var sharedChains = map[string]bool{inputChain: true, forwardChain: true, postroutingChain: true,
	preroutingChain: true, proxyChain: true}

// firewallTable is the pool's table; it exists only as a name for nftables calls.
func firewallTable(prefix string) *nftables.Table {
	return &nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}
}

// fixedDenyRanges builds the deny list no policy can override: the host's addresses,
// the pool (other sandboxes), the always-denied ranges and the configured ones.
func fixedDenyRanges(cfg Config, hostAddrs []netip.Prefix) []addrRange {
	return mergePrefixes(fixedDenyPrefixes(cfg, hostAddrs))
}

// fixedDenyPrefixes is fixedDenyRanges before merging.
func fixedDenyPrefixes(cfg Config, hostAddrs []netip.Prefix) []netip.Prefix {
	private := cfg.PrivateCIDRs
	if private == nil {
		private = DefaultPrivateCIDRs()
	}
	var all []netip.Prefix
	all = append(all, hostAddrs...)
	all = append(all, cfg.HostCIDRs...)
	all = append(all, cfg.CIDR)
	all = append(all, alwaysDeniedCIDRs()...)
	all = append(all, private...)
	return all
}

// installFirewall creates or refreshes the pool's table in one atomic batch. The
// policies of the slots in keep (chains, sets, counters) survive; every other slot's
// are removed, as is anything else the table holds.
func installFirewall(cfg Config, deny []addrRange, keep map[int]bool) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("install firewall: %w", err)
	}
	table := firewallTable(cfg.Prefix)
	existing, err := listTableContents(conn, table)
	if err != nil {
		return fmt.Errorf("install firewall: %w", err)
	}

	conn.AddTable(table)
	chains := sharedChainDefs(table)
	for _, c := range chains {
		conn.AddChain(c)
		conn.FlushChain(c)
	}
	fixed := fixedDenySetDef(table)
	egressMap, ingressMap := slotMapDefs(table)
	natMap := slotNatMapDef(table)
	for _, s := range []*nftables.Set{fixed, egressMap, ingressMap, natMap} {
		if err := conn.AddSet(s, nil); err != nil {
			return fmt.Errorf("install firewall: %w", err)
		}
		conn.FlushSet(s)
	}
	if err := conn.SetAddElements(fixed, intervalElements(deny)); err != nil {
		return fmt.Errorf("install firewall: %w", err)
	}
	for _, i := range removeStaleInBatch(conn, table, existing, keep) {
		// A slot kept from a version without nat chains gets an empty one; its
		// sandbox's policy is set again when the manager adopts it.
		conn.AddChain(slotObjectDefs(table, i).nat)
		if err := addSlotDispatchInBatch(conn, cfg, i); err != nil {
			return fmt.Errorf("install firewall: %w", err)
		}
	}
	for _, r := range sharedRules(cfg, chains) {
		conn.AddRule(r)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install firewall table inet %s: %w", cfg.Prefix, err)
	}
	return nil
}

// tableContents names what a table holds.
type tableContents struct {
	chains, sets, counters []string
}

func listTableContents(conn *nftables.Conn, table *nftables.Table) (tableContents, error) {
	var tc tableContents
	tables, err := conn.ListTablesOfFamily(table.Family)
	if err != nil {
		return tc, fmt.Errorf("list tables: %w", err)
	}
	found := false
	for _, t := range tables {
		found = found || t.Name == table.Name
	}
	if !found {
		return tc, nil
	}
	chains, err := conn.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return tc, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name == table.Name {
			tc.chains = append(tc.chains, c.Name)
		}
	}
	sets, err := conn.GetSets(table)
	if err != nil {
		return tc, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		tc.sets = append(tc.sets, s.Name)
	}
	objs, err := conn.GetNamedObjects(table)
	if err != nil {
		return tc, fmt.Errorf("list objects: %w", err)
	}
	for _, o := range objs {
		if no, ok := o.(*nftables.NamedObj); ok && no.Type == nftables.ObjTypeCounter {
			tc.counters = append(tc.counters, no.Name)
		}
	}
	return tc, nil
}

// removeStaleInBatch queues the removal of every chain, set and counter that is
// neither shared nor part of a kept slot, and returns the kept slots whose policy
// chains are complete. The slot maps must already be flushed in this batch, so
// nothing refers to the chains any more.
func removeStaleInBatch(conn *nftables.Conn, table *nftables.Table, tc tableContents, keep map[int]bool) []int {
	ownedByKept := func(name string) (int, bool) {
		i, ok := slotIndexFromObjectName(name)
		return i, ok && keep[i]
	}
	egress := map[int]bool{}
	ingress := map[int]bool{}
	var stale []*nftables.Chain
	for _, name := range tc.chains {
		if sharedChains[name] {
			continue
		}
		if i, ok := ownedByKept(name); ok {
			egress[i] = egress[i] || name == egressChainName(i)
			ingress[i] = ingress[i] || name == ingressChainName(i)
			continue
		}
		c := &nftables.Chain{Name: name, Table: table}
		conn.FlushChain(c)
		stale = append(stale, c)
	}
	for _, c := range stale {
		conn.DelChain(c)
	}
	for _, name := range tc.sets {
		if name == fixedDenySet || name == slotEgressMap || name == slotIngressMap || name == slotNatMap {
			continue
		}
		if _, ok := ownedByKept(name); !ok {
			conn.DelSet(&nftables.Set{Name: name, Table: table})
		}
	}
	for _, name := range tc.counters {
		if _, ok := ownedByKept(name); !ok {
			conn.DeleteObject(&nftables.NamedObj{Name: name, Table: table, Type: nftables.ObjTypeCounter})
		}
	}
	var kept []int
	for i := range egress {
		if ingress[i] {
			kept = append(kept, i)
		}
	}
	return kept
}

// removeFirewall deletes the pool's table; a missing table is not an error.
func removeFirewall(prefix string) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("remove firewall: %w", err)
	}
	deleteTableInBatch(conn, firewallTable(prefix))
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("remove firewall table inet %s: %w", prefix, err)
	}
	return nil
}

// deleteTableInBatch queues the table's deletion whether or not it exists: adding a
// table that exists is a no-op, so add-then-delete never fails on a missing table.
func deleteTableInBatch(conn *nftables.Conn, table *nftables.Table) {
	conn.AddTable(table)
	conn.DelTable(table)
}

func sharedChainDefs(table *nftables.Table) []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return []*nftables.Chain{
		{Name: inputChain, Table: table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: forwardChain, Table: table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: postroutingChain, Table: table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept},
		{Name: preroutingChain, Table: table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept},
		{Name: proxyChain, Table: table},
	}
}

func fixedDenySetDef(table *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: table, Name: fixedDenySet, KeyType: nftables.TypeIPAddr, Interval: true}
}

// slotMapDefs are the maps from a slot's host veth to its chains. Interface names are
// host-endian strings to nft; saying so lets `nft list` print the keys.
func slotMapDefs(table *nftables.Table) (egress, ingress *nftables.Set) {
	egress = &nftables.Set{Table: table, Name: slotEgressMap, IsMap: true,
		KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian, DataType: nftables.TypeVerdict}
	ingress = &nftables.Set{Table: table, Name: slotIngressMap, IsMap: true,
		KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian, DataType: nftables.TypeVerdict}
	return egress, ingress
}

// slotNatMapDef is the map from a slot's host veth to its nat chain.
func slotNatMapDef(table *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: table, Name: slotNatMap, IsMap: true,
		KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian, DataType: nftables.TypeVerdict}
}

// sharedRules returns the rules of the shared chains (sharedChainDefs).
func sharedRules(cfg Config, chains []*nftables.Chain) []*nftables.Rule {
	input, forward, postrouting, prerouting, proxy := chains[0], chains[1], chains[2], chains[3], chains[4]
	p := cfg.Prefix
	var dnsPort, proxyPort uint16
	if cfg.Egress != nil {
		dnsPort, proxyPort = cfg.Egress.Ports()
	}
	// The gateway's ports: TCP proxy, UDP DNS, TCP DNS.
	gatewayPorts := []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_TCP, proxyPort}, {unix.IPPROTO_UDP, dnsPort}, {unix.IPPROTO_TCP, dnsPort}}

	rules := []*nftables.Rule{
		rule(input, ifnamePrefix(expr.MetaKeyIIFNAME, p), ctEstablishedOrRelated(), verdict(expr.VerdictAccept)),
	}
	if cfg.Egress != nil {
		for _, g := range gatewayPorts {
			rules = append(rules, rule(input, ifnamePrefix(expr.MetaKeyIIFNAME, p), ctStatusDNAT(), l4DportIs(g.proto, g.port), verdict(expr.VerdictAccept)))
		}
	}
	rules = append(rules, rule(input, ifnamePrefix(expr.MetaKeyIIFNAME, p), verdict(expr.VerdictDrop)))
	if cfg.Egress != nil {
		for _, g := range gatewayPorts {
			rules = append(rules, rule(input, l4DportIs(g.proto, g.port), verdict(expr.VerdictDrop)))
		}
	}
	rules = append(rules,
		rule(forward, ifnamePrefix(expr.MetaKeyIIFNAME, p), ifnameVmap(expr.MetaKeyIIFNAME, slotEgressMap)),
		rule(forward, ifnamePrefix(expr.MetaKeyIIFNAME, p), verdict(expr.VerdictDrop)),
		rule(forward, ifnamePrefix(expr.MetaKeyOIFNAME, p), ifnameVmap(expr.MetaKeyOIFNAME, slotIngressMap)),
		rule(forward, ifnamePrefix(expr.MetaKeyOIFNAME, p), verdict(expr.VerdictDrop)),
		rule(postrouting, nfprotoIs(unix.NFPROTO_IPV4), ipAddrInPrefix(ipSaddrOffset, cfg.CIDR),
			ifnameNotPrefix(expr.MetaKeyOIFNAME, p), []expr.Any{&expr.Masq{}}),
	)
	if cfg.Egress != nil {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rules = append(rules, rule(prerouting, ifnamePrefix(expr.MetaKeyIIFNAME, p), nfprotoIs(unix.NFPROTO_IPV4),
				l4DportIs(proto, 53), redirectTo(dnsPort)))
		}
	}
	rules = append(rules, rule(prerouting, ifnamePrefix(expr.MetaKeyIIFNAME, p), ifnameVmap(expr.MetaKeyIIFNAME, slotNatMap)))
	if cfg.Egress != nil {
		rules = append(rules, rule(proxy, nfprotoIs(unix.NFPROTO_IPV4), l4protoIs(unix.IPPROTO_TCP), redirectTo(proxyPort)))
	}
	return rules
}

// redirectTo sends the packet's connection to port on the address of the interface it
// came in through (nft's "redirect to :port").
func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// ctStatusDNAT matches a packet of a connection whose destination was rewritten (by
// a redirect).
func ctStatusDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDstNAT),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctStatusDstNAT is the kernel's IPS_DST_NAT bit of a conntrack entry's status.
const ctStatusDstNAT = 1 << 5

func l4protoIs(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func rule(chain *nftables.Chain, parts ...[]expr.Any) *nftables.Rule {
	var exprs []expr.Any
	for _, p := range parts {
		exprs = append(exprs, p...)
	}
	return &nftables.Rule{Table: chain.Table, Chain: chain, Exprs: exprs}
}

// ifnamePrefix matches an interface name starting with prefix, like nft's "prefix*":
// the comparison covers the prefix bytes only, without the terminating NUL.
func ifnamePrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

// ifnameNotPrefix matches an interface name not starting with prefix.
func ifnameNotPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(prefix)},
	}
}

// ifnameVmap jumps to the verdict a map holds for the interface name.
func ifnameVmap(key expr.MetaKey, mapName string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: mapName, DestRegister: 0, IsDestRegSet: true},
	}
}

func nfprotoIs(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func nfprotoIsNot(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{proto}},
	}
}

// Offsets of the IPv4 source and destination addresses in the network header.
const (
	ipSaddrOffset = 12
	ipDaddrOffset = 16
)

// ipAddrInPrefix matches the IPv4 address at offset against p; the rule must already
// have matched IPv4.
func ipAddrInPrefix(offset uint32, p netip.Prefix) []expr.Any {
	mask := uint32Bytes(^uint32(0) << (32 - p.Bits()))
	if p.Bits() == 0 {
		mask = uint32Bytes(0)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// ipDaddrIs matches an IPv4 packet's destination address. The protocol check lets
// nft print it as "ip daddr" and keeps the offset from being read in other packets.
func ipDaddrIs(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipDaddrOffset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

// ipDaddrInSet matches an IPv4 packet's destination address against a named set.
func ipDaddrInSet(set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipDaddrOffset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

// l4DportIs matches a TCP or UDP destination port.
func l4DportIs(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func ctEstablishedOrRelated() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func namedCounter(name string) []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}}
}

func verdict(kind expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind}}
}
