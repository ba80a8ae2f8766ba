// Package dnsstub is a DNS server for tests: it answers A queries for a
// few zones (a name and every name under it) with one IPv4 address each,
// over UDP and TCP, so that a client resolving through the system's
// resolver (getaddrinfo, resolv.conf) or an ACME server validating a
// domain reaches a test's server by name. Other names do not exist; other
// record types of a zone's names are empty.
package dnsstub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers queries on one address, UDP and TCP.
type Server struct {
	zones map[string]netip.Addr
	udp   net.PacketConn
	tcp   net.Listener
	wg    sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// Start listens on addr (host:port; port 53 for resolv.conf, which names no
// port) for UDP and TCP and answers for zones, each a domain name mapped to
// the IPv4 address of it and of every name under it.
func Start(ctx context.Context, addr string, zones map[string]netip.Addr) (*Server, error) {
	s := &Server{zones: make(map[string]netip.Addr, len(zones)), conns: map[net.Conn]struct{}{}}
	for name, ip := range zones {
		if !ip.Is4() {
			return nil, fmt.Errorf("dnsstub: zone %s: %s is not an IPv4 address", name, ip)
		}
		s.zones[canonical(name)] = ip
	}
	var lc net.ListenConfig
	var (
		udp net.PacketConn
		tcp net.Listener
		err error
	)
	// TCP on the port UDP got (addr may ask for port 0). That port can be
	// taken for TCP by another process: with port 0, another one is tried.
	_, port, _ := net.SplitHostPort(addr)
	for attempt := 0; ; attempt++ {
		udp, err = lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return nil, fmt.Errorf("dnsstub: listen udp %s: %w", addr, err)
		}
		tcp, err = lc.Listen(ctx, "tcp", udp.LocalAddr().String())
		if err == nil {
			break
		}
		udp.Close()
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) || attempt >= 20 {
			return nil, fmt.Errorf("dnsstub: listen tcp %s: %w", addr, err)
		}
	}
	s.udp, s.tcp = udp, tcp
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

// Addr is the host:port the server listens on (UDP and TCP).
func (s *Server) Addr() string {
	return s.udp.LocalAddr().String()
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.done = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := errors.Join(s.udp.Close(), s.tcp.Close())
	s.wg.Wait()
	return err
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if reply, ok := s.answer(buf[:n]); ok {
			s.udp.WriteTo(reply, from)
		}
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// serveConn answers the length-prefixed queries of one TCP connection.
func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	for {
		// A resolver sends its queries at once; an idle connection is
		// dropped rather than kept forever.
		c.SetDeadline(time.Now().Add(30 * time.Second))
		var size [2]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		reply, ok := s.answer(msg)
		if !ok {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(reply)))
		if _, err := c.Write(append(out, reply...)); err != nil {
			return
		}
	}
}

// answer builds the reply to query (a question and at most one record:
// small enough for UDP); ok is false for what is not a query (nothing is
// sent back).
func (s *Server) answer(query []byte) (reply []byte, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	hdr := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	q, err := p.Question()
	if err != nil || h.OpCode != 0 {
		hdr.RCode = dnsmessage.RCodeFormatError
		if h.OpCode != 0 {
			hdr.RCode = dnsmessage.RCodeNotImplemented
		}
		b := dnsmessage.NewBuilder(make([]byte, 0, 12), hdr)
		msg, err := b.Finish()
		return msg, err == nil
	}
	ip, found := s.lookup(q.Name.String())
	if found {
		hdr.Authoritative = true
	} else {
		hdr.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), hdr)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, false
	}
	if err := b.Question(q); err != nil {
		return nil, false
	}
	if found && q.Type == dnsmessage.TypeA && q.Class == dnsmessage.ClassINET {
		if err := b.StartAnswers(); err != nil {
			return nil, false
		}
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1}
		if err := b.AResource(rh, dnsmessage.AResource{A: ip.As4()}); err != nil {
			return nil, false
		}
	}
	msg, err := b.Finish()
	return msg, err == nil
}

// lookup finds the zone that name is in (the zone's own name included).
func (s *Server) lookup(name string) (netip.Addr, bool) {
	name = canonical(name)
	for zone, ip := range s.zones {
		if name == zone || strings.HasSuffix(name, "."+zone) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// canonical is name in lower case without its final dot.
func canonical(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}
