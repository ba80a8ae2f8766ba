// Package egress is the node's egress gateway: one DNS server and one
// transparent TCP proxy for all the sandboxes of the node.
//
// The network pool (internal/network) sends every sandbox's DNS queries to
// the gateway's DNS port, and the TCP connections of a sandbox whose policy
// allows host names ("pypi.org", "*.github.com") to its proxy port, except
// those its CIDR lists allow anyway. The proxy reads the name the connection
// carries (the TLS ClientHello's SNI, the HTTP Host of every request) and
// lets it through only to a name the policy allows, dialling that name as
// the node resolves it, not the address the sandbox chose: a sandbox cannot
// reach another host by sending an allowed name to its address.
//
// The gateway knows sandboxes by their address: the pool tells it each
// slot's policy (network.Egress).
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/aenv-dev/aenv/internal/network"
)

// Config configures a Gateway.
type Config struct {
	// Upstreams are the resolvers the gateway asks (port 53): the node's
	// own. Empty: only HostsFile's names resolve.
	Upstreams []netip.Addr
	// HostsFile, if set, is a hosts file ("address name...", IPv4) whose
	// names the gateway answers itself, before asking the upstreams. It is
	// for tests: hosts made by a test get names.
	HostsFile string
	// DialTimeout bounds a connection to an upstream host (default 10 s).
	DialTimeout time.Duration
	// PeekTimeout bounds the wait for a connection's first bytes (its
	// ClientHello or request) when its name decides (default 10 s).
	PeekTimeout time.Duration
	// ListenAddr is the address the gateway's ports are opened on (default
	// 0.0.0.0: redirected connections arrive at each slot's host address).
	ListenAddr string
	// DefaultUpstream, if set, is the SOCKS5 proxy of sandboxes whose
	// policy names none (the node's network pool must then send every
	// slot's TCP here: network.Config.ProxyAllTCP).
	DefaultUpstream *network.Upstream
	// CA signs the certificates of intercepted hosts (those of the
	// sandboxes' rules); nil refuses connections to such hosts.
	CA *CA
	// Secrets reads the value of team's secret name, for the rules'
	// placeholders; nil: none.
	Secrets func(ctx context.Context, team, name string) (string, error)
	// UpstreamRoots verify the hosts an intercepted connection goes on
	// to; nil: the system's roots.
	UpstreamRoots *x509.CertPool

	// originalDst finds where a redirected connection was going; tests
	// without a firewall replace it.
	originalDst func(*net.TCPConn) (netip.AddrPort, error)
}

// Gateway is the node's egress gateway. Its methods are safe for
// concurrent use.
type Gateway struct {
	cfg      Config
	logger   *slog.Logger
	resolver *resolver
	metrics  *metrics

	dnsUDP   net.PacketConn
	dnsTCP   net.Listener
	proxy    net.Listener
	dnsPort  uint16
	proxyPrt uint16
	servers  []*dns.Server

	mu     sync.RWMutex
	slots  map[int]*slot
	byAddr map[netip.Addr]*slot
	denied []netip.Prefix

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// slot is what the gateway holds of one in-use network slot.
type slot struct {
	index   int
	addr    netip.Addr
	pol     network.Policy
	dnsOpen bool
	log     *eventLog
	// ctx ends when the slot is cleared (its sandbox is gone): its
	// connections are closed. A policy change keeps it (and them).
	ctx    context.Context
	cancel context.CancelFunc
	conns  *atomic.Int32 // connections being judged or relayed
	// dnsInflight is the slot's share of the queries waiting on the
	// node's resolvers: one sandbox cannot take all of them.
	dnsInflight chan struct{}
}

// maxDNSInflightPerSlot is a slot's share of maxInflightQueries.
const maxDNSInflightPerSlot = 32

// maxConnsPerSlot bounds one sandbox's connections through the gateway.
const maxConnsPerSlot = 2048

// Listen opens the gateway's ports and starts serving them until Close.
func Listen(ctx context.Context, cfg Config, logger *slog.Logger) (*Gateway, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "0.0.0.0"
	}
	if cfg.originalDst == nil {
		cfg.originalDst = originalDst
	}
	hosts, err := readHostsFile(cfg.HostsFile)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg:      cfg,
		logger:   logger,
		resolver: newResolver(cfg.Upstreams, hosts),
		metrics:  newMetrics(),
		slots:    map[int]*slot{},
		byAddr:   map[netip.Addr]*slot{},
	}
	g.ctx, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := g.listen(); err != nil {
		g.Close()
		return nil, err
	}
	g.serve()
	logger.InfoContext(ctx, "egress gateway listening", "dns_port", g.dnsPort, "proxy_port", g.proxyPrt,
		"upstreams", cfg.Upstreams, "hosts_file", cfg.HostsFile, "hosts", len(hosts))
	return g, nil
}

// listen opens the proxy port and a DNS port free for both UDP and TCP.
func (g *Gateway) listen() error {
	var err error
	if g.proxy, err = net.Listen("tcp4", net.JoinHostPort(g.cfg.ListenAddr, "0")); err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	g.proxyPrt = uint16(g.proxy.Addr().(*net.TCPAddr).Port)
	for attempt := 0; ; attempt++ {
		udp, err := net.ListenPacket("udp4", net.JoinHostPort(g.cfg.ListenAddr, "0"))
		if err != nil {
			return fmt.Errorf("egress DNS: %w", err)
		}
		port := udp.LocalAddr().(*net.UDPAddr).Port
		tcp, err := net.Listen("tcp4", net.JoinHostPort(g.cfg.ListenAddr, fmt.Sprint(port)))
		if err != nil {
			udp.Close()
			if attempt < 10 {
				continue // the TCP port of that number is taken; another
			}
			return fmt.Errorf("egress DNS: %w", err)
		}
		g.dnsUDP, g.dnsTCP, g.dnsPort = udp, tcp, uint16(port)
		return nil
	}
}

func (g *Gateway) serve() {
	handler := dns.HandlerFunc(g.serveDNS)
	g.servers = []*dns.Server{
		// Queries up to the size EDNS clients commonly offer; miekg's
		// default (512) drops larger ones unanswered.
		{PacketConn: g.dnsUDP, Handler: handler, UDPSize: dns.DefaultMsgSize},
		{Listener: g.dnsTCP, Handler: handler, ReadTimeout: 10 * time.Second},
	}
	for _, s := range g.servers {
		g.wg.Go(func() {
			if err := s.ActivateAndServe(); err != nil && g.ctx.Err() == nil {
				g.logger.Error("egress DNS server stopped", "err", err)
			}
		})
	}
	g.wg.Go(g.acceptLoop)
}

// Close stops serving and waits for the connections in flight to end.
func (g *Gateway) Close() error {
	g.cancel()
	var errs []error
	for _, s := range g.servers {
		if err := s.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if g.servers == nil { // Listen failed before serving: close what it opened
		if g.dnsUDP != nil {
			g.dnsUDP.Close()
		}
		if g.dnsTCP != nil {
			g.dnsTCP.Close()
		}
	}
	if g.proxy != nil {
		g.proxy.Close()
	}
	g.wg.Wait()
	return errors.Join(errs...)
}

// Ports implements network.Egress.
func (g *Gateway) Ports() (dnsPort, proxyPort uint16) { return g.dnsPort, g.proxyPrt }

// SetDenied implements network.Egress.
func (g *Gateway) SetDenied(ranges []netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.denied = slices.Clone(ranges)
}

// SetSlot implements network.Egress. The slot's event log carries over a
// policy change, not a new sandbox (ClearSlot comes first).
func (g *Gateway) SetSlot(index int, sandboxIP netip.Addr, pol network.Policy, dnsOpen bool) (undo func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	prev := g.slots[index]
	s := &slot{index: index, addr: sandboxIP, pol: pol, dnsOpen: dnsOpen}
	if prev != nil && prev.addr == sandboxIP {
		s.log, s.ctx, s.cancel, s.conns, s.dnsInflight = prev.log, prev.ctx, prev.cancel, prev.conns, prev.dnsInflight
	} else {
		if prev != nil {
			prev.cancel()
		}
		s.log = newEventLog(eventLogSize)
		s.ctx, s.cancel = context.WithCancel(g.ctx)
		s.conns = new(atomic.Int32)
		s.dnsInflight = make(chan struct{}, maxDNSInflightPerSlot)
	}
	g.putLocked(s)
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.slots[index] != s {
			return
		}
		if prev == nil {
			g.clearLocked(index)
			return
		}
		if prev.ctx.Err() != nil {
			// Its connections were closed when s replaced it.
			restored := *prev
			restored.ctx, restored.cancel = context.WithCancel(g.ctx)
			prev = &restored
		}
		g.putLocked(prev)
	}
}

// putLocked makes s the slot of its index, replacing any other.
func (g *Gateway) putLocked(s *slot) {
	if old := g.slots[s.index]; old != nil {
		delete(g.byAddr, old.addr)
	}
	g.slots[s.index] = s
	g.byAddr[s.addr] = s
}

// ClearSlot implements network.Egress.
func (g *Gateway) ClearSlot(index int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.clearLocked(index)
}

// clearLocked forgets slot index and closes its connections.
func (g *Gateway) clearLocked(index int) {
	if old := g.slots[index]; old != nil {
		delete(g.byAddr, old.addr)
		delete(g.slots, index)
		old.cancel()
	}
}

// Events returns slot index's egress log, oldest first (nil for a slot the
// gateway does not hold).
func (g *Gateway) Events(index int) []Event {
	g.mu.RLock()
	s := g.slots[index]
	g.mu.RUnlock()
	if s == nil {
		return nil
	}
	return s.log.events()
}

// currentPolicy is the policy of s's slot now (a change replaces the
// slot); false when the slot no longer holds s's sandbox.
func (g *Gateway) currentPolicy(s *slot) (network.Policy, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	now := g.slots[s.index]
	if now == nil || now.addr != s.addr || now.log != s.log {
		return network.Policy{}, false
	}
	return now.pol, true
}

// lookup returns the slot whose sandbox has address a, and the fixed deny
// list, as they are now.
func (g *Gateway) lookup(a netip.Addr) (*slot, []netip.Prefix) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.byAddr[a.Unmap()], g.denied
}

func (g *Gateway) deniedRanges() []netip.Prefix {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.denied
}

func inPrefixes(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// CACert implements sandbox.EgressLog: the PEM of the egress CA, or nil.
func (g *Gateway) CACert() []byte {
	if g.cfg.CA == nil {
		return nil
	}
	return g.cfg.CA.CertPEM()
}
