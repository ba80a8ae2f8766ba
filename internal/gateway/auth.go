package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// Bounds of what anonymous clients can make the gateway remember: keys
// and signatures are remembered by their sha256, in bounded LRUs.
const (
	validKeys    = 4096
	invalidKeys  = 4096
	invalidSigs  = 4096
	knownSigs    = 16384           // signed URLs whose sandbox is remembered
	invalidTTL   = 2 * time.Second // a key or sandbox added works this soon
	tokenReadGap = 250 * time.Millisecond
	// tokenReadTimeout bounds one read of every running sandbox's token.
	tokenReadTimeout = 10 * time.Second
	// keyConfirmTTL is how long a key confirmed valid is trusted before
	// it is asked about again: a revoked key stops working this soon on
	// every gateway.
	keyConfirmTTL = 500 * time.Millisecond
)

// keyStore is what the gateway asks about API keys (the cluster's
// database).
type keyStore interface {
	KeyByDigest(ctx context.Context, digest string) (*auth.Key, error)
	TouchKey(ctx context.Context, id string, at time.Time) error
}

// tokenStore is where the gateway reads running sandboxes' envd tokens.
type tokenStore interface {
	RunningTokens(ctx context.Context) ([]postgres.SandboxToken, error)
}

// keyCache remembers API key checks for a while, so that steady traffic
// costs the database one query per key per ttl; a revoked key stops
// working within ttl. Keys are remembered by digest, valid and invalid
// ones apart, so that random keys can neither grow the gateway nor push
// out the valid ones.
type keyCache struct {
	db  keyStore
	ttl time.Duration
	// valid holds each key's principal and when it was last confirmed:
	// past ttl it is asked about again, but stays valid while the
	// database is away.
	valid *lru.Cache[[sha256.Size]byte, confirmedKey]
	// invalid entries expire after invalidTTL, so that a key just added
	// works soon.
	invalid *expirable.LRU[[sha256.Size]byte, struct{}]
	// used says when a key's last-used time is due to be written.
	used *auth.UseRecorder
}

// confirmedKey is a key found valid, and when.
type confirmedKey struct {
	principal auth.Principal
	expires   time.Time // zero: never
	at        time.Time
}

// keyUseGap is how often a key's last-used time is written.
const keyUseGap = time.Minute

func newKeyCache(db keyStore, ttl time.Duration) *keyCache {
	valid, err := lru.New[[sha256.Size]byte, confirmedKey](validKeys)
	if err != nil {
		panic(fmt.Sprintf("cache of %d valid keys: %v", validKeys, err)) // only for a size < 1
	}
	return &keyCache{db: db, ttl: ttl, valid: valid, used: auth.NewUseRecorder(keyUseGap, validKeys),
		invalid: expirable.NewLRU[[sha256.Size]byte, struct{}](invalidKeys, nil, invalidTTL)}
}

// cached reports what is remembered of key: known is false when nothing
// is, or its confirmation is older than ttl.
func (c *keyCache) cached(digest [sha256.Size]byte) (p auth.Principal, ok, known bool) {
	if k, hit := c.valid.Get(digest); hit && time.Since(k.at) < c.ttl && usableAt(k.expires, time.Now()) {
		return k.principal, true, true
	}
	if _, hit := c.invalid.Get(digest); hit {
		return auth.Principal{}, false, true
	}
	return auth.Principal{}, false, false
}

func usableAt(expires, now time.Time) bool { return expires.IsZero() || now.Before(expires) }

// check asks the database about key and remembers the answer.
func (c *keyCache) check(ctx context.Context, digest [sha256.Size]byte) (auth.Principal, bool, error) {
	now := time.Now()
	k, err := c.db.KeyByDigest(ctx, hex.EncodeToString(digest[:]))
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		k = nil
	case err != nil:
		// The database is away: a key seen valid before stays valid
		// until it expires.
		seen, ok := c.valid.Get(digest)
		return seen.principal, ok && usableAt(seen.expires, now), err
	}
	if k == nil || !k.Usable(now) {
		// Revoked or expired: not even a database outage brings it back.
		c.valid.Remove(digest)
		c.invalid.Add(digest, struct{}{})
		return auth.Principal{}, false, nil
	}
	p := auth.Principal{TeamID: k.TeamID, KeyID: k.ID, KeyName: k.Name, Admin: k.Admin}
	c.valid.Add(digest, confirmedKey{principal: p, expires: k.ExpiresAt, at: now})
	if c.used.Due(k.ID, now) {
		// Best effort: a key's last use is for people to read, and a
		// failed write must not fail the request.
		_ = c.db.TouchKey(ctx, k.ID, now)
	}
	return p, true, nil
}

// seenValid reports whether key was confirmed valid at some time and not
// refused since: such a key is asked about again even from an address
// over its failure limit, so that one client's bad key cannot lock out
// the good ones behind the same address (a NAT, a proxy, a trainer's
// host).
func (c *keyCache) seenValid(digest [sha256.Size]byte) bool {
	return c.valid.Contains(digest)
}

// authorize finds who r is made by when it carries one of the cluster's
// keys, and otherwise answers it: 401, or 429 once its address has failed
// too often. A valid key remembered passes even then; an address over its
// limit costs no database query.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	key := api.RequestKey(r)
	if key == "" {
		g.refuse(w, r, errdefs.ErrUnauthenticated, "missing or invalid API key (X-API-Key header)")
		return auth.Principal{}, false
	}
	if g.cfg.APIKey != "" && len(key) <= api.MaxKeyBytes &&
		subtle.ConstantTimeCompare([]byte(key), []byte(g.cfg.APIKey)) == 1 {
		return g.actAsChecked(w, r, auth.Operator())
	}
	var digest [sha256.Size]byte
	var p auth.Principal
	ok, known := false, false
	if len(key) <= api.MaxKeyBytes {
		digest = sha256.Sum256([]byte(key))
		p, ok, known = g.keys.cached(digest)
	}
	if ok {
		return g.actAsChecked(w, r, p)
	}
	if retry, blocked := g.authFails.Blocked(r); blocked && (len(key) > api.MaxKeyBytes || !g.keys.seenValid(digest)) {
		api.WriteTooManyAuthFailures(w, retry)
		return auth.Principal{}, false
	}
	if len(key) > api.MaxKeyBytes {
		g.authFails.Failed(r)
		g.refuse(w, r, errdefs.ErrUnauthenticated, "invalid API key: longer than any key (X-API-Key header)")
		return auth.Principal{}, false
	}
	if !known {
		g.queries.Add(1)
		var err error
		if p, ok, err = g.keys.check(r.Context(), digest); err != nil {
			g.logger.WarnContext(r.Context(), "cannot check an API key", "err", err)
			if !ok {
				g.refuse(w, r, errdefs.ErrUnavailable, "the cluster's database is unavailable; try again")
				return auth.Principal{}, false
			}
		}
	}
	if !ok {
		g.authFails.Failed(r)
		g.refuse(w, r, errdefs.ErrUnauthenticated, "missing or invalid API key (X-API-Key header)")
		return auth.Principal{}, false
	}
	return g.actAsChecked(w, r, p)
}

// actAsChecked is api.ActAs, answering r itself when its team header is
// malformed.
func (g *Gateway) actAsChecked(w http.ResponseWriter, r *http.Request, p auth.Principal) (auth.Principal, bool) {
	p, err := api.ActAs(r, p)
	if err != nil {
		g.refuse(w, r, errdefs.ErrInvalidArgument, err.Error())
		return auth.Principal{}, false
	}
	return p, true
}

// tokenSet finds which running sandbox's envd token signed a file URL:
// among the tokens read last, else among tokens read afresh (a sandbox
// made a moment ago must be found). Reads are shared by the requests
// waiting for them and at least tokenReadGap apart (sharedRead), and no
// lock is held during one; a signature found by no sandbox is remembered
// (by digest, bounded) for invalidTTL. So random signatures cost the
// database at most one read per gap, whoever sends them.
//
// A signed URL names no sandbox, so a new one costs a hash per running
// sandbox of the cluster; the sandbox found is remembered by the URL's
// digest, so fetching the same URL again costs one hash.
type tokenSet struct {
	db tokenStore
	// queries counts the reads, among the database round trips made for
	// requests.
	queries *atomic.Int64
	reads   *sharedRead

	mu     sync.Mutex
	tokens []postgres.SandboxToken
	byID   map[string]string // tokens by sandbox
	readAt time.Time         // when the read that gave tokens began
	// misses are signatures no sandbox made, forgotten after invalidTTL.
	misses *expirable.LRU[[sha256.Size]byte, struct{}]
	// signers are the sandboxes that made signatures seen lately.
	signers *lru.Cache[[sha256.Size]byte, string]
}

func newTokenSet(db tokenStore, gap time.Duration, queries *atomic.Int64) *tokenSet {
	signers, _ := lru.New[[sha256.Size]byte, string](knownSigs) // fails only for a size < 1
	s := &tokenSet{db: db, queries: queries, signers: signers,
		misses: expirable.NewLRU[[sha256.Size]byte, struct{}](invalidSigs, nil, invalidTTL)}
	s.reads = newSharedRead(s.read, func() time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.readAt
	}, gap, tokenReadTimeout)
	return s
}

// signedRequest is a request of a signed file URL, read once: its signature, and a digest
// of what it signs and the signature (the key of the caches).
type signedRequest struct {
	sig api.FileSignature
	key [sha256.Size]byte
}

func readSignedRequest(r *http.Request) signedRequest {
	q := r.URL.Query()
	return signedRequest{sig: api.ParseFileSignature(r),
		key: sha256.Sum256([]byte(r.Method + "\x00" + q.Get("path") + "\x00" + q.Get("username") + "\x00" +
			q.Get("signature_expiration") + "\x00" + q.Get("signature")))}
}

// missed reports whether u was refused a moment ago (within invalidTTL).
func (s *tokenSet) missed(u signedRequest) bool {
	_, hit := s.misses.Get(u.key)
	return hit
}

// signer returns the sandbox whose token signed u ("" for none), for a
// request that arrived at arrived and whose signer is not among the
// tokens held (see match): it looks among tokens read since.
func (s *tokenSet) signer(ctx context.Context, u signedRequest, arrived time.Time) (string, error) {
	if err := s.reads.since(ctx, arrived); err != nil {
		return "", err
	}
	if id := s.match(u); id != "" {
		return id, nil
	}
	s.misses.Add(u.key, struct{}{})
	return "", nil
}

// known returns the sandbox remembered for u if it still runs with the
// token that made u's signature, else "": one hash.
func (s *tokenSet) known(u signedRequest) string {
	id, ok := s.signers.Get(u.key)
	if !ok {
		return ""
	}
	s.mu.Lock()
	token, ok := s.byID[id]
	s.mu.Unlock()
	if ok && u.sig.MadeWith(token) {
		return id
	}
	return ""
}

// match finds u's signer among the tokens held: the sandbox remembered
// for it, else by trying each.
func (s *tokenSet) match(u signedRequest) string {
	if id := s.known(u); id != "" {
		return id
	}
	s.mu.Lock()
	tokens := s.tokens
	s.mu.Unlock()
	for _, t := range tokens {
		if u.sig.MadeWith(t.Token) {
			s.signers.Add(u.key, t.ID)
			return t.ID
		}
	}
	return ""
}

// read reads the tokens (for reads).
func (s *tokenSet) read(ctx context.Context) error {
	start := time.Now()
	s.queries.Add(1)
	tokens, err := s.db.RunningTokens(ctx)
	if err != nil {
		return err
	}
	byID := make(map[string]string, len(tokens))
	for _, t := range tokens {
		byID[t.ID] = t.Token
	}
	s.mu.Lock()
	s.tokens, s.byID, s.readAt = tokens, byID, start
	s.mu.Unlock()
	return nil
}
