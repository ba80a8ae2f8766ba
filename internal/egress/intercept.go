package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenv-dev/aenv/internal/network"
	"github.com/aenv-dev/aenv/internal/secret"
)

// Interception: a TLS connection to a host that one of the sandbox's
// rules names (network.HostRule) is terminated here with a certificate
// the node's egress CA signs (the sandbox trusts it: see
// sandbox.trustEgressCA), its HTTP/1.1 requests get the rule's headers,
// secrets filled in, and go on over TLS the gateway verifies against the
// real host. The secrets never enter the sandbox. Hosts without rules are
// never intercepted.

// errNoCA: the node has no egress CA, so it cannot apply rules.
var errNoCA = errors.New("this node's egress gateway has no CA: header transforms cannot be applied")

// peekedConn reads what the judge peeked first, then the socket, and
// counts the bytes both ways.
type peekedConn struct {
	*net.TCPConn
	br *bufio.Reader
	c  *conn
}

func (p *peekedConn) Read(b []byte) (int, error) {
	n, err := p.br.Read(b)
	p.c.countOut(int64(n))
	return n, err
}

func (p *peekedConn) Write(b []byte) (int, error) {
	n, err := p.TCPConn.Write(b)
	p.c.countIn(int64(n))
	return n, err
}

// oneConnListener hands an http.Server one connection, then waits until
// that connection is done.
type oneConnListener struct {
	conn net.Conn
	once sync.Once
	gave bool
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.gave {
		l.gave = true
		return l.conn, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) finish()        { l.once.Do(func() { close(l.done) }) }
func (l *oneConnListener) Close() error   { l.finish(); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// intercept serves the connection, whose ClientHello named serverName,
// under rule; dialUp connects to the real host (each upstream connection
// the requests need).
func (c *conn) intercept(serverName string, rule *network.HostRule, dialUp func() (*net.TCPConn, error)) {
	c.ev.Transform = rule.Pattern
	ca := c.g.cfg.CA
	if ca == nil {
		c.deny(errNoCA.Error(), tlsAlertAccessDenied)
		return
	}
	host := strings.ToLower(strings.TrimSuffix(serverName, "."))
	c.allowed()
	defer c.g.metrics.active.Dec()

	c.client.SetDeadline(time.Now().Add(c.g.cfg.PeekTimeout))
	tlsConn := tls.Server(&peekedConn{TCPConn: c.client, br: c.br, c: c}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.leaf(host) },
		// HTTP/1.1 only: each request is read, changed and sent on.
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	if err := tlsConn.HandshakeContext(c.ctx); err != nil {
		c.slot.log.update(func() {
			c.ev.Reason = "the sandbox did not accept the gateway's certificate (is the egress CA trusted?): " + err.Error()
		})
		return
	}
	c.client.SetDeadline(time.Time{})

	port := strconv.Itoa(int(c.dst.Port()))
	upstream := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			raw, err := dialUp()
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: c.g.cfg.UpstreamRoots,
				NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
			// The dial's context outlives a stalled host: bound the
			// handshake by itself. (No bound on the answer: a model's
			// reply may take minutes to start.)
			hctx, cancel := context.WithTimeout(ctx, c.g.cfg.DialTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, fmt.Errorf("TLS to %s: %w", host, err)
			}
			return tc, nil
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     idleTimeout,
		DisableCompression:  true, // bodies pass as the host sends them
	}
	defer upstream.CloseIdleConnections()
	forward := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = net.JoinHostPort(host, port)
			pr.Out.Host = pr.In.Host
			// The request as the sandbox sent it: its query unparsed and
			// its own forwarding headers, which Rewrite drops.
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			for _, h := range forwardingHeaders {
				if v := pr.In.Header.Values(h); len(v) > 0 {
					pr.Out.Header[h] = v
				}
			}
			// The rule's headers last: after the proxy removed the hop
			// headers (a sandbox's "Connection: Authorization" must not
			// remove the rule's Authorization).
			headers, _ := pr.In.Context().Value(ruleHeadersKey{}).([]network.Header)
			for _, h := range headers {
				pr.Out.Header.Set(h.Name, h.Value)
			}
		},
		Transport:     upstream,
		FlushInterval: -1, // streamed responses (server-sent events) as they come
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			c.noteReason(err.Error())
			http.Error(w, "aenv egress: "+err.Error(), http.StatusBadGateway)
		},
	}

	var handlers sync.WaitGroup
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		if c.ctx.Err() != nil {
			// The sandbox is gone (Serve is ending): nothing goes up.
			w.Header().Set("Connection", "close")
			http.Error(w, "aenv egress: the sandbox stopped", http.StatusServiceUnavailable)
			return
		}
		reqHost := r.Host
		if h, _, err := net.SplitHostPort(reqHost); err == nil {
			reqHost = h
		}
		if !strings.EqualFold(strings.TrimSuffix(reqHost, "."), host) {
			// Another host over this connection would get this one's
			// headers (or none of its own): each connection is one host.
			msg := fmt.Sprintf("the request is for %q on a connection to %s", r.Host, host)
			c.noteReason(msg)
			http.Error(w, "aenv egress: "+msg, http.StatusMisdirectedRequest)
			return
		}
		// The policy as it is now, not as it was when the connection
		// came: a rule removed (or the host no longer allowed) stops
		// putting the secret into this connection's next request.
		pol, ok := c.g.currentPolicy(c.slot)
		current := network.MatchRule(pol.Rules, host)
		if !ok || current == nil || !c.stillAllowed(pol, host) {
			msg := fmt.Sprintf("the sandbox's rules for %s changed: connect again", host)
			c.noteReason(msg)
			w.Header().Set("Connection", "close")
			http.Error(w, "aenv egress: "+msg, http.StatusForbidden)
			return
		}
		headers := make([]network.Header, 0, len(current.Headers))
		for _, h := range current.Headers {
			value, err := secret.Fill(h.Value, func(name string) (string, error) {
				if c.g.cfg.Secrets == nil {
					return "", errors.New("this node serves no secrets")
				}
				return c.g.cfg.Secrets(r.Context(), pol.Team, name)
			})
			if err != nil {
				// Never sent on with the placeholder (or without the
				// header): the request fails here, saying why. What the
				// store said stays in the server's log.
				msg := fmt.Sprintf("header %s of the rule for %s: %v", h.Name, current.Pattern, err)
				if !errors.Is(err, secret.ErrUnknown) {
					c.g.logger.Warn("egress: a rule's secret could not be read", "host", host, "err", err)
					msg = fmt.Sprintf("header %s of the rule for %s: its secret cannot be read now", h.Name, current.Pattern)
				}
				c.noteReason(msg)
				http.Error(w, "aenv egress: "+msg, http.StatusBadGateway)
				return
			}
			headers = append(headers, network.Header{Name: h.Name, Value: value})
		}
		c.slot.log.update(func() { c.ev.Requests++ })
		forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ruleHeadersKey{}, headers)))
	})

	l := &oneConnListener{conn: tlsConn, done: make(chan struct{})}
	srv := &http.Server{
		Handler:           handler,
		BaseContext:       func(net.Listener) context.Context { return c.ctx },
		ReadHeaderTimeout: c.g.cfg.PeekTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				l.finish()
			}
		},
	}
	stop := context.AfterFunc(c.ctx, func() { srv.Close(); tlsConn.Close() })
	defer stop()
	srv.Serve(l)
	// A hijacked connection (a WebSocket) is still its handler's.
	handlers.Wait()
	tlsConn.Close()
}

// ruleHeadersKey carries a request's filled-in rule headers from the
// handler to the proxy's Rewrite.
type ruleHeadersKey struct{}

// forwardingHeaders are the sandbox's own, which Rewrite would drop.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// stillAllowed tells whether pol still lets the connection reach host:
// by name, or by its address.
func (c *conn) stillAllowed(pol network.Policy, host string) bool {
	if network.MatchHost(pol.AllowNames, host) != "" {
		return true
	}
	return pol.Allows(c.dst.Addr()) && !inPrefixes(c.denied, c.dst.Addr())
}

// noteReason records on the connection's event why a request through it
// failed.
func (c *conn) noteReason(reason string) {
	c.slot.log.update(func() { c.ev.Reason = reason })
}
