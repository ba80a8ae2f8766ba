package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/aenv-dev/aenv/internal/network"
)

// serveDNS answers one query of a sandbox. A sandbox whose policy lets it
// ask the node's resolvers (dnsOpen) gets any name; one that may not gets
// only the names its policy allows, so that a sandbox denied everything
// cannot send data out in the names it asks about. HTTPS and SVCB records
// are answered empty: they carry ECH keys, with which a client would hide
// the name it connects to from the proxy.
func (g *Gateway) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	s, _ := g.lookup(src.Addr())
	reply := func(m *dns.Msg) {
		if err := w.WriteMsg(m); err != nil {
			g.logger.Debug("egress DNS: write answer", "err", err)
		}
	}
	if s == nil || len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeRefused)
		reply(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	rule := network.MatchHost(s.pol.AllowNames, name)
	if rule == "" && !s.dnsOpen {
		g.metrics.dns.WithLabelValues("denied").Inc()
		s.log.add(&Event{Time: time.Now(), Protocol: "dns", Host: name, Verdict: VerdictDenied,
			Reason: "the policy allows no resolver and the name is not in allowOut"})
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeRefused)
		reply(m)
		return
	}
	g.metrics.dns.WithLabelValues("allowed").Inc()
	if q.Qtype == dns.TypeHTTPS || q.Qtype == dns.TypeSVCB {
		m := new(dns.Msg)
		m.SetReply(req)
		reply(m)
		return
	}
	if addrs, ok := g.resolver.hosts[name]; ok && q.Qclass == dns.ClassINET {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		if q.Qtype == dns.TypeA {
			for _, a := range addrs {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
					A:   net.IP(a.AsSlice()),
				})
			}
		}
		reply(m)
		return
	}
	transport := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		transport = "tcp"
	}
	select {
	case s.dnsInflight <- struct{}{}:
		defer func() { <-s.dnsInflight }()
	default:
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		reply(m)
		return
	}
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	resp, err := g.resolver.exchange(ctx, req, transport, true)
	if err != nil {
		g.logger.Debug("egress DNS: upstream", "name", name, "err", err)
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		reply(m)
		return
	}
	if q.Qtype == dns.TypeA && cacheable(req) {
		g.resolver.remember(name, resp)
	}
	resp.Id = req.Id
	reply(resp)
}

// resolver answers names for the proxy and the DNS server: from the hosts
// file, then a cache of A answers, then the upstreams.
type resolver struct {
	upstreams []netip.Addr
	hosts     map[string][]netip.Addr
	// inflight bounds the queries waiting on the upstreams: past it a
	// query fails at once (SERVFAIL) rather than holding a socket and a
	// goroutine each.
	inflight chan struct{}

	mu    sync.Mutex
	cache map[string]cachedAnswer
}

type cachedAnswer struct {
	addrs   []netip.Addr
	expires time.Time
}

// Bounds of the cache: a TTL is kept between these, and at most this many
// names are (past it, expired ones are dropped, then any).
const (
	minCacheTTL     = 5 * time.Second
	maxCacheTTL     = 5 * time.Minute
	maxCacheEntries = 10000
	// maxCachedAddrs is how many addresses of one name are kept.
	maxCachedAddrs     = 16
	maxInflightQueries = 256
)

func newResolver(upstreams []netip.Addr, hosts map[string][]netip.Addr) *resolver {
	return &resolver{upstreams: upstreams, hosts: hosts, cache: map[string]cachedAnswer{},
		inflight: make(chan struct{}, maxInflightQueries)}
}

// cacheable reports whether the answer to a sandbox's query may feed the
// cache the proxy dials by: a plain question, not one that asks the
// resolver to skip validation (CD) or to tailor the answer to a client
// subnet.
func cacheable(req *dns.Msg) bool {
	if req.CheckingDisabled || req.Question[0].Qclass != dns.ClassINET {
		return false
	}
	if opt := req.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if _, ok := o.(*dns.EDNS0_SUBNET); ok {
				return false
			}
		}
	}
	return true
}

// exchange asks the upstreams in turn; the first that answers wins. A
// sandbox's query (limited) counts against the node-wide bound; the
// gateway's own lookups do not, so sandboxes cannot starve them.
func (r *resolver) exchange(ctx context.Context, req *dns.Msg, network string, limited bool) (*dns.Msg, error) {
	if len(r.upstreams) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	if limited {
		select {
		case r.inflight <- struct{}{}:
			defer func() { <-r.inflight }()
		default:
			return nil, errors.New("too many queries waiting on the upstream resolvers")
		}
	}
	c := &dns.Client{Net: network, Timeout: 2 * time.Second}
	var errs []error
	for _, u := range r.upstreams {
		resp, _, err := c.ExchangeContext(ctx, req, netip.AddrPortFrom(u, 53).String())
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// remember caches the A records of an answer for name (the first
// maxCachedAddrs) and returns them.
func (r *resolver) remember(name string, resp *dns.Msg) []netip.Addr {
	if resp.Rcode != dns.RcodeSuccess {
		return nil
	}
	var addrs []netip.Addr
	ttl := maxCacheTTL
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok || len(addrs) == maxCachedAddrs {
			continue
		}
		if addr, ok := netip.AddrFromSlice(a.A.To4()); ok {
			addrs = append(addrs, addr)
			ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	ttl = max(ttl, minCacheTTL)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= maxCacheEntries {
		now := time.Now()
		for k, v := range r.cache {
			if now.After(v.expires) {
				delete(r.cache, k)
			}
		}
		for k := range r.cache {
			if len(r.cache) < maxCacheEntries {
				break
			}
			delete(r.cache, k)
		}
	}
	r.cache[name] = cachedAnswer{addrs: addrs, expires: time.Now().Add(ttl)}
	return addrs
}

// lookup returns the IPv4 addresses of name.
func (r *resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if addrs, ok := r.hosts[name]; ok {
		return addrs, nil
	}
	r.mu.Lock()
	c, ok := r.cache[name]
	r.mu.Unlock()
	if ok && time.Now().Before(c.expires) {
		return c.addrs, nil
	}
	req := new(dns.Msg)
	req.SetQuestion(dns.Fqdn(name), dns.TypeA)
	resp, err := r.exchange(ctx, req, "udp", false)
	if err == nil && resp.Truncated {
		resp, err = r.exchange(ctx, req, "tcp", false)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", name, err)
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("resolve %s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	addrs := r.remember(name, resp)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no IPv4 address", name)
	}
	return addrs, nil
}

// readHostsFile reads a hosts file's IPv4 entries; "" reads nothing.
func readHostsFile(path string) (map[string][]netip.Addr, error) {
	hosts := map[string][]netip.Addr{}
	if path == "" {
		return hosts, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("DNS hosts file: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil || len(fields) < 2 {
			return nil, fmt.Errorf("DNS hosts file %s line %d: want an address and names", path, n)
		}
		if !a.Unmap().Is4() {
			continue // sandboxes have IPv4 only
		}
		for _, name := range fields[1:] {
			name = strings.ToLower(strings.TrimSuffix(name, "."))
			hosts[name] = append(hosts[name], a.Unmap())
		}
	}
	return hosts, sc.Err()
}
