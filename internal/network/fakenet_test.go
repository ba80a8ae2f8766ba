package network

import (
	"crypto/rand"
	"io"
	"math/big"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// fakeInternet is a network namespace standing in for the world outside the host,
// reached from the root netns through a veth. The host routes only the few /32s the
// test uses into it, so nothing a test sends can leave the machine, whatever the
// firewall does.
type fakeInternet struct {
	netnsPath string
	uplink    string     // the host end of the veth: the pool's uplink
	hostAddr  netip.Addr // the host end's address, which masquerade puts on packets
	web1      netip.Addr // in 198.51.100.0/24 (TEST-NET-2)
	web2      netip.Addr // in 203.0.113.0/24 (TEST-NET-3)
	resolver  netip.Addr // a DNS server in a private range, 172.31.0.0/16
	metadata  netip.Addr // 169.254.169.254, the cloud metadata address
}

func randByte(t *testing.T, lo, hi int64) byte {
	n, err := rand.Int(rand.Reader, big.NewInt(hi-lo+1))
	if err != nil {
		t.Fatal(err)
	}
	return byte(lo + n.Int64())
}

// newFakeInternet builds the namespace, its veth and the host routes into it, and
// removes them all when the test ends. prefix keeps its names apart from other
// tests; they never start with it, so the pool does not take them for its own.
func newFakeInternet(t *testing.T, prefix string) *fakeInternet {
	t.Helper()
	requireRoot(t)
	link := randByte(t, 0, 255)
	f := &fakeInternet{
		netnsPath: netnsDir + "/x" + prefix + "-inet",
		uplink:    "x" + prefix + "u",
		hostAddr:  netip.AddrFrom4([4]byte{198, 18, link, 1}),
		// Above the fake hosts of the integration tests (.10-.59) and of
		// e2e (.100-.139), which may run beside these.
		web1:     netip.AddrFrom4([4]byte{198, 51, 100, randByte(t, 200, 254)}),
		web2:     netip.AddrFrom4([4]byte{203, 0, 113, randByte(t, 1, 254)}),
		resolver: netip.AddrFrom4([4]byte{172, 31, randByte(t, 0, 255), randByte(t, 1, 254)}),
		metadata: netip.MustParseAddr("169.254.169.254"),
	}
	peer := netip.AddrFrom4([4]byte{198, 18, link, 2})

	if err := prepareNetnsDir(); err != nil {
		t.Fatal(err)
	}
	if err := createNamedNetns(f.netnsPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteLinkByName(f.uplink); err != nil {
			t.Error(err)
		}
		if err := deleteNamedNetns(f.netnsPath); err != nil {
			t.Error(err)
		}
	})
	ns, err := netns.GetFromPath(f.netnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: f.uplink}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(f.uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(host, prefixAddr(f.hostAddr, 30)); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}

	h := netlinkIn(t, f.netnsPath)
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*netlink.Addr{prefixAddr(peer, 30), prefixAddr(f.web1, 32), prefixAddr(f.web2, 32),
		prefixAddr(f.resolver, 32), prefixAddr(f.metadata, 32)} {
		if err := h.AddrAdd(eth, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	waitOperUp(t, &Slot{NetnsPath: f.netnsPath, HostVeth: f.uplink})
	// Replies go back to the host end; nothing else is routed out of here.
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(f.hostAddr.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []netip.Addr{f.web1, f.web2, f.resolver, f.metadata} {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixAddr(dst, 32).IPNet, Gw: net.IP(peer.AsSlice())}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("route %s into the fake internet: %v", dst, err)
		}
		// Deleted with the veth; deleting here too covers a failure in between.
		t.Cleanup(func() { netlink.RouteDel(r) })
	}
	return f
}

// waitOperUp waits until both ends of s's veth are operationally up. Until the
// kernel's link watcher has run (it may wait up to a second), a new veth drops what
// it is given, and a test's first connection would time out.
func waitOperUp(t *testing.T, s *Slot) {
	t.Helper()
	h := netlinkIn(t, s.NetnsPath)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		host, err := netlink.LinkByName(s.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		eth, err := h.LinkByName(sandboxIface)
		if err != nil {
			t.Fatal(err)
		}
		if host.Attrs().OperState == netlink.OperUp && eth.Attrs().OperState == netlink.OperUp {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("veth of slot %d not up", s.Index)
}

func prefixAddr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}}
}

// peerLog records the source addresses a test server saw.
type peerLog struct {
	mu    sync.Mutex
	peers []netip.Addr
}

func (l *peerLog) add(a net.Addr) {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = append(l.peers, ap.Addr())
}

func (l *peerLog) all() []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]netip.Addr(nil), l.peers...)
}

// listenInLogged is listenIn on a fixed port (0 for any) recording each client's
// address.
func listenInLogged(t *testing.T, path string, addr netip.Addr, port uint16, log *peerLog) net.Listener {
	t.Helper()
	var ln net.Listener
	err := inNetns(path, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			log.add(c.RemoteAddr())
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	return ln
}

// serveUDPEcho answers each datagram on addr:port inside the netns at path with the
// same bytes.
func serveUDPEcho(t *testing.T, path string, addr netip.Addr, port uint16) {
	t.Helper()
	var pc net.PacketConn
	err := inNetns(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(addr, port).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// udpEcho sends a datagram to addr from inside the netns at path and waits for the
// echo.
func udpEcho(path string, addr netip.AddrPort) error {
	return inNetns(path, func() error {
		c, err := net.Dial("udp", addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("aenv")); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(blockedTimeout))
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:n]) != "aenv" {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
}
