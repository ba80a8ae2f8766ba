package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctnetlink attributes the netlink package does not name (the kernel's
// include/uapi/linux/netfilter/nfnetlink_conntrack.h), and the filter's
// flags (net/netfilter/nf_internals.h: CTA_FILTER_FLAG_*).
const (
	ctaFilter          = 25 // CTA_FILTER
	ctaFilterOrigFlags = 1  // CTA_FILTER_ORIG_FLAGS
	ctaFilterFlagIPSrc = 1 << 0
	ctaFilterFlagIPDst = 1 << 1
)

// deleteFlowsOf deletes the host's conntrack flows whose original source
// or destination is ip, so that the next sandbox on the address starts
// clean.
//
// The kernel does the filtering where it can: since Linux 6.12 a delete
// that carries CTA_FILTER walks the table in the kernel and deletes only
// what matches, which costs a tenth of dumping the whole host's table to
// this process (35 against 364 ms per release among 50,000 flows,
// BenchmarkDeleteFlowsOf). Older kernels
// refuse that request (they read it as a delete of one exact flow, and
// the tuple is partial: EINVAL) without deleting anything; the flows are
// then found by a dump, as before.
func deleteFlowsOf(ip netip.Addr) error {
	err := deleteFlowsInKernel(ip, ctaFilterFlagIPSrc)
	if err == nil {
		err = deleteFlowsInKernel(ip, ctaFilterFlagIPDst)
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	return deleteFlowsByDump(ip)
}

// deleteFlowsInKernel sends one filtered delete: the flows whose original
// source (ctaFilterFlagIPSrc) or destination (ctaFilterFlagIPDst) is ip.
// The kernel answers 0 whether or not any matched.
func deleteFlowsInKernel(ip netip.Addr, flag uint32) error {
	if !ip.Is4() {
		return fmt.Errorf("conntrack filter: %s is not IPv4", ip)
	}
	var addr int
	switch flag {
	case ctaFilterFlagIPSrc:
		addr = nl.CTA_IP_V4_SRC
	case ctaFilterFlagIPDst:
		addr = nl.CTA_IP_V4_DST
	default:
		// Never send another: a filter of no address flag would match
		// every IPv4 flow of the host, and the kernel would delete them.
		return fmt.Errorf("conntrack filter: flag %#x is not one address", flag)
	}
	req := nl.NewNetlinkRequest((int(netlink.ConntrackTable)<<8)|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	tuple := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	tupleIP := tuple.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	tupleIP.AddRtAttr(addr, ip.AsSlice())
	filter := nl.NewRtAttr(unix.NLA_F_NESTED|ctaFilter, nil)
	filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(flag))
	req.AddData(tuple)
	req.AddData(filter)
	if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil {
		return fmt.Errorf("delete conntrack flows of %s in the kernel: %w", ip, err)
	}
	return nil
}

// deleteFlowsByDump deletes ip's flows by reading the whole table: the
// way for kernels before 6.12.
func deleteFlowsByDump(ip netip.Addr) error {
	var bySrc, byDst netlink.ConntrackFilter
	if err := bySrc.AddIP(netlink.ConntrackOrigSrcIP, net.IP(ip.AsSlice())); err != nil {
		return err
	}
	if err := byDst.AddIP(netlink.ConntrackOrigDstIP, net.IP(ip.AsSlice())); err != nil {
		return err
	}
	_, err := retryDump(func() (uint, error) {
		return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, &bySrc, &byDst)
	})
	// Flushing flows is hygiene (a reused address must not inherit them);
	// a dump still interrupted after retries is not worth failing for.
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("delete conntrack flows of %s: %w", ip, err)
	}
	return nil
}
