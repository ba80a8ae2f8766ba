package network

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// addrRange is an inclusive range of IPv4 addresses, as uint32s.
type addrRange struct {
	first, last uint32
}

// mergePrefixes turns IPv4 prefixes into sorted, non-overlapping, non-adjacent ranges.
// nftables interval sets reject overlapping elements, and user lists overlap freely
// ("0.0.0.0/0" next to "10.0.0.0/8"). IPv6 prefixes are skipped.
func mergePrefixes(prefixes []netip.Prefix) []addrRange {
	var rs []addrRange
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		first := addrToUint32(p.Addr())
		size := uint64(1) << (32 - p.Bits())
		rs = append(rs, addrRange{first: first, last: uint32(uint64(first) + size - 1)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 && uint64(r.first) <= uint64(out[n-1].last)+1 {
			out[n-1].last = max(out[n-1].last, r.last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// intervalElements encodes ranges for an nftables interval set: each range is a start
// element and an end element one past its last address. A range reaching
// 255.255.255.255 has no end element; the kernel treats it as open to the top, as
// nft itself does for 0.0.0.0/0.
func intervalElements(rs []addrRange) []nftables.SetElement {
	var els []nftables.SetElement
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: uint32Bytes(r.first)})
		if r.last != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: uint32Bytes(r.last + 1), IntervalEnd: true})
		}
	}
	return els
}

func addrToUint32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// uint32Bytes is the address in network byte order, as nftables compares it.
func uint32Bytes(n uint32) []byte {
	return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}
