package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/proxy"

	"github.com/aenv-dev/aenv/internal/network"
)

// upstreamCheckTimeout bounds CheckUpstream: a create waits for it.
const upstreamCheckTimeout = 5 * time.Second

// resolveUpstream returns the address to dial for a proxy: its host is
// resolved now (and so pinned for one connection), and a sandbox's own
// proxy must not be in the node's denied ranges, which it would otherwise
// open. The operator's proxy (Config.DefaultUpstream) may be anywhere.
func (g *Gateway) resolveUpstream(ctx context.Context, up network.Upstream, operator bool) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(up.Address)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	p, err := netip.ParseAddrPort(net.JoinHostPort("0.0.0.0", port))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	addrs := []netip.Addr{}
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, a.Unmap())
	} else if addrs, err = g.resolver.lookup(ctx, host); err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	denied := g.deniedRanges()
	for _, a := range addrs {
		if a.Is4() && (operator || !inPrefixes(denied, a)) {
			return netip.AddrPortFrom(a, p.Port()), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("egress proxy %s: its address (%v) is in a range sandboxes may not reach (this node, private networks)", up.Address, addrs)
}

// CheckUpstream implements sandbox.EgressLog: the proxy's address is
// resolved and checked as for a connection, and it must answer a SOCKS5
// greeting and accept the credentials.
func (g *Gateway) CheckUpstream(ctx context.Context, up network.Upstream) error {
	ctx, cancel := context.WithTimeout(ctx, upstreamCheckTimeout)
	defer cancel()
	return g.checkUpstream(ctx, up, false)
}

// CheckDefaultUpstream checks the operator's proxy as CheckUpstream does a
// sandbox's, wherever it is.
func (g *Gateway) CheckDefaultUpstream(ctx context.Context) error {
	if g.cfg.DefaultUpstream == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, upstreamCheckTimeout)
	defer cancel()
	return g.checkUpstream(ctx, *g.cfg.DefaultUpstream, true)
}

func (g *Gateway) checkUpstream(ctx context.Context, up network.Upstream, operator bool) error {
	addr, err := g.resolveUpstream(ctx, up, operator)
	if err != nil {
		return err
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", addr.String())
	if err != nil {
		return fmt.Errorf("egress proxy %s: unreachable: %w", up.Address, err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	if err := socks5Hello(c, up.Username, up.Password); err != nil {
		return fmt.Errorf("egress proxy %s: %w", up.Address, err)
	}
	return nil
}

// socks5Hello is the start of a SOCKS5 session: the method negotiation
// and, with a username, its authentication (RFC 1929).
func socks5Hello(c net.Conn, username, password string) error {
	method := byte(0) // no authentication
	if username != "" {
		method = 2 // username and password
	}
	if _, err := c.Write([]byte{5, 1, method}); err != nil {
		return err
	}
	var reply [2]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("not a SOCKS5 proxy: %w", err)
	}
	if reply[0] != 5 {
		return errors.New("not a SOCKS5 proxy")
	}
	if reply[1] != method {
		return fmt.Errorf("the proxy refuses the authentication method %d", method)
	}
	if method == 0 {
		return nil
	}
	msg := append([]byte{1, byte(len(username))}, username...)
	msg = append(append(msg, byte(len(password))), password...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fmt.Errorf("SOCKS5 authentication: %w", err)
	}
	if reply[1] != 0 {
		return errors.New("the proxy refuses the username and password")
	}
	return nil
}

// upstream is the proxy a connection of the slot goes through, nil for
// none.
func (c *conn) upstream() *network.Upstream {
	if c.pol.Upstream != nil {
		return c.pol.Upstream
	}
	return c.g.cfg.DefaultUpstream
}

// dialUpstream connects to target (host:port, a name the proxy resolves
// or an address) through up.
func (c *conn) dialUpstream(ctx context.Context, up *network.Upstream, target string) (*net.TCPConn, error) {
	addr, err := c.g.resolveUpstream(ctx, *up, up == c.g.cfg.DefaultUpstream)
	if err != nil {
		return nil, err
	}
	var auth *proxy.Auth
	if up.Username != "" {
		auth = &proxy.Auth{User: up.Username, Password: up.Password}
	}
	// The SOCKS5 session runs over this connection and leaves nothing
	// buffered once it is set up: after the handshake the relay uses it
	// directly (for its half-close and splice).
	fwd := &recordingDialer{d: net.Dialer{Timeout: c.g.cfg.DialTimeout}}
	d, err := proxy.SOCKS5("tcp4", addr.String(), auth, fwd)
	if err != nil {
		return nil, err
	}
	if _, err := d.(proxy.ContextDialer).DialContext(ctx, "tcp", target); err != nil {
		if fwd.conn != nil {
			fwd.conn.Close()
		}
		return nil, fmt.Errorf("through egress proxy %s: %w", up.Address, err)
	}
	c.slot.log.update(func() { c.ev.Upstream = target + " via " + up.Address })
	return fwd.conn, nil
}

// recordingDialer dials TCP and keeps the connection it made.
type recordingDialer struct {
	d    net.Dialer
	conn *net.TCPConn
}

func (r *recordingDialer) Dial(network, addr string) (net.Conn, error) {
	return r.DialContext(context.Background(), network, addr)
}

func (r *recordingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := r.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	r.conn = c.(*net.TCPConn)
	return c, nil
}
