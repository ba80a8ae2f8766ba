package network

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A slot's policy in the pool's table, for slot 3 with the default policy and one
// resolver R:
//
//	set allow-3 { type ipv4_addr; flags interval }
//	set deny-3 { type ipv4_addr; flags interval }
//	counter tx-3 {}
//	counter rx-3 {}
//	chain egress-3 {
//		counter name "tx-3"
//		ct state established,related accept
//		meta nfproto != ipv4 drop
//		ip daddr R udp dport 53 accept
//		ip daddr R tcp dport 53 accept
//		ip daddr @fixed-deny drop
//		ip daddr @allow-3 accept
//		ip daddr @deny-3 drop
//		accept
//	}
//	chain ingress-3 {
//		counter name "rx-3"
//		ct state established,related accept
//		drop
//	}
//	chain nat-3 {
//		ip daddr @allow-3 return    (a policy with host names, and an egress gateway)
//		jump proxy
//	}
//
// plus the slot's host veth in the slot-egress, slot-ingress and slot-nat maps. SetPolicy
// rewrites all of it in one transaction; the counters keep counting across it.
// The resolver rules are the policy evaluated at compile time on each resolver, so a
// resolver in a denied private range answers as long as the sandbox's own policy
// allows it, and only on port 53.

func egressChainName(i int) string  { return "egress-" + strconv.Itoa(i) }
func ingressChainName(i int) string { return "ingress-" + strconv.Itoa(i) }
func allowSetName(i int) string     { return "allow-" + strconv.Itoa(i) }
func denySetName(i int) string      { return "deny-" + strconv.Itoa(i) }
func txCounterName(i int) string    { return "tx-" + strconv.Itoa(i) }
func rxCounterName(i int) string    { return "rx-" + strconv.Itoa(i) }
func natChainName(i int) string     { return "nat-" + strconv.Itoa(i) }

// slotIndexFromObjectName returns the slot a per-slot chain, set or counter name
// belongs to.
func slotIndexFromObjectName(name string) (int, bool) {
	for _, kind := range []string{"egress-", "ingress-", "allow-", "deny-", "tx-", "rx-", "nat-"} {
		if rest, ok := strings.CutPrefix(name, kind); ok {
			i, err := strconv.Atoi(rest)
			if err != nil || i < 0 || strconv.Itoa(i) != rest {
				return 0, false
			}
			return i, true
		}
	}
	return 0, false
}

// compiledPolicy is a Policy reduced to what the slot's nftables objects hold.
type compiledPolicy struct {
	allow, deny []addrRange
	dns         []netip.Addr // resolvers the policy lets the sandbox query on port 53
	internet    bool         // the verdict for everything else
	// proxy: TCP connections that allow does not cover go to the egress
	// gateway, which judges them by name.
	proxy bool
	// proxyAll: every TCP connection goes to the gateway (it dials them
	// through an upstream proxy).
	proxyAll bool
}

func compilePolicy(pol Policy, dnsServers []netip.Addr) compiledPolicy {
	c := compiledPolicy{
		allow:    mergePrefixes(pol.AllowOut),
		deny:     mergePrefixes(pol.DenyOut),
		internet: pol.AllowInternet,
		proxy:    len(pol.AllowNames) > 0 || pol.Upstream != nil || len(pol.Rules) > 0,
		// Rules apply to hosts the CIDR lists allow too: the gateway sees
		// all of the sandbox's TCP, and intercepts only TLS to their hosts.
		proxyAll: pol.Upstream != nil || len(pol.Rules) > 0,
	}
	for _, r := range dnsServers {
		if pol.Allows(r) {
			c.dns = append(c.dns, r)
		}
	}
	return c
}

// slotObjects names one slot's nftables objects.
type slotObjects struct {
	egress, ingress, nat *nftables.Chain
	allow, deny          *nftables.Set
	tx, rx               *nftables.NamedObj
}

func slotObjectDefs(table *nftables.Table, i int) slotObjects {
	counter := func(name string) *nftables.NamedObj {
		return &nftables.NamedObj{Table: table, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}}
	}
	return slotObjects{
		egress:  &nftables.Chain{Name: egressChainName(i), Table: table},
		ingress: &nftables.Chain{Name: ingressChainName(i), Table: table},
		nat:     &nftables.Chain{Name: natChainName(i), Table: table},
		allow:   &nftables.Set{Table: table, Name: allowSetName(i), KeyType: nftables.TypeIPAddr, Interval: true},
		deny:    &nftables.Set{Table: table, Name: denySetName(i), KeyType: nftables.TypeIPAddr, Interval: true},
		tx:      counter(txCounterName(i)),
		rx:      counter(rxCounterName(i)),
	}
}

// egressRules are the rules of a slot's egress chain.
func egressRules(o slotObjects, c compiledPolicy) []*nftables.Rule {
	rules := []*nftables.Rule{
		rule(o.egress, namedCounter(o.tx.Name)),
		rule(o.egress, ctEstablishedOrRelated(), verdict(expr.VerdictAccept)),
		rule(o.egress, nfprotoIsNot(unix.NFPROTO_IPV4), verdict(expr.VerdictDrop)),
	}
	for _, r := range c.dns {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rules = append(rules, rule(o.egress, ipDaddrIs(r), l4DportIs(proto, 53), verdict(expr.VerdictAccept)))
		}
	}
	last := expr.VerdictDrop
	if c.internet {
		last = expr.VerdictAccept
	}
	return append(rules,
		rule(o.egress, ipDaddrInSet(fixedDenySet), verdict(expr.VerdictDrop)),
		rule(o.egress, ipDaddrInSet(o.allow.Name), verdict(expr.VerdictAccept)),
		rule(o.egress, ipDaddrInSet(o.deny.Name), verdict(expr.VerdictDrop)),
		rule(o.egress, verdict(last)),
	)
}

// natRules are the rules of a slot's nat chain, run on the first packet of each
// connection before routing.
func natRules(o slotObjects, c compiledPolicy) []*nftables.Rule {
	jump := rule(o.nat, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: proxyChain}})
	switch {
	case c.proxyAll:
		return []*nftables.Rule{jump}
	case c.proxy:
		return []*nftables.Rule{rule(o.nat, ipDaddrInSet(o.allow.Name), verdict(expr.VerdictReturn)), jump}
	}
	return nil
}

// ingressRules are the rules of a slot's ingress chain: only replies get in.
func ingressRules(o slotObjects) []*nftables.Rule {
	return []*nftables.Rule{
		rule(o.ingress, namedCounter(o.rx.Name)),
		rule(o.ingress, ctEstablishedOrRelated(), verdict(expr.VerdictAccept)),
		rule(o.ingress, verdict(expr.VerdictDrop)),
	}
}

// dispatchElement maps the slot's host veth to a jump into chain.
func dispatchElement(cfg Config, i int, chain string) nftables.SetElement {
	key := make([]byte, unix.IFNAMSIZ) // the kernel compares the NUL-padded name
	copy(key, cfg.hostVethName(i))
	return nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// addSlotDispatchInBatch points the slot maps at the slot's chains.
func addSlotDispatchInBatch(conn *nftables.Conn, cfg Config, i int) error {
	table := firewallTable(cfg.Prefix)
	egressMap, ingressMap := slotMapDefs(table)
	if err := conn.SetAddElements(egressMap, []nftables.SetElement{dispatchElement(cfg, i, egressChainName(i))}); err != nil {
		return err
	}
	if err := conn.SetAddElements(ingressMap, []nftables.SetElement{dispatchElement(cfg, i, ingressChainName(i))}); err != nil {
		return err
	}
	return conn.SetAddElements(slotNatMapDef(table), []nftables.SetElement{dispatchElement(cfg, i, natChainName(i))})
}

// applySlotPolicy installs or replaces slot i's policy in one transaction.
func applySlotPolicy(cfg Config, i int, c compiledPolicy) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("apply policy of slot %d: %w", i, err)
	}
	o := slotObjectDefs(firewallTable(cfg.Prefix), i)
	for _, set := range []struct {
		set    *nftables.Set
		ranges []addrRange
	}{{o.allow, c.allow}, {o.deny, c.deny}} {
		if err := conn.AddSet(set.set, nil); err != nil {
			return fmt.Errorf("apply policy of slot %d: %w", i, err)
		}
		conn.FlushSet(set.set)
		if err := conn.SetAddElements(set.set, intervalElements(set.ranges)); err != nil {
			return fmt.Errorf("apply policy of slot %d: %w", i, err)
		}
	}
	// Adding a counter that exists leaves it (and its count) as it is.
	conn.AddObj(o.tx)
	conn.AddObj(o.rx)
	if c.proxy && cfg.Egress == nil {
		return fmt.Errorf("apply policy of slot %d: host names need the egress gateway, which this pool has not", i)
	}
	for _, ch := range []*nftables.Chain{o.egress, o.ingress, o.nat} {
		conn.AddChain(ch)
		conn.FlushChain(ch)
	}
	rules := append(egressRules(o, c), ingressRules(o)...)
	for _, r := range append(rules, natRules(o, c)...) {
		conn.AddRule(r)
	}
	if err := addSlotDispatchInBatch(conn, cfg, i); err != nil {
		return fmt.Errorf("apply policy of slot %d: %w", i, err)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("apply policy of slot %d: %w", i, err)
	}
	return nil
}

// removeSlotPolicy deletes slot i's policy objects in one transaction; the slot then
// sends nothing. Missing objects are not an error: each is created before it is
// deleted, which is a no-op for those that exist.
func removeSlotPolicy(cfg Config, i int) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("remove policy of slot %d: %w", i, err)
	}
	table := firewallTable(cfg.Prefix)
	o := slotObjectDefs(table, i)
	for _, s := range []*nftables.Set{o.allow, o.deny} {
		if err := conn.AddSet(s, nil); err != nil {
			return fmt.Errorf("remove policy of slot %d: %w", i, err)
		}
	}
	conn.AddObj(o.tx)
	conn.AddObj(o.rx)
	conn.AddChain(o.egress)
	conn.AddChain(o.ingress)
	conn.AddChain(o.nat)
	if err := addSlotDispatchInBatch(conn, cfg, i); err != nil {
		return fmt.Errorf("remove policy of slot %d: %w", i, err)
	}
	egressMap, ingressMap := slotMapDefs(table)
	for _, d := range []struct {
		m     *nftables.Set
		chain string
	}{{egressMap, egressChainName(i)}, {ingressMap, ingressChainName(i)}, {slotNatMapDef(table), natChainName(i)}} {
		if err := conn.SetDeleteElements(d.m, []nftables.SetElement{dispatchElement(cfg, i, d.chain)}); err != nil {
			return fmt.Errorf("remove policy of slot %d: %w", i, err)
		}
	}
	for _, ch := range []*nftables.Chain{o.egress, o.ingress, o.nat} {
		conn.FlushChain(ch)
		conn.DelChain(ch)
	}
	conn.DelSet(o.allow)
	conn.DelSet(o.deny)
	conn.DeleteObject(o.tx)
	conn.DeleteObject(o.rx)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("remove policy of slot %d: %w", i, err)
	}
	return nil
}

// Traffic is a slot's byte counts.
type Traffic struct {
	RxBytes, TxBytes uint64
}

// readCounters returns the byte counters of every slot that has them. One dump
// serves all slots: the library cannot tell a missing object from other errors.
func readCounters(cfg Config) (map[int]Traffic, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	objs, err := conn.GetNamedObjects(firewallTable(cfg.Prefix))
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	out := map[int]Traffic{}
	for _, o := range objs {
		named, ok := o.(*nftables.NamedObj)
		if !ok || named.Type != nftables.ObjTypeCounter {
			continue
		}
		c, ok := named.Obj.(*expr.Counter)
		i, isSlot := slotIndexFromObjectName(named.Name)
		if !ok || !isSlot {
			continue
		}
		tr := out[i]
		switch named.Name {
		case rxCounterName(i):
			tr.RxBytes = c.Bytes
		case txCounterName(i):
			tr.TxBytes = c.Bytes
		}
		out[i] = tr
	}
	return out, nil
}

// SetPolicy installs pol as the egress policy of the in-use slot index, replacing any
// earlier one in one nftables transaction. New connections follow it at once;
// established ones are left alone. It is idempotent: call it again after a server
// restart (Start keeps the rules, but only the caller stores the policy). A slot
// sends nothing until its first SetPolicy.
func (p *Pool) SetPolicy(ctx context.Context, index int, pol Policy) error {
	p.policyMu.Lock()
	defer p.policyMu.Unlock()
	if err := p.checkInUse(index); err != nil {
		return fmt.Errorf("set network policy of slot %d: %w", index, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set network policy of slot %d: %w", index, err)
	}
	for _, pfx := range append(append([]netip.Prefix(nil), pol.AllowOut...), pol.DenyOut...) {
		if !pfx.IsValid() || !pfx.Addr().Is4() {
			return fmt.Errorf("set network policy of slot %d: %s: want an IPv4 prefix", index, pfx)
		}
	}
	for _, name := range pol.AllowNames {
		if n, err := ParseHostPattern(name); err != nil || n != name {
			return fmt.Errorf("set network policy of slot %d: host name %q: want one ParseHostPattern returns", index, name)
		}
	}
	compiled := compilePolicy(pol, p.dnsServers())
	if p.cfg.ProxyAllTCP {
		compiled.proxy, compiled.proxyAll = true, true
	}
	// The gateway learns the policy first: a connection the new rules send it
	// finds it there.
	undo := func() {}
	if p.cfg.Egress != nil {
		undo = p.cfg.Egress.SetSlot(index, p.cfg.slot(index).SandboxIP, pol, len(compiled.dns) > 0)
	}
	if err := applySlotPolicy(p.cfg, index, compiled); err != nil {
		undo()
		return fmt.Errorf("set network policy: %w", err)
	}
	p.logger.DebugContext(ctx, "set network policy", "slot", index, "policy", pol.String())
	return nil
}

// Counters returns the bytes the in-use slot index received and sent through the
// host's forward path (the outside world, not the host itself: envd and proxied port
// traffic are not counted) since its policy was first set.
func (p *Pool) Counters(ctx context.Context, index int) (rxBytes, txBytes uint64, err error) {
	if err := p.checkInUse(index); err != nil {
		return 0, 0, fmt.Errorf("network counters of slot %d: %w", index, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("network counters of slot %d: %w", index, err)
	}
	all, err := readCounters(p.cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("network counters of slot %d: %w", index, err)
	}
	return all[index].RxBytes, all[index].TxBytes, nil
}

// AllCounters returns the counters of every in-use slot, by index, in one read of
// the kernel's tables: the call for a metrics scrape.
func (p *Pool) AllCounters(ctx context.Context) (map[int]Traffic, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("network counters: %w", err)
	}
	all, err := readCounters(p.cfg)
	if err != nil {
		return nil, fmt.Errorf("network counters: %w", err)
	}
	inUse := p.indicesIn(stateInUse)
	out := make(map[int]Traffic, len(inUse))
	for _, i := range inUse {
		out[i] = all[i]
	}
	return out, nil
}

// DNSServers returns the resolvers sandboxes may query; a sandbox's /etc/resolv.conf
// should list these. Valid after Start.
func (p *Pool) DNSServers() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]netip.Addr(nil), p.dns...)
}

func (p *Pool) dnsServers() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dns
}

func (p *Pool) checkInUse(index int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if st, ok := p.state[index]; !ok || st != stateInUse {
		return fmt.Errorf("slot not in use")
	}
	return nil
}
