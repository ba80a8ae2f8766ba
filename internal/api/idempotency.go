package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// headerIdempotencyKey lets a client retry a create or fork whose answer
// it lost and get the same sandboxes instead of a second set.
const headerIdempotencyKey = "Idempotency-Key"

// HeaderIdempotencyKey is headerIdempotencyKey, for a gateway.
const HeaderIdempotencyKey = headerIdempotencyKey

const (
	// IdempotencyTTL is how long an answer is kept for replay.
	IdempotencyTTL        = 10 * time.Minute
	maxIdempotencyEntries = 10000
	maxIdempotencyKeyLen  = 256
)

// ErrIdempotencyMismatch: the key was used with another request body.
var ErrIdempotencyMismatch = errors.New("Idempotency-Key was used with a different request")

// IdempotentAnswer is a kept answer, replayed to retries.
type IdempotentAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

// IdempotencyStore keeps the answers of requests that carried an
// Idempotency-Key: in memory for a single server, in the cluster's
// database for gateways.
type IdempotencyStore interface {
	// Claim returns, for the request of scope whose body has digest
	// bodyHash, either the answer to replay or the run the caller makes
	// (and must end). It waits, within ctx, while another holds scope. A
	// scope used with another body is ErrIdempotencyMismatch.
	Claim(ctx context.Context, scope, bodyHash [32]byte) (*IdempotentAnswer, IdempotencyRun, error)
}

// IdempotencyRun is the caller's hold on a scope while it runs the
// request. Exactly one of Settle and Release ends it.
type IdempotencyRun interface {
	// Prior is what an earlier holder, gone without an answer, noted
	// ("" for a fresh scope).
	Prior() string
	// Note records what the holder is about to do, for a taker should it
	// die.
	Note(ctx context.Context, note string) error
	// Settle keeps the answer for retries (keep), or forgets the scope: a
	// request that made nothing, whose retry runs afresh.
	Settle(ctx context.Context, a *IdempotentAnswer, keep bool) error
	// Release gives the scope up unanswered, notes kept: the next retry
	// takes it over at once.
	Release(ctx context.Context) error
}

type runKey struct{}

// IdempotencyRunOf returns the run of the request of ctx, nil when it
// carried no Idempotency-Key.
func IdempotencyRunOf(ctx context.Context) IdempotencyRun {
	run, _ := ctx.Value(runKey{}).(IdempotencyRun)
	return run
}

// IdempotencyScope is what a request's Idempotency-Key names: the key of
// this caller (by its credential's digest, so that two callers' keys never
// meet) on this route.
func IdempotencyScope(r *http.Request) [32]byte {
	cred := sha256.Sum256([]byte(RequestKey(r)))
	return sha256.Sum256(fmt.Appendf(nil, "%x %s %s %s", cred, r.Method, r.URL.Path, r.Header.Get(headerIdempotencyKey)))
}

// IdempotentOptions tune Idempotent.
type IdempotentOptions struct {
	MaxBody int64
	// Detach, when set, runs the request to its end even if the client
	// leaves, within that long: its answer is then always known and kept.
	// Without it, a request whose client left is taken to have undone
	// itself, and its retry runs afresh.
	Detach time.Duration
}

// Idempotent makes h answer once per Idempotency-Key: retries replay the
// first answer. h finds its run with IdempotencyRunOf.
func Idempotent(st IdempotencyStore, opts IdempotentOptions, logger *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := serveIdempotent(st, opts, logger, w, r, h); err != nil {
			writeError(w, r, logger, err)
		}
	})
}

func serveIdempotent(st IdempotencyStore, opts IdempotentOptions, logger *slog.Logger,
	w http.ResponseWriter, r *http.Request, h http.Handler) error {
	key := r.Header.Get(headerIdempotencyKey)
	if key == "" {
		h.ServeHTTP(w, r)
		return nil
	}
	if len(key) > maxIdempotencyKeyLen {
		return badRequest("Idempotency-Key is longer than 256 characters")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, opts.MaxBody))
	if err != nil {
		return err
	}
	ans, run, err := st.Claim(r.Context(), IdempotencyScope(r), sha256.Sum256(body))
	switch {
	case errors.Is(err, ErrIdempotencyMismatch):
		return &apiError{http.StatusUnprocessableEntity, ErrIdempotencyMismatch.Error()}
	case err != nil:
		return err
	case ans != nil:
		replay(w, ans)
		return nil
	}
	ctx := r.Context()
	if opts.Detach > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), opts.Detach)
		defer cancel()
	}
	rec := &bufferedResponse{header: http.Header{}, status: http.StatusOK}
	r = r.WithContext(context.WithValue(ctx, runKey{}, run))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	h.ServeHTTP(rec, r)
	ans = &IdempotentAnswer{Status: rec.status, Header: rec.header, Body: rec.buf.Bytes()}
	// The answer is stored even when the client has left: a detached
	// context bounds the write.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := run.Settle(sctx, ans, ctx.Err() == nil); err != nil {
		// Unsettled, the scope passes to a taker once the hold lapses.
		logger.WarnContext(ctx, "cannot keep an idempotent answer", "err", err)
	}
	replay(w, ans)
	return nil
}

// idempotent makes h answer once per Idempotency-Key, over the server's
// store.
func (s *Server) idempotent(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, s.logger, err)
		}
	})
	return func(w http.ResponseWriter, r *http.Request) error {
		return serveIdempotent(s.idem, IdempotentOptions{MaxBody: s.cfg.MaxJSONBytes}, s.logger, w, r, inner)
	}
}

// idempotency is the in-memory IdempotencyStore of a single server. A
// retry with the same key and body gets the first answer (waiting for it
// if the first is still running); the same key with another body is
// refused. Answers to requests whose client left before the end are not
// kept: such a request made nothing (a cancelled create or fork undoes
// itself), so its retry runs afresh.
type idempotency struct {
	mu      sync.Mutex
	entries map[[32]byte]*idemEntry
	order   [][32]byte // insertion order, for eviction
}

type idemEntry struct {
	bodyHash [32]byte
	done     chan struct{} // closed when the answer is known
	answer   *IdempotentAnswer
	expires  time.Time
	keep     bool // false: the first request was abandoned; retry afresh
	settled  bool // the answer is known (done is closed); guarded by mu
}

func newIdempotency() *idempotency {
	return &idempotency{entries: map[[32]byte]*idemEntry{}}
}

func (c *idempotency) Claim(ctx context.Context, scope, bodyHash [32]byte) (*IdempotentAnswer, IdempotencyRun, error) {
	for {
		e, first := c.claim(scope, bodyHash)
		if e == nil {
			return nil, nil, ErrIdempotencyMismatch
		}
		if first {
			return nil, &memRun{c: c, scope: scope, e: e}, nil
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if e.keep {
			return e.answer, nil, nil
		}
		// The first request was abandoned by its client and made
		// nothing: run this one.
	}
}

// claim returns the entry of scope and whether the caller is the first
// (and must settle it); nil when the key was used with another body.
func (c *idempotency) claim(scope, bodyHash [32]byte) (*idemEntry, bool) {
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
	e := &idemEntry{bodyHash: bodyHash, done: make(chan struct{}), expires: now.Add(IdempotencyTTL)}
	c.entries[scope] = e
	c.order = append(c.order, scope)
	c.evict(now)
	return e, true
}

// memRun is a hold on an in-memory entry; a server has no takers, so
// notes are not kept.
type memRun struct {
	c     *idempotency
	scope [32]byte
	e     *idemEntry
}

func (m *memRun) Prior() string                      { return "" }
func (m *memRun) Note(context.Context, string) error { return nil }
func (m *memRun) Release(context.Context) error {
	m.c.settle(m.scope, m.e, &IdempotentAnswer{}, false)
	return nil
}

func (m *memRun) Settle(_ context.Context, a *IdempotentAnswer, keep bool) error {
	m.c.settle(m.scope, m.e, a, keep)
	return nil
}

func (c *idempotency) settle(scope [32]byte, e *idemEntry, a *IdempotentAnswer, keep bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.settled {
		return
	}
	e.answer, e.keep, e.settled = a, keep, true
	e.expires = time.Now().Add(IdempotencyTTL)
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

func replay(w http.ResponseWriter, a *IdempotentAnswer) {
	for k, v := range a.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(a.Status)
	w.Write(a.Body)
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

// Flush does nothing: the answer goes out whole once known (a handler
// forwarding through a reverse proxy flushes).
func (b *bufferedResponse) Flush() {}
