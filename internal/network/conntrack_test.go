package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// flowsFor adds n TCP flows from ip to a peer and n from a peer to ip, in
// 10.254.0.0/16 (no test or sandbox uses it), and removes what is left of
// them when the test ends.
func flowsFor(t testing.TB, ip netip.Addr, n int) {
	t.Helper()
	peer := func(i int) net.IP { return net.IPv4(10, 254, 200+byte((i>>8)%50), byte(i)).To4() }
	for i := range n {
		for _, out := range []bool{true, false} {
			src, dst := net.IP(ip.AsSlice()), peer(i)
			if !out {
				src, dst = dst, src
			}
			flow := netlink.ConntrackFlow{FamilyType: unix.AF_INET,
				Forward: netlink.IPTuple{SrcIP: src, DstIP: dst, Protocol: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: 80},
				Reverse: netlink.IPTuple{SrcIP: dst, DstIP: src, Protocol: unix.IPPROTO_TCP, SrcPort: 80, DstPort: 40000},
				TimeOut: 600, ProtoInfo: &netlink.ProtoInfoTCP{State: 3 /* established */}}
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, &flow); err != nil {
				t.Fatalf("add a flow of %s: %v", ip, err)
			}
		}
	}
	t.Cleanup(func() { deleteFlowsByDump(ip) })
}

// flowsOf counts the host's flows whose original source or destination is
// one of ips.
func flowsOf(t testing.TB, ips ...netip.Addr) map[netip.Addr]int {
	t.Helper()
	flows, err := retryDump(func() ([]*netlink.ConntrackFlow, error) {
		return netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]int{}
	for _, f := range flows {
		for _, end := range []net.IP{f.Forward.SrcIP, f.Forward.DstIP} {
			if a, ok := netip.AddrFromSlice(end.To4()); ok && slices.Contains(ips, a) {
				out[a]++
			}
		}
	}
	return out
}

// A released slot's flows go, in both directions, and no other address's:
// through the kernel's filter, and through the dump older kernels use.
func TestDeleteFlowsOf(t *testing.T) {
	requireRoot(t)
	// The kernel's filter alone (Linux 6.12 and later). An older kernel
	// must refuse it and delete nothing: deleteFlowsOf then dumps.
	inKernel := func(ip netip.Addr) error {
		err := deleteFlowsInKernel(ip, ctaFilterFlagIPSrc)
		if err == nil {
			err = deleteFlowsInKernel(ip, ctaFilterFlagIPDst)
		}
		return err
	}
	t.Run("kernel filter", func(t *testing.T) {
		gone, kept := netip.MustParseAddr("10.254.1.2"), netip.MustParseAddr("10.254.1.6")
		flowsFor(t, gone, 20)
		flowsFor(t, kept, 20)
		err := inKernel(gone)
		got := flowsOf(t, gone, kept)
		switch {
		case err == nil && (got[gone] != 0 || got[kept] != 40):
			t.Fatalf("flows after the kernel deleted %s's: %v, want none of it and 40 of %s", gone, got, kept)
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
			t.Logf("this kernel does not filter deletes (%v): releases dump the table", err)
			if got[gone] != 40 || got[kept] != 40 {
				t.Fatalf("a refused filtered delete deleted flows: %v, want 40 of each", got)
			}
		case err != nil:
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name   string
		delete func(netip.Addr) error
	}{
		{"kernel filter, else dump", deleteFlowsOf},
		{"dump", deleteFlowsByDump},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone, kept := netip.MustParseAddr("10.254.1.2"), netip.MustParseAddr("10.254.1.6")
			flowsFor(t, gone, 20)
			flowsFor(t, kept, 20)
			if got := flowsOf(t, gone, kept); got[gone] != 40 || got[kept] != 40 {
				t.Fatalf("flows before: %v, want 40 of each", got)
			}
			if err := tc.delete(gone); err != nil {
				t.Fatal(err)
			}
			if got := flowsOf(t, gone, kept); got[gone] != 0 || got[kept] != 40 {
				t.Fatalf("flows after deleting %s's: %v, want none of it and 40 of %s", gone, got, kept)
			}
		})
	}
}

// BenchmarkDeleteFlowsOf is one slot's release of its flows among 0,
// 10,000 and 50,000 flows of other addresses: in the kernel, and by
// dumping the table.
func BenchmarkDeleteFlowsOf(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ip := netip.MustParseAddr("10.254.3.2")
	added := 0
	for _, others := range []int{0, 10000, 50000} {
		for ; added < others; added += 2000 {
			flowsFor(b, netip.AddrFrom4([4]byte{10, 254, 2, byte(4*added/2000 + 2)}), 1000)
		}
		for _, bc := range []struct {
			name   string
			delete func(netip.Addr) error
		}{{"kernel", deleteFlowsOf}, {"dump", deleteFlowsByDump}} {
			b.Run(fmt.Sprintf("%d other flows, %s", others, bc.name), func(b *testing.B) {
				var took time.Duration
				for b.Loop() {
					b.StopTimer()
					flowsFor(b, ip, 10)
					b.StartTimer()
					start := time.Now()
					if err := bc.delete(ip); err != nil {
						b.Fatal(err)
					}
					took += time.Since(start)
				}
				b.ReportMetric(float64(took.Microseconds())/float64(b.N)/1000, "ms/release")
			})
		}
	}
}

// A slot's release forgets its sandbox's flows: the next sandbox on the
// address inherits none.
func TestReleaseForgetsFlows(t *testing.T) {
	p := newTestPool(t, 24, 0)
	s, err := p.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	flowsFor(t, s.SandboxIP, 5)
	if got := flowsOf(t, s.SandboxIP)[s.SandboxIP]; got != 10 {
		t.Fatalf("flows of %s before the release: %d, want 10", s.SandboxIP, got)
	}
	if err := p.Release(t.Context(), s.Index); err != nil {
		t.Fatal(err)
	}
	if got := flowsOf(t, s.SandboxIP)[s.SandboxIP]; got != 0 {
		t.Fatalf("flows of %s after the release: %d, want 0", s.SandboxIP, got)
	}
}
