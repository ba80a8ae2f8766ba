package api

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// MaxKeyBytes bounds an API key: E2B's keys and aenv's generated ones are
// 44 bytes. A longer one is refused before it is compared, looked up or
// remembered, so that its size costs nothing.
const MaxKeyBytes = 256

// Failed authentication per client address: a burst, then a steady rate.
// Generous for a person mistyping a key or a script retrying; a guesser
// gets a few attempts a second, each of which may cost a database query
// on a gateway.
const (
	authFailBurst = 20
	authFailEvery = 500 * time.Millisecond
	// authAddrs bounds the addresses remembered; past it the least recently
	// failing one is forgotten (it starts afresh with a full burst).
	authAddrs = 8192
)

// AuthLimiter counts failed authentications per client address (an IPv6
// client by its /64, which one host usually holds whole): each address
// has a token bucket of authFailBurst refilled every authFailEvery. Its
// memory is bounded: at most authAddrs buckets, the least recently used
// forgotten first.
type AuthLimiter struct {
	now      func() time.Time
	limiters *lru.Cache[netip.Prefix, *rate.Limiter]
}

// NewAuthLimiter makes an empty limiter.
func NewAuthLimiter() *AuthLimiter {
	limiters, err := lru.New[netip.Prefix, *rate.Limiter](authAddrs)
	if err != nil {
		panic(fmt.Sprintf("auth limiter of %d addresses: %v", authAddrs, err)) // only for a size < 1
	}
	return &AuthLimiter{now: time.Now, limiters: limiters}
}

// clientPrefix is the address a request is counted under: the peer's (a
// proxy in front makes all its clients one).
func clientPrefix(r *http.Request) netip.Prefix {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}
	}
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}

// Blocked reports whether r's address has no failures left, and when it
// will have one. An address that never failed is not remembered.
func (l *AuthLimiter) Blocked(r *http.Request) (retryAfter time.Duration, blocked bool) {
	lim, ok := l.limiters.Get(clientPrefix(r))
	if !ok {
		return 0, false
	}
	tokens := lim.TokensAt(l.now())
	if tokens >= 1 {
		return 0, false
	}
	return time.Duration((1 - tokens) * float64(authFailEvery)), true
}

// Failed counts a failed authentication of r's address: it takes one of
// the address's tokens, if it has one left.
func (l *AuthLimiter) Failed(r *http.Request) {
	p := clientPrefix(r)
	lim, ok := l.limiters.Get(p)
	if !ok {
		fresh := rate.NewLimiter(rate.Every(authFailEvery), authFailBurst)
		// Another request of the same address may have added one meanwhile:
		// both must count in the same bucket.
		if prev, found, _ := l.limiters.PeekOrAdd(p, fresh); found {
			lim = prev
		} else {
			lim = fresh
		}
	}
	lim.AllowN(l.now(), 1)
}

// WriteTooManyAuthFailures answers a client that failed to authenticate
// too often: 429 with Retry-After.
func WriteTooManyAuthFailures(w http.ResponseWriter, retryAfter time.Duration) {
	secs := max(int(math.Ceil(retryAfter.Seconds())), 1)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	WriteErrorJSON(w, http.StatusTooManyRequests, fmt.Sprintf(
		"too many requests with an invalid API key or signature from this address; retry in %d s", secs))
}
