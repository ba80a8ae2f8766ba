package server

import (
	"container/list"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// fdReserve is how many file descriptors the connection limit leaves to
// everything else the server opens: the database, runsc pipes, netlink
// sockets, image layers, log files.
const fdReserve = 512

// autoMaxConns derives the connection limit from RLIMIT_NOFILE (whose
// soft limit the Go runtime raises to the hard one at start). A proxied
// connection costs two descriptors: the client's and the sandbox's.
func autoMaxConns() (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur > 1<<40 { // RLIM_INFINITY
		return 1 << 20, nil
	}
	n := (int64(lim.Cur) - fdReserve) / 2
	if n < 64 {
		return 0, fmt.Errorf("RLIMIT_NOFILE is %d: too low to serve (raise it, e.g. LimitNOFILE=1048576)", lim.Cur)
	}
	return int(n), nil
}

// connLimiter caps the connections the server holds at once, so that
// clients cannot take every file descriptor and starve the server of the
// ones it needs to answer. At the cap a new connection evicts the longest
// idle one (a keep-alive connection between requests, or one that has not
// sent a request yet); only when every connection is busy does Accept wait.
// Wire it as both the listener and the http.Server's ConnState hook.
type connLimiter struct {
	net.Listener
	max int

	mu     sync.Mutex
	active int
	idle   *list.List    // of *limitedConn, longest idle first
	freed  chan struct{} // closed and replaced whenever a slot frees up
	done   chan struct{} // closed by Close
	closed bool
}

func newConnLimiter(l net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: l, max: max, idle: list.New(),
		freed: make(chan struct{}), done: make(chan struct{})}
}

// limitedConn gives its slot back when closed, however it is closed (by
// the server, the client going away, eviction, or a hijacker).
type limitedConn struct {
	net.Conn
	l        *connLimiter
	once     sync.Once
	idleElem *list.Element
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// Accept takes the next connection, then waits for a slot for it. Taking
// it first matters: evicting for a connection not yet there would close an
// idle one for nothing, often one that was about to send its request.
func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := l.acquire(); err != nil {
		c.Close()
		return nil, err
	}
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *connLimiter) acquire() error {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return net.ErrClosed
		}
		if l.active < l.max {
			l.active++
			l.mu.Unlock()
			return nil
		}
		var victim *limitedConn
		if front := l.idle.Front(); front != nil {
			victim = front.Value.(*limitedConn)
			l.idle.Remove(front)
			victim.idleElem = nil
		}
		freed := l.freed
		l.mu.Unlock()
		if victim != nil {
			victim.Close() // its release frees the slot taken next round
			continue
		}
		select {
		case <-freed:
		case <-l.done:
			return net.ErrClosed
		}
	}
}

func (l *connLimiter) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.idleElem != nil {
		l.idle.Remove(c.idleElem)
		c.idleElem = nil
	}
	l.active--
	close(l.freed)
	l.freed = make(chan struct{})
}

// share makes another listener (the HTTPS one beside the plain one) draw
// on l's slots: the limit is on the server's connections in all, whichever
// listener took them. Closing it closes other only.
func (l *connLimiter) share(other net.Listener) net.Listener {
	return &sharedLimiter{Listener: other, l: l}
}

type sharedLimiter struct {
	net.Listener
	l *connLimiter
}

func (s *sharedLimiter) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := s.l.acquire(); err != nil {
		c.Close()
		return nil, err
	}
	return &limitedConn{Conn: c, l: s.l}, nil
}

// ConnState tracks which connections are idle, i.e. may be evicted.
func (l *connLimiter) ConnState(nc net.Conn, state http.ConnState) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	c, ok := nc.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.idleElem != nil {
		l.idle.Remove(c.idleElem)
		c.idleElem = nil
	}
	if state == http.StateNew || state == http.StateIdle {
		c.idleElem = l.idle.PushBack(c)
		// A waiting Accept may now evict it.
		close(l.freed)
		l.freed = make(chan struct{})
	}
}

// Close stops accepting; connections already served are left to the
// http.Server.
func (l *connLimiter) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	l.mu.Unlock()
	return l.Listener.Close()
}
