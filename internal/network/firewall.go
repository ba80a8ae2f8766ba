package network

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// The pool's nftables table (family inet, named after the prefix):
//
//	table inet <prefix> {
//		chain input {
//			type filter hook input priority filter; policy accept;
//			iifname "<prefix>*" ct state established,related accept
//			iifname "<prefix>*" drop
//		}
//		chain forward {
//			type filter hook forward priority filter; policy accept;
//			iifname "<prefix>*" jump sandbox-egress
//			oifname "<prefix>*" drop
//		}
//		chain sandbox-egress {
//			drop
//		}
//	}
//
// input: a sandbox may only answer connections the host opened; it cannot reach the
// server's API or any other host service. forward: nothing is routed out of or into a
// sandbox, which also keeps sandboxes apart. sandbox-egress is where per-slot egress
// policy (a verdict map keyed by iifname, or a chain per slot) goes once sandboxes get
// a way out; today it drops everything.
const (
	inputChain   = "input"
	forwardChain = "forward"
	egressChain  = "sandbox-egress"
)

// firewallTable is the pool's table; it exists only as a name for nftables calls.
func firewallTable(prefix string) *nftables.Table {
	return &nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}
}

// installFirewall replaces the pool's table with a fresh one in one atomic batch.
func installFirewall(prefix string) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("install firewall: %w", err)
	}
	table := firewallTable(prefix)
	deleteTableInBatch(conn, table)
	conn.AddTable(table)
	chains, rules := firewallRules(table, prefix)
	for _, c := range chains {
		conn.AddChain(c)
	}
	for _, r := range rules {
		conn.AddRule(r)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install firewall table inet %s: %w", prefix, err)
	}
	return nil
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

// firewallRules returns the chains and rules of the pool's table.
func firewallRules(table *nftables.Table, prefix string) ([]*nftables.Chain, []*nftables.Rule) {
	accept := nftables.ChainPolicyAccept
	input := &nftables.Chain{Name: inputChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	forward := &nftables.Chain{Name: forwardChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	egress := &nftables.Chain{Name: egressChain, Table: table}
	return []*nftables.Chain{input, forward, egress}, []*nftables.Rule{
		rule(input, ifnamePrefix(expr.MetaKeyIIFNAME, prefix), ctEstablishedOrRelated(), verdict(expr.VerdictAccept)),
		rule(input, ifnamePrefix(expr.MetaKeyIIFNAME, prefix), verdict(expr.VerdictDrop)),
		rule(forward, ifnamePrefix(expr.MetaKeyIIFNAME, prefix), jump(egressChain)),
		rule(forward, ifnamePrefix(expr.MetaKeyOIFNAME, prefix), verdict(expr.VerdictDrop)),
		rule(egress, verdict(expr.VerdictDrop)),
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

func ctEstablishedOrRelated() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func verdict(kind expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind}}
}

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}
