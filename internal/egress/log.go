package egress

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Verdicts of an Event.
const (
	VerdictAllowed = "allowed"
	VerdictDenied  = "denied"
	// VerdictFailed: allowed, but the gateway could not connect (the name
	// does not resolve, the host does not answer).
	VerdictFailed = "failed"
)

// Event is one connection or DNS query of a sandbox that the gateway
// judged. Only connections the firewall sends to the gateway are here:
// those of a sandbox whose policy allows host names, and that its address
// lists do not allow already.
type Event struct {
	Time time.Time
	// Protocol is what the gateway read: "tls", "http", "tcp" (neither, or
	// allowed by address without reading) or "dns".
	Protocol string
	// Host is the name the connection or query carried.
	Host string
	// Address and Port are where the sandbox sent the connection.
	Address string
	Port    uint16
	// Upstream is where the gateway connected (the name's address).
	Upstream string
	Verdict  string
	// Rule is the allowOut entry that let the connection through, or
	// "address" when its address did.
	Rule string
	// Reason says why the connection was denied or failed.
	Reason            string
	BytesOut, BytesIn int64
	// Transform is the rules' host whose headers the gateway set into the
	// connection's requests (it intercepted it), and Requests how many it
	// sent on; "" for a connection passed through.
	Transform string
	Requests  int64
}

// eventLogSize is how many events a sandbox's log keeps (the newest).
const eventLogSize = 512

// eventLog is a ring of a slot's newest events. Events stay writable
// (their byte counts grow) through update.
type eventLog struct {
	mu   sync.Mutex
	ring []*Event
	next int
	full bool
}

func newEventLog(size int) *eventLog {
	return &eventLog{ring: make([]*Event, size)}
}

func (l *eventLog) add(e *Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = e
	l.next = (l.next + 1) % len(l.ring)
	l.full = l.full || l.next == 0
}

// update changes an event already added, under the log's lock.
func (l *eventLog) update(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f()
}

// events copies the log, oldest first.
func (l *eventLog) events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	if l.full {
		for _, e := range l.ring[l.next:] {
			out = append(out, *e)
		}
	}
	for _, e := range l.ring[:l.next] {
		out = append(out, *e)
	}
	return out
}

type metrics struct {
	conns  *prometheus.CounterVec
	dns    *prometheus.CounterVec
	bytes  *prometheus.CounterVec
	active prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenv_egress_connections_total",
			Help: "TCP connections the egress gateway judged, by verdict (allowed, denied, failed) and what it read (tls, http, tcp).",
		}, []string{"verdict", "protocol"}),
		dns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenv_egress_dns_queries_total",
			Help: "DNS queries of sandboxes, by verdict (allowed, denied).",
		}, []string{"verdict"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenv_egress_bytes_total",
			Help: "Bytes the egress gateway relayed, by direction (out: from sandboxes).",
		}, []string{"direction"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aenv_egress_connections_active",
			Help: "Connections the egress gateway is relaying now.",
		}),
	}
}

// Collectors are the gateway's metrics, for the node's registry.
func (g *Gateway) Collectors() []prometheus.Collector {
	return []prometheus.Collector{g.metrics.conns, g.metrics.dns, g.metrics.bytes, g.metrics.active}
}
