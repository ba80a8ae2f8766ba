package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// blockedTimeout is how long a connection attempt the firewall drops is given; a
// dropped SYN gets no answer, so the attempt ends by timing out.
const blockedTimeout = 500 * time.Millisecond

// serveHello accepts connections on ln, writes "hello" on each and closes it.
func serveHello(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
}

// listenHost listens on addr:0 in the root netns.
func listenHost(t *testing.T, addr netip.Addr) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	serveHello(t, ln)
	return ln
}

// listenIn listens on addr:0 inside the netns at path.
func listenIn(t *testing.T, path string, addr netip.Addr) net.Listener {
	t.Helper()
	var ln net.Listener
	err := inNetns(path, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	serveHello(t, ln)
	return ln
}

// hello connects to addr (from inside the netns at path, or the root netns if path
// is empty) and reads the greeting.
func hello(ctx context.Context, path string, addr net.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, blockedTimeout)
	defer cancel()
	dial := func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(blockedTimeout))
		got, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if string(got) != "hello" {
			return fmt.Errorf("read %q, want %q", got, "hello")
		}
		return nil
	}
	if path == "" {
		return dial()
	}
	return inNetns(path, dial)
}

// ping sends one ICMP echo to dst (from inside the netns at path, or the root netns if
// path is empty) and waits for the reply.
func ping(path string, dst netip.Addr) error {
	send := func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		id := os.Getpid() & 0xffff
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("aenv")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: net.IP(dst.AsSlice())}); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(blockedTimeout))
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			reply, err := icmp.ParseMessage(1, buf[:n]) // 1: ICMP for IPv4
			if err != nil {
				return err
			}
			echo, ok := reply.Body.(*icmp.Echo)
			if reply.Type == ipv4.ICMPTypeEchoReply && ok && echo.ID == id && from.String() == dst.String() {
				return nil
			}
		}
	}
	if path == "" {
		return send()
	}
	return inNetns(path, send)
}

// withoutFirewall runs fn with the pool's table removed: the control showing that the
// firewall, not something else, is what blocks.
func withoutFirewall(t *testing.T, p *Pool, fn func()) {
	t.Helper()
	if err := removeFirewall(p.cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := p.setUpHost(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
}

// hostAddr returns a global IPv4 address of the root netns outside the pool's CIDR,
// standing for the server's API address.
func hostAddr(t *testing.T, p *Pool) netip.Addr {
	t.Helper()
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap().IsGlobalUnicast() && !p.cfg.CIDR.Contains(ip.Unmap()) {
			return ip.Unmap()
		}
	}
	t.Fatal("no global IPv4 address on the host")
	return netip.Addr{}
}

func TestSandboxCannotOpenConnectionsToHost(t *testing.T) {
	p := newTestPool(t, 24, 0)
	ctx := t.Context()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		addr netip.Addr
	}{
		{"slot host address", s.HostIP},
		{"other host address", hostAddr(t, p)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln := listenHost(t, tt.addr)
			if err := hello(ctx, s.NetnsPath, ln.Addr()); err == nil {
				t.Errorf("sandbox connected to host %s", ln.Addr())
			}
			if err := ping(s.NetnsPath, tt.addr); err == nil {
				t.Errorf("sandbox pinged host %s", tt.addr)
			}
			withoutFirewall(t, p, func() {
				if err := hello(ctx, s.NetnsPath, ln.Addr()); err != nil {
					t.Errorf("control: without firewall, connect to %s: %v", ln.Addr(), err)
				}
				if err := ping(s.NetnsPath, tt.addr); err != nil {
					t.Errorf("control: without firewall, ping %s: %v", tt.addr, err)
				}
			})
		})
	}
}

func TestHostCanConnectToSandbox(t *testing.T) {
	p := newTestPool(t, 24, 0)
	ctx := t.Context()
	s, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenIn(t, s.NetnsPath, s.SandboxIP)
	if err := hello(ctx, "", ln.Addr()); err != nil {
		t.Errorf("host connect to sandbox %s: %v", ln.Addr(), err)
	}
	if err := ping("", s.SandboxIP); err != nil {
		t.Errorf("host ping sandbox %s: %v", s.SandboxIP, err)
	}
}

func TestSandboxesCannotReachEachOther(t *testing.T) {
	p := newTestPool(t, 24, 0)
	ctx := t.Context()
	a, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenIn(t, b.NetnsPath, b.SandboxIP)

	err = hello(ctx, a.NetnsPath, ln.Addr())
	if err == nil {
		t.Errorf("slot %d connected to slot %d", a.Index, b.Index)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Logf("slot %d to slot %d failed other than by timeout: %v", a.Index, b.Index, err)
	}
	if err := ping(a.NetnsPath, b.SandboxIP); err == nil {
		t.Errorf("slot %d pinged slot %d", a.Index, b.Index)
	}
	withoutFirewall(t, p, func() {
		if err := hello(ctx, a.NetnsPath, ln.Addr()); err != nil {
			t.Errorf("control: without firewall, slot %d to slot %d: %v", a.Index, b.Index, err)
		}
	})
}
