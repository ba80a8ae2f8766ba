// Package audit records who did what to which object, when, from where,
// and with what result: every change made through the control plane
// (creates, kills, pauses, forks, builds, team and key changes; never a
// secret's value, since bodies are not kept). Events go to the store, in
// batches off the request's path, and to an optional JSON lines file for
// shipping to a log system.
//
// In a cluster the gateways record what they serve; the nodes, called only
// by gateways (with the cluster secret), keep no audit log of their own.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Event is one change asked of the control plane.
type Event struct {
	// Seq orders events; the store assigns it.
	Seq     int64     `json:"seq"`
	At      time.Time `json:"at"`
	TeamID  string    `json:"teamID"`
	KeyID   string    `json:"keyID"`
	KeyName string    `json:"keyName"`
	Admin   bool      `json:"admin"`
	// Action is the route: method and path pattern, such as
	// "POST /sandboxes/{id}/pause".
	Action string `json:"action"`
	// Object is the ID the change was made to: the path's (a fork's
	// source), or for a create the one its answer names.
	Object string `json:"object"`
	// Status is the HTTP status of the answer.
	Status    int    `json:"status"`
	Remote    string `json:"remote"`
	RequestID string `json:"requestID"`
}

// Filter selects events, newest first.
type Filter struct {
	TeamID, Action, Object string
	Since, Until           time.Time // zero: unbounded
	// Before pages: only events with a smaller Seq (0: from the newest).
	Before int64
	Limit  int
}

// MaxLimit bounds the events one read returns.
const MaxLimit = 1000

// Store keeps events.
type Store interface {
	AppendAudit(ctx context.Context, events []Event) error
	ListAudit(ctx context.Context, f Filter) ([]Event, error)
	// PurgeAudit deletes the events older than before.
	PurgeAudit(ctx context.Context, before time.Time) (int64, error)
}

// Log takes events from requests and writes them in the background.
type Log struct {
	store     Store
	file      io.Writer // nil: none
	retention time.Duration
	logger    *slog.Logger

	queue   chan Event
	dropped atomic.Int64
	flush   chan chan struct{}
	stop    chan struct{}
	done    sync.WaitGroup
}

// Options configure a Log.
type Options struct {
	// File receives each event as a JSON line too; nil: none.
	File io.Writer
	// Retention is how long events are kept in the store (0: for ever).
	Retention time.Duration
	// Queue bounds the events waiting to be written; past it they are
	// dropped and counted, so that a slow store never slows requests.
	Queue int
}

// batchEvery is how long an event waits at most before it is written.
const batchEvery = 200 * time.Millisecond

// maxBatch bounds the events written in one transaction.
const maxBatch = 500

// New starts a Log over store.
func New(store Store, opts Options, logger *slog.Logger) *Log {
	if opts.Queue <= 0 {
		opts.Queue = 10_000
	}
	l := &Log{store: store, file: opts.File, retention: opts.Retention, logger: logger,
		queue: make(chan Event, opts.Queue), flush: make(chan chan struct{}), stop: make(chan struct{})}
	l.done.Add(1)
	go l.run()
	return l
}

// Record queues e; it never blocks.
func (l *Log) Record(e Event) {
	select {
	case l.queue <- e:
	default:
		if l.dropped.Add(1)%1000 == 1 {
			l.logger.Warn("audit queue full; events dropped", "dropped", l.dropped.Load())
		}
	}
}

// Dropped counts the events dropped: past a full queue, or past the
// queue's size while the store could not take them.
func (l *Log) Dropped() int64 { return l.dropped.Load() }

// Collector is the Prometheus counter of the events dropped, for an
// alert: the audit log has holes.
func (l *Log) Collector() prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "aenv_audit_events_dropped_total",
		Help: "Audit events dropped because the database could not take them in time.",
	}, func() float64 { return float64(l.Dropped()) })
}

// Flush returns once the events queued before it are written.
func (l *Log) Flush(ctx context.Context) {
	done := make(chan struct{})
	select {
	case l.flush <- done:
	case <-ctx.Done():
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Close writes what is queued and stops.
func (l *Log) Close() {
	close(l.stop)
	l.done.Wait()
}

func (l *Log) run() {
	defer l.done.Done()
	tick := time.NewTicker(batchEvery)
	defer tick.Stop()
	// pending are the events taken from the queue and not yet stored; a
	// failed write keeps them for the next tick, up to the queue's size.
	var pending []Event
	failing := false
	lastPurge := time.Time{}
	take := func() {
		for {
			select {
			case e := <-l.queue:
				pending = append(pending, e)
			default:
				return
			}
		}
	}
	for {
		select {
		case e := <-l.queue:
			pending = append(pending, e)
			// A full batch is written at once, unless the last write
			// failed: then the tick retries, not every new event.
			if len(pending) >= maxBatch && !failing {
				pending = l.write(pending)
				failing = len(pending) > 0
			}
		case <-tick.C:
			pending = l.write(pending)
			failing = len(pending) > 0
			if l.retention > 0 && time.Since(lastPurge) > time.Hour {
				lastPurge = time.Now()
				l.purge()
			}
		case done := <-l.flush:
			take()
			pending = l.write(pending)
			failing = len(pending) > 0
			close(done)
		case <-l.stop:
			take()
			if pending = l.write(pending); len(pending) > 0 {
				l.logger.Error("audit events not stored at stop", "events", len(pending))
			}
			return
		}
	}
}

// writeTimeout bounds one batch's write to the store.
const writeTimeout = 10 * time.Second

// write copies the events not copied yet to the file and stores events
// in batches; it returns those the store did not take (it failed), which
// the next write tries again, the oldest dropped past the queue's size.
func (l *Log) write(events []Event) []Event {
	if l.file != nil {
		for i := range events {
			if events[i].Seq != 0 {
				continue // copied on an earlier, failed write
			}
			events[i].Seq = -1 // copied; the store assigns the real one
			line, _ := json.Marshal(withoutSeq(events[i]))
			if _, err := l.file.Write(append(line, '\n')); err != nil {
				l.logger.Warn("write audit file", "err", err)
				break
			}
		}
	}
	for len(events) > 0 {
		n := min(len(events), maxBatch)
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		err := l.store.AppendAudit(ctx, events[:n])
		cancel()
		if err != nil {
			l.logger.Error("write audit events; kept to try again", "events", len(events), "err", err)
			if over := len(events) - cap(l.queue); over > 0 {
				l.dropped.Add(int64(over))
				events = events[over:]
			}
			return events
		}
		events = events[n:]
	}
	return nil
}

// withoutSeq is e as the file gets it: the store's Seq is not known yet.
func withoutSeq(e Event) Event {
	e.Seq = 0
	return e
}

func (l *Log) purge() {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	n, err := l.store.PurgeAudit(ctx, time.Now().Add(-l.retention))
	switch {
	case err != nil:
		l.logger.Warn("purge old audit events", "err", err)
	case n > 0:
		l.logger.Info("purged old audit events", "events", n, "retention", l.retention)
	}
}

// ErrBadFilter is a filter that cannot be read.
var ErrBadFilter = errors.New("bad audit filter")

// CheckFilter bounds f's limit (default 100) and says why f cannot be
// used, or nil.
func CheckFilter(f *Filter) error {
	switch {
	case f.Limit == 0:
		f.Limit = 100
	case f.Limit < 0 || f.Limit > MaxLimit:
		return fmt.Errorf("%w: limit %d: must be between 1 and %d", ErrBadFilter, f.Limit, MaxLimit)
	}
	if f.Before < 0 {
		return fmt.Errorf("%w: before %d", ErrBadFilter, f.Before)
	}
	return nil
}

// List reads the stored events f selects, with the events queued until
// now written first, so that a caller reads its own changes.
func (l *Log) List(ctx context.Context, f Filter) ([]Event, error) {
	fctx, cancel := context.WithTimeout(ctx, writeTimeout)
	l.Flush(fctx)
	cancel()
	return l.store.ListAudit(ctx, f)
}
