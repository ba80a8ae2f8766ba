package api

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net/http"
	"sync"
	"time"
)

// headerIdempotencyKey lets a client retry a create or fork whose answer
// it lost and get the same sandboxes instead of a second set.
const headerIdempotencyKey = "Idempotency-Key"

const (
	idempotencyTTL        = 10 * time.Minute
	maxIdempotencyEntries = 10000
	maxIdempotencyKeyLen  = 256
)

// idempotency remembers the answers of requests that carried an
// Idempotency-Key. A retry with the same key and body gets the first
// answer (waiting for it if the first is still running); the same key
// with another body is refused. Answers to requests whose client left
// before the end are not kept: such a request made nothing (a cancelled
// create or fork undoes itself), so its retry runs afresh.
type idempotency struct {
	mu      sync.Mutex
	entries map[string]*idemEntry
	order   []string // insertion order, for eviction
}

type idemEntry struct {
	bodyHash [32]byte
	done     chan struct{} // closed when the answer is known
	status   int
	header   http.Header
	body     []byte
	expires  time.Time
	keep     bool // false: the first request was abandoned; retry afresh
	settled  bool // the answer is known (done is closed); guarded by mu
}

func newIdempotency() *idempotency {
	return &idempotency{entries: map[string]*idemEntry{}}
}

// idempotent makes h answer once per Idempotency-Key: retries replay the
// first answer.
func (s *Server) idempotent(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		key := r.Header.Get(headerIdempotencyKey)
		if key == "" {
			return h(w, r)
		}
		if len(key) > maxIdempotencyKeyLen {
			return badRequest("Idempotency-Key is longer than 256 characters")
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxJSONBytes))
		if err != nil {
			return err
		}
		scope := r.Method + " " + r.URL.Path + " " + key
		for {
			e, first := s.idem.claim(scope, sha256.Sum256(body))
			if e == nil {
				return &apiError{http.StatusUnprocessableEntity, "Idempotency-Key was used with a different request"}
			}
			if first {
				rec := &bufferedResponse{header: http.Header{}, status: http.StatusOK}
				r.Body = io.NopCloser(bytes.NewReader(body))
				if herr := h(rec, r); herr != nil {
					writeError(rec, r, s.logger, herr)
				}
				s.idem.settle(scope, e, rec, r.Context().Err() == nil)
				replay(w, e)
				return nil
			}
			select {
			case <-e.done:
			case <-r.Context().Done():
				return r.Context().Err()
			}
			if e.keep {
				replay(w, e)
				return nil
			}
			// The first request was abandoned by its client and made
			// nothing: run this one.
		}
	}
}

// claim returns the entry of scope and whether the caller is the first
// (and must settle it); nil when the key was used with another body.
func (c *idempotency) claim(scope string, bodyHash [32]byte) (*idemEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	// An entry in the map is running or settled and kept (settle drops
	// the others).
	if e, ok := c.entries[scope]; ok && (!e.settled || now.Before(e.expires)) {
		if e.bodyHash != bodyHash {
			return nil, false
		}
		return e, false
	}
	e := &idemEntry{bodyHash: bodyHash, done: make(chan struct{}), expires: now.Add(idempotencyTTL)}
	c.entries[scope] = e
	c.order = append(c.order, scope)
	c.evict(now)
	return e, true
}

func (c *idempotency) settle(scope string, e *idemEntry, rec *bufferedResponse, keep bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.status, e.header, e.body, e.keep, e.settled = rec.status, rec.header, rec.buf.Bytes(), keep, true
	e.expires = time.Now().Add(idempotencyTTL)
	close(e.done)
	if !keep && c.entries[scope] == e {
		delete(c.entries, scope)
	}
}

// evict drops expired answers, and the oldest ones past the bound.
func (c *idempotency) evict(now time.Time) {
	for len(c.order) > 0 {
		scope := c.order[0]
		e, ok := c.entries[scope]
		stale := !ok || (e.settled && now.After(e.expires))
		if !stale && len(c.entries) <= maxIdempotencyEntries {
			return
		}
		if ok && (stale || e.settled) {
			delete(c.entries, scope)
		} else if ok {
			return // the oldest is still running; keep it
		}
		c.order = c.order[1:]
	}
}

func replay(w http.ResponseWriter, e *idemEntry) {
	for k, v := range e.header {
		w.Header()[k] = v
	}
	w.WriteHeader(e.status)
	w.Write(e.body)
}

// bufferedResponse keeps a whole (small) answer for replay.
type bufferedResponse struct {
	header http.Header
	status int
	buf    bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) WriteHeader(status int)      { b.status = status }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.buf.Write(p) }
