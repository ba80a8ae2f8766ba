package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// egressEnv is a pool whose uplink is a fake internet, one slot under test, another
// slot standing for a neighbour sandbox, and a server at each kind of destination.
type egressEnv struct {
	pool    *Pool
	inet    *fakeInternet
	slot    *Slot
	other   *Slot
	peers   *peerLog // clients the fake internet's servers saw
	targets map[string]func(ctx context.Context) error
}

// Destinations, by name in egressEnv.targets.
const (
	toWeb1        = "web1"
	toWeb2        = "web2"
	toDNSUDP      = "resolver udp/53"
	toDNSTCP      = "resolver tcp/53"
	toResolverWeb = "resolver other port"
	toMetadata    = "169.254.169.254"
	toSlotHost    = "slot host address"
	toUplinkHost  = "host uplink address"
	toOtherSlot   = "other sandbox"
)

func newEgressEnv(t *testing.T) *egressEnv {
	t.Helper()
	requireRoot(t)
	cfg := testConfig(t, 24, 0)
	inet := newFakeInternet(t, cfg.Prefix)
	cfg.Uplinks = []string{inet.uplink}
	cfg.DNSServers = []netip.Addr{inet.resolver}
	p := startTestPool(t, cfg, nil)
	ctx := t.Context()
	slot, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOperUp(t, slot)
	waitOperUp(t, other)
	// The neighbour may reach everything: only the fixed list keeps the slot under
	// test away from it.
	if err := p.SetPolicy(ctx, other.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}

	e := &egressEnv{pool: p, inet: inet, slot: slot, other: other, peers: &peerLog{}}
	inInet := func(a netip.Addr, port uint16) net.Addr {
		return listenInLogged(t, inet.netnsPath, a, port, e.peers).Addr()
	}
	dial := func(addr net.Addr) func(ctx context.Context) error {
		return func(ctx context.Context) error { return hello(ctx, slot.NetnsPath, addr) }
	}
	serveUDPEcho(t, inet.netnsPath, inet.resolver, 53)
	e.targets = map[string]func(context.Context) error{
		toWeb1:        dial(inInet(inet.web1, 0)),
		toWeb2:        dial(inInet(inet.web2, 0)),
		toDNSTCP:      dial(inInet(inet.resolver, 53)),
		toResolverWeb: dial(inInet(inet.resolver, 0)),
		toMetadata:    dial(inInet(inet.metadata, 80)),
		toSlotHost:    dial(listenHost(t, slot.HostIP).Addr()),
		toUplinkHost:  dial(listenHost(t, inet.hostAddr).Addr()),
		toOtherSlot:   dial(listenIn(t, other.NetnsPath, other.SandboxIP).Addr()),
		toDNSUDP: func(context.Context) error {
			return udpEcho(slot.NetnsPath, netip.AddrPortFrom(inet.resolver, 53))
		},
	}
	return e
}

// reachable tries every destination at once and returns the names of those that
// answered, sorted.
func (e *egressEnv) reachable(ctx context.Context) []string {
	var mu sync.Mutex
	var ok []string
	var wg sync.WaitGroup
	for name, try := range e.targets {
		wg.Go(func() {
			if try(ctx) == nil {
				mu.Lock()
				ok = append(ok, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Strings(ok)
	return ok
}

func sorted(names ...string) []string {
	out := slices.Clone(names)
	sort.Strings(out)
	return out
}

func mustPolicy(t *testing.T, allowInternet bool, allowOut, denyOut []string) Policy {
	t.Helper()
	pol, err := ParsePolicy(&allowInternet, allowOut, denyOut)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TestEgressPolicies applies each policy to one live slot in turn and checks which
// destinations answer; every change takes effect for the next connection.
func TestEgressPolicies(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	web1, web2 := e.inet.web1.String(), e.inet.web2.String()
	fixedList := []string{e.slot.HostIP.String(), e.other.SandboxIP.String(), "169.254.169.254",
		e.inet.hostAddr.String(), e.inet.resolver.String() + "/32"}
	privateRanges := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}

	internet := []string{toWeb1, toWeb2, toDNSUDP, toDNSTCP}
	tests := []struct {
		name string
		pol  Policy
		want []string
	}{
		{"default", DefaultPolicy(), internet},
		{"internet off", mustPolicy(t, false, nil, nil), nil},
		{"deny one /32", mustPolicy(t, true, nil, []string{web1}), []string{toWeb2, toDNSUDP, toDNSTCP}},
		{"internet off, allow one /32", mustPolicy(t, false, []string{web2 + "/32"}, nil), []string{toWeb2}},
		{"allowOut cannot open the fixed list", mustPolicy(t, false, fixedList, nil), []string{toDNSUDP, toDNSTCP}},
		{"allowOut 0.0.0.0/0 cannot open the fixed list", mustPolicy(t, false, []string{"0.0.0.0/0"}, nil), internet},
		{"deny all, allow one (E2B example)", mustPolicy(t, false, []string{web1}, []string{"0.0.0.0/0"}), []string{toWeb1}},
		{"seed high_security", mustPolicy(t, false, nil, []string{"0.0.0.0/0"}), nil},
		{"seed coding_agent", mustPolicy(t, true, []string{"0.0.0.0/0"}, privateRanges), internet},
		{"seed web_agent", mustPolicy(t, true, []string{"0.0.0.0/0"}, privateRanges[:3]), internet},
		{"deny the resolver", mustPolicy(t, true, nil, []string{"172.16.0.0/12"}), []string{toWeb1, toWeb2}},
		{"back to default", DefaultPolicy(), internet},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := e.pool.SetPolicy(ctx, e.slot.Index, tt.pol); err != nil {
				t.Fatal(err)
			}
			if got, want := e.reachable(ctx), sorted(tt.want...); !slices.Equal(got, want) {
				t.Errorf("policy %s: reachable %v, want %v", tt.pol, got, want)
			}
		})
	}

	// Masquerade: the fake internet saw only the host's uplink address.
	peers := e.peers.all()
	if len(peers) == 0 {
		t.Fatal("the fake internet saw no client")
	}
	for _, a := range peers {
		if a != e.inet.hostAddr {
			t.Errorf("fake internet saw client %s, want the host's %s", a, e.inet.hostAddr)
		}
	}
}

// TestSetPolicyKeepsEstablished: a policy change cuts new connections at once and
// leaves open ones alone.
func TestSetPolicyKeepsEstablished(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	if err := e.pool.SetPolicy(ctx, e.slot.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	ln := listenEchoIn(t, e.inet.netnsPath, e.inet.web1)
	var c net.Conn
	err := inNetns(e.slot.NetnsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", ln.String(), time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c, "before"); err != nil {
		t.Fatal(err)
	}

	if err := e.pool.SetPolicy(ctx, e.slot.Index, mustPolicy(t, false, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if err := e.targets[toWeb1](ctx); err == nil {
		t.Error("new connection succeeded after internet was turned off")
	}
	if err := echoOnce(c, "after"); err != nil {
		t.Errorf("established connection broke on a policy change: %v", err)
	}
}

// listenEchoIn serves an echo on addr inside the netns at path.
func listenEchoIn(t *testing.T, path string, addr netip.Addr) net.Addr {
	t.Helper()
	var ln net.Listener
	if err := inNetns(path, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1<<16)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr()
}

func echoOnce(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return nil
}

func TestCounters(t *testing.T) {
	e := newEgressEnv(t)
	ctx := t.Context()
	if err := e.pool.SetPolicy(ctx, e.slot.Index, DefaultPolicy()); err != nil {
		t.Fatal(err)
	}
	rx0, tx0, err := e.pool.Counters(ctx, e.slot.Index)
	if err != nil {
		t.Fatal(err)
	}
	ln := listenEchoIn(t, e.inet.netnsPath, e.inet.web2)
	const size = 200 << 10
	err = inNetns(e.slot.NetnsPath, func() error {
		c, err := net.DialTimeout("tcp", ln.String(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		return echoOnce(c, strings.Repeat("x", size))
	})
	if err != nil {
		t.Fatal(err)
	}
	rx, tx, err := e.pool.Counters(ctx, e.slot.Index)
	if err != nil {
		t.Fatal(err)
	}
	if rx-rx0 < size || tx-tx0 < size {
		t.Errorf("counters grew by rx %d, tx %d; want at least %d each", rx-rx0, tx-tx0, size)
	}
	// A policy change keeps the counts.
	if err := e.pool.SetPolicy(ctx, e.slot.Index, mustPolicy(t, false, nil, nil)); err != nil {
		t.Fatal(err)
	}
	rx2, tx2, err := e.pool.Counters(ctx, e.slot.Index)
	if err != nil {
		t.Fatal(err)
	}
	if rx2 < rx || tx2 < tx {
		t.Errorf("counters after SetPolicy rx %d, tx %d; were %d, %d", rx2, tx2, rx, tx)
	}
	if _, _, err := e.pool.Counters(ctx, 200); err == nil {
		t.Error("Counters of a slot not in use succeeded")
	}
}
