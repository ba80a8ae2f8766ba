package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/network"
)

// readBufferSize holds the largest ClientHello the proxy reads, with its
// record headers, and an HTTP request's headers.
const readBufferSize = 32 << 10

// tlsAlertAccessDenied is a fatal TLS access_denied alert: a client that
// is refused says so ("tlsv1 alert access denied") rather than reporting a
// reset.
var tlsAlertAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

func (g *Gateway) acceptLoop() {
	for {
		c, err := g.proxy.Accept()
		if err != nil {
			if g.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most likely: the backlog waits.
			g.logger.Warn("egress proxy: accept", "err", err)
			select {
			case <-g.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		g.wg.Go(func() { g.handle(c.(*net.TCPConn)) })
	}
}

// conn is one redirected connection being judged and relayed.
type conn struct {
	g      *Gateway
	ctx    context.Context // ends with the gateway or the slot
	client *net.TCPConn
	br     *bufio.Reader
	slot   *slot
	pol    network.Policy
	denied []netip.Prefix
	dst    netip.AddrPort // where the sandbox sent it
	ev     *Event
}

func (g *Gateway) handle(client *net.TCPConn) {
	defer client.Close()
	src, err := netip.ParseAddrPort(client.RemoteAddr().String())
	if err != nil {
		return
	}
	s, denied := g.lookup(src.Addr())
	if s == nil {
		// Not a sandbox of ours (the firewall lets only redirected
		// connections in): nothing to log it against.
		g.metrics.conns.WithLabelValues(VerdictDenied, "unknown").Inc()
		return
	}
	// s.ctx ends with the slot, and with the gateway (its parent).
	stop := context.AfterFunc(s.ctx, func() { client.Close() })
	defer stop()
	if s.conns.Add(1) > maxConnsPerSlot {
		s.conns.Add(-1)
		g.metrics.conns.WithLabelValues(VerdictDenied, "tcp").Inc()
		return
	}
	defer s.conns.Add(-1)
	dst, err := g.cfg.originalDst(client)
	if err != nil {
		g.logger.Warn("egress proxy: original destination", "sandbox_ip", src.Addr(), "err", err)
		return
	}
	c := &conn{g: g, ctx: s.ctx, client: client, br: bufio.NewReaderSize(client, readBufferSize),
		slot: s, pol: s.pol, denied: denied, dst: dst,
		ev: &Event{Time: time.Now(), Address: dst.Addr().String(), Port: dst.Port()}}
	c.serve()
}

func (c *conn) serve() {
	// The CIDR lists allow the address (names were allowed on top of an
	// open policy): no name needed.
	if c.pol.Allows(c.dst.Addr()) && !inPrefixes(c.denied, c.dst.Addr()) {
		c.ev.Protocol = "tcp"
		c.ev.Rule = "address"
		if len(c.pol.Rules) > 0 && c.dst.Port() == httpsPort && c.interceptAllowed() {
			return
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.g.cfg.DialTimeout)
		up, err := c.dial(ctx, c.dst.Addr())
		cancel()
		if err != nil {
			c.failed(err)
			return
		}
		c.relay(up)
		return
	}
	c.client.SetReadDeadline(time.Now().Add(c.g.cfg.PeekTimeout))
	first, err := c.br.Peek(1)
	if err != nil {
		c.ev.Protocol = "tcp"
		c.deny("no host name: the client sent nothing", nil)
		return
	}
	switch {
	case first[0] == recordTypeHandshake:
		c.ev.Protocol = "tls"
		c.serveTLS()
	case looksLikeHTTP(c.br):
		c.ev.Protocol = "http"
		c.serveHTTP()
	default:
		c.ev.Protocol = "tcp"
		c.deny("no host name (neither TLS nor HTTP) and the address is not allowed", nil)
	}
}

func (c *conn) serveTLS() {
	hello, err := peekClientHello(c.br)
	switch {
	case err != nil:
		c.deny(err.Error(), tlsAlertAccessDenied)
		return
	case hello.esni:
		c.deny("encrypted SNI hides the host name", tlsAlertAccessDenied)
		return
	case hello.serverName == "":
		c.deny("no host name (no SNI) and the address is not allowed", tlsAlertAccessDenied)
		return
	}
	c.ev.Host = hello.serverName
	rule := network.MatchHost(c.pol.AllowNames, hello.serverName)
	if rule == "" {
		c.deny(fmt.Sprintf("%s is not in allowOut", hello.serverName), tlsAlertAccessDenied)
		return
	}
	c.ev.Rule = rule
	if r := network.MatchRule(c.pol.Rules, hello.serverName); r != nil {
		c.intercept(hello.serverName, r, func() (*net.TCPConn, error) { return c.dialName(hello.serverName) })
		return
	}
	up, err := c.dialName(hello.serverName)
	if err != nil {
		c.failed(err)
		return
	}
	c.relay(up)
}

// interceptAllowed intercepts a connection the CIDR lists allow, to the
// HTTPS port, of a sandbox with rules, if its ClientHello names a rules'
// host; false (the bytes it read kept for the relay) otherwise.
func (c *conn) interceptAllowed() bool {
	c.client.SetReadDeadline(time.Now().Add(c.g.cfg.PeekTimeout))
	first, err := c.br.Peek(1)
	if err != nil || first[0] != recordTypeHandshake {
		return false
	}
	hello, err := peekClientHello(c.br)
	if err != nil || hello.esni {
		return false
	}
	r := network.MatchRule(c.pol.Rules, hello.serverName)
	if r == nil {
		return false
	}
	c.ev.Protocol, c.ev.Host = "tls", hello.serverName
	c.intercept(hello.serverName, r, func() (*net.TCPConn, error) {
		ctx, cancel := context.WithTimeout(c.ctx, c.g.cfg.DialTimeout)
		defer cancel()
		return c.dial(ctx, c.dst.Addr())
	})
	return true
}

// httpsPort is where the gateway looks for TLS to the rules' hosts among
// connections the CIDR lists allow (E2B's transforms are for HTTPS).
const httpsPort = 443

// maxHeaderBytes bounds a request's line and headers, as net/http's
// DefaultMaxHeaderBytes does for a server.
const maxHeaderBytes = 1 << 20

// idleTimeout bounds the wait for the next request of a keep-alive
// connection.
const idleTimeout = 2 * time.Minute

// headerLimit counts what the HTTP parser reads from the client while it
// reads a request's headers; a negative remain is no limit (a body).
type headerLimit struct {
	r      io.Reader
	remain int64
}

var errHeadersTooLarge = errors.New("request headers too large")

func (h *headerLimit) Read(p []byte) (int, error) {
	if h.remain < 0 {
		return h.r.Read(p)
	}
	if h.remain == 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(p)) > h.remain {
		p = p[:h.remain]
	}
	n, err := h.r.Read(p)
	h.remain -= int64(n)
	return n, err
}

// serveHTTP relays plain HTTP request by request: each request of the
// connection must name the host of the first one (a later request for
// another host would reach the first host's server, which might serve it).
// A WebSocket upgrade is judged like any request and must be the first of
// its connection; the bytes after it pass untouched only once the server
// has answered 101. Other upgrades (h2c) are taken out of the request.
func (c *conn) serveHTTP() {
	limit := &headerLimit{r: c.br}
	hr := bufio.NewReaderSize(limit, 4096)
	read := func(timeout time.Duration) (*http.Request, error) {
		limit.remain = maxHeaderBytes
		c.client.SetReadDeadline(time.Now().Add(timeout))
		req, err := http.ReadRequest(hr)
		limit.remain = -1
		c.client.SetReadDeadline(time.Time{})
		return req, err
	}
	req, err := read(c.g.cfg.PeekTimeout)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errHeadersTooLarge) {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		c.denyHTTP(status, "malformed HTTP request: "+err.Error())
		return
	}
	host, err := requestHost(req)
	if err != nil {
		c.denyHTTP(http.StatusForbidden, err.Error())
		return
	}
	c.ev.Host = host
	rule := network.MatchHost(c.pol.AllowNames, host)
	if rule == "" {
		c.denyHTTP(http.StatusForbidden, fmt.Sprintf("%s is not in allowOut", host))
		return
	}
	websocket := prepareUpgrade(req)
	c.ev.Rule = rule
	up, err := c.dialName(host)
	if err != nil {
		c.failedHTTP(err)
		return
	}
	defer up.Close()
	stop := context.AfterFunc(c.ctx, func() { up.Close() })
	defer stop()
	c.allowed()
	defer c.g.metrics.active.Dec()
	if websocket {
		c.upgrade(req, hr, up)
		return
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		n, _ := io.Copy(c.client, up)
		c.countIn(n)
		c.client.CloseWrite()
	})
	defer wg.Wait()
	for {
		if err := c.writeRequest(req, up); err != nil {
			up.Close()
			return
		}
		req, err = read(idleTimeout)
		if err != nil {
			// The client is done (EOF), idle too long, or sent something
			// that is not a request: either way nothing more goes up.
			up.CloseWrite()
			return
		}
		next, err := requestHost(req)
		if err == nil && !strings.EqualFold(next, host) {
			err = fmt.Errorf("a request for %q on a connection to %s", next, host)
		}
		if err == nil && prepareUpgrade(req) {
			err = errors.New("a WebSocket upgrade must be the first request of its connection")
		}
		if err != nil {
			// Not sent: the answers to the requests before it still reach
			// the client, then the connection ends.
			c.slot.log.add(&Event{Time: time.Now(), Protocol: "http", Host: next, Address: c.ev.Address, Port: c.ev.Port,
				Verdict: VerdictDenied, Reason: err.Error()})
			c.g.metrics.conns.WithLabelValues(VerdictDenied, "http").Inc()
			up.CloseWrite()
			return
		}
	}
}

// writeRequest sends req upstream as the client sent it, as far as
// Request.Write allows.
func (c *conn) writeRequest(req *http.Request, up net.Conn) error {
	if req.Header.Get("User-Agent") == "" {
		// Write would add Go's own.
		req.Header["User-Agent"] = []string{""}
	}
	cw := &countingWriter{w: up}
	err := req.Write(cw)
	c.countOut(cw.n)
	return err
}

// prepareUpgrade reports whether req asks for a WebSocket, and takes any
// other upgrade out of it (the server answers in HTTP/1.1 then): after a
// switch the gateway cannot tell requests apart.
func prepareUpgrade(req *http.Request) bool {
	if len(req.Header.Values("Upgrade")) == 0 {
		return false
	}
	// HTTP/2 settings only ever serve an h2c upgrade.
	req.Header.Del("HTTP2-Settings")
	// One value, "websocket" alone: a list ("websocket, h2c") or a second
	// header would let the server pick another protocol.
	if v := req.Header.Values("Upgrade"); len(v) == 1 && strings.EqualFold(strings.TrimSpace(v[0]), "websocket") {
		return true
	}
	req.Header.Del("Upgrade")
	var keep []string
	for _, v := range req.Header.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	req.Header.Del("Connection")
	if len(keep) > 0 {
		req.Header.Set("Connection", strings.Join(keep, ", "))
	}
	return false
}

// upgrade sends a WebSocket upgrade request and, if the server switches
// protocols, relays both ways untouched; otherwise the server's answer
// reaches the client and the connection ends.
func (c *conn) upgrade(req *http.Request, hr *bufio.Reader, up *net.TCPConn) {
	if err := c.writeRequest(req, up); err != nil {
		return
	}
	ur := bufio.NewReaderSize(up, maxResponseHead)
	up.SetReadDeadline(time.Now().Add(idleTimeout))
	switched := switchedToWebSocket(ur, req)
	up.SetReadDeadline(time.Time{})
	var wg sync.WaitGroup
	wg.Go(func() {
		n, _ := io.Copy(c.client, ur)
		c.countIn(n)
		c.client.CloseWrite()
	})
	defer wg.Wait()
	if !switched {
		up.CloseWrite()
		return
	}
	n, _ := io.Copy(up, hr)
	c.countOut(n)
	up.CloseWrite()
}

// maxResponseHead bounds the head of the answer to an upgrade.
const maxResponseHead = 16 << 10

// switchedToWebSocket reads, without consuming it, the head of the answer
// to a WebSocket upgrade: a 101 that upgrades to websocket and to nothing
// else.
func switchedToWebSocket(ur *bufio.Reader, req *http.Request) bool {
	var head []byte
	for {
		// Wait for at least one byte more than is buffered (a full buffer
		// fails: the head is too large).
		if _, err := ur.Peek(ur.Buffered() + 1); err != nil {
			return false
		}
		b, _ := ur.Peek(ur.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			head = b[:i+4]
			break
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), req)
	if err != nil {
		return false
	}
	v := resp.Header.Values("Upgrade")
	return resp.StatusCode == http.StatusSwitchingProtocols && len(v) == 1 && strings.EqualFold(strings.TrimSpace(v[0]), "websocket")
}

// requestHost returns the host a request names, without its port.
func requestHost(req *http.Request) (string, error) {
	if req.Method == http.MethodConnect {
		return "", errors.New("CONNECT tunnels are not allowed")
	}
	if req.URL.Host != "" {
		return "", errors.New("absolute-form requests (as to a proxy) are not allowed")
	}
	if req.ProtoMajor != 1 || req.ProtoMinor != 1 {
		return "", fmt.Errorf("%s is not relayed: HTTP/1.1 only", req.Proto)
	}
	if !httpguts.ValidHostHeader(req.Host) {
		return "", fmt.Errorf("invalid Host %q", req.Host)
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "" {
		return "", errors.New("no Host header")
	}
	return strings.ToLower(host), nil
}

// looksLikeHTTP reports whether the connection starts with an HTTP
// request line: a method of capital letters and a space.
func looksLikeHTTP(br *bufio.Reader) bool {
	for i := 1; i <= 16; i++ {
		b, err := br.Peek(i)
		if err != nil {
			return false
		}
		switch ch := b[i-1]; {
		case ch == ' ':
			return i > 1
		case ch < 'A' || ch > 'Z':
			return false
		}
	}
	return false
}

// dialName connects to name as the node resolves it, on the port the
// sandbox chose. The sandbox's own address is used if it is one of the
// name's (it may have picked one of several on purpose); an address in the
// fixed deny list never is.
func (c *conn) dialName(name string) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.g.cfg.DialTimeout)
	defer cancel()
	if up := c.upstream(); up != nil && up != c.g.cfg.DefaultUpstream {
		// The sandbox's own proxy resolves the name, in its own network.
		// Through the operator's, the name is resolved here and its denied
		// ranges hold (dial goes through that proxy by address).
		return c.dialUpstream(ctx, up, net.JoinHostPort(name, strconv.Itoa(int(c.dst.Port()))))
	}
	addrs, err := c.g.resolver.lookup(ctx, strings.ToLower(strings.TrimSuffix(name, ".")))
	if err != nil {
		return nil, err
	}
	var usable []netip.Addr
	for _, a := range addrs {
		if !a.Is4() || inPrefixes(c.denied, a) {
			continue
		}
		if a == c.dst.Addr() {
			usable = append([]netip.Addr{a}, usable...)
		} else {
			usable = append(usable, a)
		}
	}
	if len(usable) == 0 {
		return nil, fmt.Errorf("%s resolves to no address a sandbox may reach (%v)", name, addrs)
	}
	var errs []error
	for _, a := range usable {
		up, err := c.dial(ctx, a)
		if err == nil {
			return up, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (c *conn) dial(ctx context.Context, a netip.Addr) (*net.TCPConn, error) {
	target := netip.AddrPortFrom(a, c.dst.Port())
	if up := c.upstream(); up != nil {
		return c.dialUpstream(ctx, up, target.String())
	}
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp4", target.String())
	if err != nil {
		return nil, err
	}
	c.slot.log.update(func() { c.ev.Upstream = target.String() })
	return up.(*net.TCPConn), nil
}

// relay passes bytes both ways until both sides are done; what the proxy
// read to judge the connection goes first.
func (c *conn) relay(up *net.TCPConn) {
	defer up.Close()
	stop := context.AfterFunc(c.ctx, func() { up.Close() })
	defer stop()
	c.allowed()
	defer c.g.metrics.active.Dec()
	c.client.SetReadDeadline(time.Time{})
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
		c.countOut(int64(n))
		c.br.Discard(n)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Straight from the socket: splice(2) between the two.
		n, _ := io.Copy(up, c.client)
		c.countOut(n)
		up.CloseWrite()
	})
	n, _ := io.Copy(c.client, up)
	c.countIn(n)
	c.client.CloseWrite()
	wg.Wait()
}

func (c *conn) allowed() {
	c.ev.Verdict = VerdictAllowed
	c.slot.log.add(c.ev)
	c.g.metrics.conns.WithLabelValues(VerdictAllowed, c.ev.Protocol).Inc()
	c.g.metrics.active.Inc()
}

func (c *conn) countOut(n int64) {
	c.slot.log.update(func() { c.ev.BytesOut += n })
	c.g.metrics.bytes.WithLabelValues("out").Add(float64(n))
}

func (c *conn) countIn(n int64) {
	c.slot.log.update(func() { c.ev.BytesIn += n })
	c.g.metrics.bytes.WithLabelValues("in").Add(float64(n))
}

// deny refuses the connection, telling the client so with alert if it is
// not nil.
func (c *conn) deny(reason string, alert []byte) {
	c.ev.Verdict = VerdictDenied
	c.ev.Reason = reason
	c.slot.log.add(c.ev)
	c.g.metrics.conns.WithLabelValues(VerdictDenied, c.ev.Protocol).Inc()
	if alert != nil {
		c.client.SetWriteDeadline(time.Now().Add(time.Second))
		c.client.Write(alert)
	}
}

func (c *conn) denyHTTP(status int, reason string) {
	c.deny(reason, nil)
	writeHTTPError(c.client, status, reason)
}

// failed records an allowed connection the gateway could not make.
func (c *conn) failed(err error) {
	c.ev.Verdict = VerdictFailed
	c.ev.Reason = err.Error()
	c.slot.log.add(c.ev)
	c.g.metrics.conns.WithLabelValues(VerdictFailed, c.ev.Protocol).Inc()
}

func (c *conn) failedHTTP(err error) {
	c.failed(err)
	writeHTTPError(c.client, http.StatusBadGateway, err.Error())
}

func writeHTTPError(w net.Conn, status int, msg string) {
	body := "aenv egress: " + msg + "\n"
	w.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	return n, err
}

// originalDst is where a redirected connection was sent before the
// firewall turned it to the proxy.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// The kernel answers with a sockaddr_in; the IPv6 mreq getter is the
		// one of x/sys/unix that reads 16 bytes.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		port := uint16(b[2])<<8 | uint16(b[3])
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	return out, nil
}
