package image

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ErrRefusedAddress is returned (wrapped) by Pull when the registry, or a
// redirect from it, is at an address pulls may not reach.
var ErrRefusedAddress = errdefs.New(errdefs.ErrPermissionDenied, "registry address refused")

// RegistryPolicy says which addresses pulls may connect to. A pull is made
// on a client's behalf, so by default it may not reach what only the
// server can: this host (loopback, unspecified, the host's own addresses),
// link-local addresses (cloud metadata services), multicast, and the
// Denied ranges. The check is made on every connection, on the address
// actually dialled, so neither a name resolving there, a redirect, nor a
// DNS answer that changes between lookups gets around it.
type RegistryPolicy struct {
	// AllowPrivate lets pulls reach every address (a registry on this host
	// or in Denied).
	AllowPrivate bool
	// Denied are further ranges pulls may not reach: the sandbox range.
	Denied []netip.Prefix
	// deny refuses further addresses even with AllowPrivate (tests).
	deny func(netip.Addr) bool
	// proxy replaces http.ProxyFromEnvironment (tests).
	proxy func(*http.Request) (*url.URL, error)
}

// check returns an error wrapping ErrRefusedAddress if addr is refused.
func (p RegistryPolicy) check(addr netip.Addr) error {
	addr = addr.Unmap()
	if p.deny != nil && p.deny(addr) {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, addr)
	}
	if p.AllowPrivate {
		return nil
	}
	why := ""
	switch {
	case addr.IsLoopback():
		why = "loopback"
	case addr.IsUnspecified():
		why = "unspecified (this host)"
	case addr.IsLinkLocalUnicast(), addr.IsLinkLocalMulticast():
		why = "link-local"
	case addr.IsMulticast():
		why = "multicast"
	}
	for _, d := range p.Denied {
		if why == "" && d.Contains(addr) {
			why = "in the sandbox range " + d.String()
		}
	}
	if why == "" && isLocalAddress(addr) {
		why = "an address of this host"
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %s is %s (the operator can allow it with --allow-private-registries)",
		ErrRefusedAddress, addr, why)
}

// isLocalAddress reports whether addr is assigned to one of this host's
// interfaces, where it reaches the server's own API like loopback does.
func isLocalAddress(addr netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if ipnet, ok := a.(*net.IPNet); ok {
			if local, ok := netip.AddrFromSlice(ipnet.IP); ok && local.Unmap() == addr {
				return true
			}
		}
	}
	return false
}

// transport returns the HTTP transport that enforces p: go-containerregistry's
// default one, dialling through a check of each address. Connections to
// the proxy the operator configured (HTTPS_PROXY and the like) are not
// checked, since the proxy is theirs; the registry's name is checked
// before the request goes to the proxy instead, which then connects.
func (p RegistryPolicy) transport() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	checked := &net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrRefusedAddress, address, err)
			}
			return p.check(ap.Addr())
		},
	}
	plain := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	var proxies sync.Map // host:port of proxies chosen from the environment
	proxyOf := p.proxy
	if proxyOf == nil {
		proxyOf = http.ProxyFromEnvironment
	}
	t.Proxy = func(req *http.Request) (*url.URL, error) {
		u, err := proxyOf(req)
		if err != nil || u == nil {
			return u, err
		}
		if err := p.checkName(req.Context(), req.URL.Hostname()); err != nil {
			return nil, err
		}
		proxies.Store(proxyAddr(u), true)
		return u, nil
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, ok := proxies.Load(addr); ok {
			return plain.DialContext(ctx, network, addr)
		}
		return checked.DialContext(ctx, network, addr)
	}
	return t
}

// checkName checks every address host resolves to, for requests that a
// proxy makes. A name this host cannot resolve passes: behind a proxy,
// often only the proxy can, and the name then reaches nothing of ours.
func (p RegistryPolicy) checkName(ctx context.Context, host string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		return p.check(a)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if err := p.check(a); err != nil {
			return err
		}
	}
	return nil
}

// proxyAddr is the host:port the transport dials for proxy u.
func proxyAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	switch u.Scheme {
	case "https":
		port = "443"
	case "socks5", "socks5h":
		port = "1080"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
