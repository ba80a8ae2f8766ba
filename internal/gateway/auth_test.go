package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// fakeDB is the cluster database as the gateway's auth sees it: keys and
// running sandboxes' tokens, counting the questions asked.
type fakeDB struct {
	keys       map[string]bool
	keyQueries atomic.Int64
	down       atomic.Bool // key checks fail as in a database outage

	mu          sync.Mutex
	tokens      []postgres.SandboxToken
	tokenReads  atomic.Int64
	tokensDown  atomic.Bool   // token reads fail as in a database outage
	blockTokens chan struct{} // when set, reads wait for it to close
}

func (f *fakeDB) KeyByDigest(ctx context.Context, digest string) (*auth.Key, error) {
	f.keyQueries.Add(1)
	if f.down.Load() {
		return nil, errors.New("connection refused")
	}
	for key, ok := range f.keys {
		if ok && auth.Digest(key) == digest {
			return &auth.Key{ID: digest[:16], TeamID: auth.DefaultTeam, Digest: digest}, nil
		}
	}
	return nil, store.ErrNotFound
}

func (f *fakeDB) TouchKey(context.Context, string, time.Time) error { return nil }

func (f *fakeDB) RunningTokens(ctx context.Context) ([]postgres.SandboxToken, error) {
	f.tokenReads.Add(1)
	f.mu.Lock()
	block := f.blockTokens
	tokens := append([]postgres.SandboxToken(nil), f.tokens...)
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if f.tokensDown.Load() {
		return nil, errors.New("connection refused")
	}
	return tokens, nil
}

func authGateway(db *fakeDB) *Gateway {
	return &Gateway{logger: slog.New(slog.DiscardHandler), keys: newKeyCache(db, 30*time.Second),
		tokens: newTokenSet(db, tokenReadGap, new(atomic.Int64)), authFails: api.NewAuthLimiter()}
}

// authorizeFrom runs g.authorize on a request with key from addr.
func authorizeFrom(g *Gateway, addr, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/sandboxes", nil)
	r.RemoteAddr = addr + ":1234"
	r.Header.Set("X-API-Key", key)
	w := httptest.NewRecorder()
	if _, ok := g.authorize(w, r); ok {
		w.WriteHeader(http.StatusNoContent)
	}
	return w
}

func randomKey(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestAuthorizeBoundsAnonymousKeys: what anonymous clients send as keys
// costs the gateway a bounded amount of memory and of database queries.
// Before, every rejected key was kept whole (headers reach 1 MiB) until
// 100,000 of them, each after its own query.
func TestAuthorizeBoundsAnonymousKeys(t *testing.T) {
	const valid = "e2b_0123456789abcdef0123456789abcdef01234567"
	db := &fakeDB{keys: map[string]bool{valid: true}}
	g := authGateway(db)

	// Keys longer than any key: refused without a query or a trace.
	for i := range 50 {
		w := authorizeFrom(g, fmt.Sprintf("10.1.0.%d", i), strings.Repeat("k", 64<<10))
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("64 KiB key: status %d, want 401", w.Code)
		}
	}
	if n := db.keyQueries.Load(); n != 0 {
		t.Errorf("over-long keys cost %d database queries, want 0", n)
	}

	// Many random keys, from as many addresses: remembered by digest, at
	// most invalidKeys of them.
	const random = 3 * invalidKeys
	for i := range random {
		w := authorizeFrom(g, fmt.Sprintf("10.2.%d.%d", i/256, i%256), randomKey(200))
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("random key: status %d, want 401", w.Code)
		}
	}
	if n := g.keys.invalid.Len(); n > invalidKeys {
		t.Errorf("%d invalid keys remembered, want at most %d", n, invalidKeys)
	}
	// The same wrong key again is answered from memory.
	before := db.keyQueries.Load()
	for range 5 {
		authorizeFrom(g, "10.3.0.1", "wrong")
	}
	if n := db.keyQueries.Load() - before; n != 1 {
		t.Errorf("one wrong key sent 5 times cost %d queries, want 1", n)
	}

	// The valid key works, once asked about, without a query.
	for range 3 {
		if w := authorizeFrom(g, "10.4.0.1", valid); w.Code != http.StatusNoContent {
			t.Fatalf("valid key: status %d %s", w.Code, w.Body)
		}
	}
	if n := db.keyQueries.Load() - before; n != 2 {
		t.Errorf("valid key used 3 times: %d more queries, want 1", n-1)
	}
}

// TestAuthorizeLimitsFailuresPerAddress: an address that keeps sending
// wrong keys is answered 429 without a query, others are not affected,
// and a valid key already known still passes from it.
func TestAuthorizeLimitsFailuresPerAddress(t *testing.T) {
	const valid = "e2b_valid"
	db := &fakeDB{keys: map[string]bool{valid: true}}
	g := authGateway(db)
	if w := authorizeFrom(g, "192.0.2.1", valid); w.Code != http.StatusNoContent {
		t.Fatalf("valid key: %d", w.Code)
	}
	var limited *httptest.ResponseRecorder
	for i := range 200 {
		w := authorizeFrom(g, "192.0.2.1", randomKey(40))
		if w.Code == http.StatusTooManyRequests {
			limited = w
			break
		}
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("wrong key %d: status %d", i, w.Code)
		}
	}
	if limited == nil {
		t.Fatal("200 wrong keys from one address were all answered 401; want 429 after a burst")
	}
	if limited.Header().Get("Retry-After") == "" || !strings.Contains(limited.Body.String(), "too many requests") {
		t.Errorf("429 without Retry-After or a clear message: %v %s", limited.Header(), limited.Body)
	}
	queries := db.keyQueries.Load()
	for range 100 {
		if w := authorizeFrom(g, "192.0.2.1", randomKey(40)); w.Code != http.StatusTooManyRequests {
			t.Fatalf("limited address: status %d, want 429", w.Code)
		}
	}
	if n := db.keyQueries.Load() - queries; n != 0 {
		t.Errorf("a limited address cost %d queries, want 0", n)
	}
	if w := authorizeFrom(g, "192.0.2.1", valid); w.Code != http.StatusNoContent {
		t.Errorf("known valid key from a limited address: status %d, want through", w.Code)
	}
	if w := authorizeFrom(g, "192.0.2.2", randomKey(40)); w.Code != http.StatusUnauthorized {
		t.Errorf("another address: status %d, want 401", w.Code)
	}
}

// TestAuthorizeStaleValidKeyFromLimitedAddress: a key confirmed valid
// before is asked about again from an address over its limit even once its
// confirmation is stale (one client's bad key must not lock out the good
// ones behind the same address), and a key found revoked is not let in
// again by a database outage.
func TestAuthorizeStaleValidKeyFromLimitedAddress(t *testing.T) {
	const valid = "e2b_valid"
	db := &fakeDB{keys: map[string]bool{valid: true}}
	g := authGateway(db)
	g.keys.ttl = 0 // every confirmation is stale at once
	if w := authorizeFrom(g, "192.0.2.1", valid); w.Code != http.StatusNoContent {
		t.Fatalf("valid key: %d", w.Code)
	}
	for range 200 {
		if authorizeFrom(g, "192.0.2.1", randomKey(40)).Code == http.StatusTooManyRequests {
			break
		}
	}
	if w := authorizeFrom(g, "192.0.2.1", randomKey(40)); w.Code != http.StatusTooManyRequests {
		t.Fatalf("address not limited: %d", w.Code)
	}
	queries := db.keyQueries.Load()
	if w := authorizeFrom(g, "192.0.2.1", valid); w.Code != http.StatusNoContent {
		t.Errorf("valid key with a stale confirmation from a limited address: status %d, want through", w.Code)
	}
	if db.keyQueries.Load() == queries {
		t.Error("a stale confirmation was not checked again")
	}
	db.keys[valid] = false // revoked
	if w := authorizeFrom(g, "192.0.2.3", valid); w.Code != http.StatusUnauthorized {
		t.Errorf("revoked key: status %d, want 401", w.Code)
	}
	db.down.Store(true)
	g.keys.invalid.Purge() // as after invalidTTL
	if w := authorizeFrom(g, "192.0.2.3", valid); w.Code == http.StatusNoContent {
		t.Error("a revoked key passed during a database outage")
	}
}

// TestSignerExpiredInEnvdsWords: an expired signature is refused without
// a lookup, with envd's own message (E2B's SDK tests match it, and a
// single server answers it so).
func TestSignerExpiredInEnvdsWords(t *testing.T) {
	db := &fakeDB{}
	g := authGateway(db)
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	r := httptest.NewRequest(http.MethodGet, signedURL("/f", "token")+"&signature_expiration="+past, nil)
	r.RemoteAddr = "192.0.2.9:1"
	w := httptest.NewRecorder()
	if _, ok := g.signer(w, r); ok {
		t.Fatal("an expired signature was taken")
	}
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "signature is already expired") {
		t.Errorf("answer %d %s; want 401 saying the signature is already expired", w.Code, w.Body)
	}
	if n := db.tokenReads.Load(); n != 0 {
		t.Errorf("an expired signature cost %d reads", n)
	}
}

// signedURL is a signed file URL of path made with token, as E2B's SDK
// makes it.
func signedURL(path, token string) string {
	sum := sha256.Sum256([]byte(path + ":read::" + token))
	// Escaped: a '+' of the base64 would arrive as a space.
	return "/files?path=" + path + "&signature=" + url.QueryEscape("v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
}

func signerOf(g *Gateway, addr, url string) (string, int) {
	r := httptest.NewRequest(http.MethodGet, url, nil)
	r.RemoteAddr = addr + ":1"
	w := httptest.NewRecorder()
	id, ok := g.signer(w, r)
	if !ok {
		return "", w.Code
	}
	return id, http.StatusOK
}

// TestSignerDatabaseLoad: random signatures cost the database a bounded
// number of reads whoever sends them, signatures that cannot be valid cost
// none, a sandbox made a moment ago is found, and a read in flight holds
// up no request whose signer is known. Before, every unknown signature
// read every running sandbox's token under a lock.
func TestSignerDatabaseLoad(t *testing.T) {
	db := &fakeDB{tokens: []postgres.SandboxToken{{ID: "sb1", Token: "t1"}}}
	g := authGateway(db)
	if id, code := signerOf(g, "10.0.0.1", signedURL("/a", "t1")); id != "sb1" {
		t.Fatalf("signer of a valid URL: %q %d", id, code)
	}

	for _, url := range []string{
		"/files?path=/a&signature=" + strings.Repeat("x", 60<<10),
		"/files?path=/a&signature=v1_short",
		signedURL("/a", "t1") + "&signature_expiration=1", // long past
		signedURL("/a", "t1") + "&signature_expiration=soon",
	} {
		if _, code := signerOf(g, "10.0.1.1", url); code != http.StatusUnauthorized {
			t.Errorf("%.60s: status %d, want 401", url, code)
		}
	}
	reads := db.tokenReads.Load()
	if reads != 1 {
		t.Errorf("%d token reads after implausible signatures, want 1 (the first valid one)", reads)
	}

	// 400 random signatures from 400 addresses at once: a handful of reads.
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, code := signerOf(g, fmt.Sprintf("10.5.%d.%d", i/256, i%256), signedURL("/x", randomKey(40))); code != http.StatusUnauthorized {
				t.Errorf("random signature: status %d, want 401", code)
			}
		}()
	}
	wg.Wait()
	allowed := 2 + int64(time.Since(start)/tokenReadGap)
	if n := db.tokenReads.Load() - reads; n > allowed {
		t.Errorf("400 random signatures cost %d token reads in %v, want at most %d", n, time.Since(start), allowed)
	}

	// The same wrong signature again is answered from memory.
	bad := signedURL("/y", "nobody")
	signerOf(g, "10.6.0.1", bad)
	reads = db.tokenReads.Load()
	for range 5 {
		signerOf(g, "10.6.0.1", bad)
	}
	if n := db.tokenReads.Load() - reads; n != 0 {
		t.Errorf("a wrong signature sent again cost %d reads, want 0", n)
	}

	// A sandbox made now is found while a read is slow; a known signer is
	// found meanwhile, without waiting.
	db.mu.Lock()
	db.tokens = append(db.tokens, postgres.SandboxToken{ID: "sb2", Token: "t2"})
	db.blockTokens = make(chan struct{})
	db.mu.Unlock()
	found := make(chan string, 1)
	go func() {
		id, _ := signerOf(g, "10.7.0.1", signedURL("/b", "t2"))
		found <- id
	}()
	deadline := time.Now().Add(30 * time.Second)
	for db.tokenReads.Load() == reads && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polls a condition; the read is the other goroutine's
	}
	if id, code := signerOf(g, "10.7.0.2", signedURL("/a", "t1")); id != "sb1" {
		t.Errorf("known signer during a slow read: %q %d", id, code)
	}
	db.mu.Lock()
	close(db.blockTokens)
	db.blockTokens = nil
	db.mu.Unlock()
	select {
	case id := <-found:
		if id != "sb2" {
			t.Errorf("signer of a new sandbox's URL: %q, want sb2", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the new sandbox's URL was not answered")
	}
}

// TestForwardStripsCredentials: a gateway forwarding envd traffic or an
// exposed port sends no key of the cluster's toward the sandbox (the node
// strips them again); control-plane calls still carry the cluster secret.
func TestForwardStripsCredentials(t *testing.T) {
	const userKey = "e2b_user"
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-Key", r.Header.Get("X-API-Key"))
		w.Header().Set("X-Got-Authorization", r.Header.Get("Authorization"))
	}))
	t.Cleanup(upstream.Close)
	db := &fakeDB{keys: map[string]bool{userKey: true}}
	g := authGateway(db)
	g.cfg = Config{APIKey: "gw-key", ClusterSecret: "cluster-secret", Domain: "example.test"}
	g.nodes = newNodes(nil, time.Minute, new(atomic.Int64))
	n := &nodeState{Node: postgres.Node{ID: "n1", Address: strings.TrimPrefix(upstream.URL, "http://")}, reachable: true}
	g.nodes.view.Store(&nodeView{byID: map[string]*nodeState{n.ID: n}, list: []*nodeState{n}})
	g.proxy = g.newProxy(http.DefaultTransport)
	if w := authorizeFrom(g, "10.0.0.1", userKey); w.Code != http.StatusNoContent {
		t.Fatalf("user key: %d", w.Code)
	}
	const id = "i0123456789abcdefghi"
	for _, tc := range []struct {
		name                string
		host                string
		headers             map[string]string
		controlPlane        bool
		wantKey, wantAuthzn string
	}{
		{name: "port route", host: "8080-" + id + ".example.test",
			headers: map[string]string{"X-API-Key": userKey, "Authorization": "Bearer " + userKey}},
		{name: "port route, the app's own bearer token", host: "8080-" + id + ".example.test",
			headers: map[string]string{"Authorization": "Bearer app"}, wantAuthzn: "Bearer app"},
		{name: "port route, the app's own key", host: "8080-" + id + ".example.test",
			headers: map[string]string{"X-API-Key": "app-key"}, wantKey: "app-key"},
		{name: "port route, the cluster secret", host: "8080-" + id + ".example.test",
			headers: map[string]string{"X-API-Key": "cluster-secret", "Authorization": "Bearer cluster-secret"}},
		{name: "envd", host: "gw", headers: map[string]string{api.HeaderSandboxID: id, "X-API-Key": "gw-key",
			"Authorization": "Basic cm9vdDo="}, wantAuthzn: "Basic cm9vdDo="},
		{name: "envd, a bearer token", host: "gw", headers: map[string]string{api.HeaderSandboxID: id,
			"Authorization": "Bearer app"}},
		{name: "control plane", host: "gw", controlPlane: true,
			headers: map[string]string{"X-API-Key": userKey}, wantKey: "cluster-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			g.forwardNode(w, r, "n1", id, tc.controlPlane)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := w.Header().Get("X-Got-Key"); got != tc.wantKey {
				t.Errorf("node got X-API-Key %q, want %q", got, tc.wantKey)
			}
			if got := w.Header().Get("X-Got-Authorization"); got != tc.wantAuthzn {
				t.Errorf("node got Authorization %q, want %q", got, tc.wantAuthzn)
			}
		})
	}
}

// TestAuthorizeForgetsMisses: a key or a signature refused is remembered
// only for a while, so that a key added to the database, or a sandbox just
// made, is let in soon (within invalidTTL) while it is refused from memory
// meanwhile.
func TestAuthorizeForgetsMisses(t *testing.T) {
	const key = "e2b_added_later"
	db := &fakeDB{keys: map[string]bool{}}
	g := authGateway(db)
	addr := 0
	next := func() string { addr++; return fmt.Sprintf("10.8.%d.%d", addr/256, addr%256) }
	if w := authorizeFrom(g, next(), key); w.Code != http.StatusUnauthorized {
		t.Fatalf("unknown key: status %d, want 401", w.Code)
	}
	signed := signedURL("/c", "t3")
	if _, code := signerOf(g, next(), signed); code != http.StatusUnauthorized {
		t.Fatalf("signature of no sandbox: status %d, want 401", code)
	}
	db.keys[key] = true
	db.mu.Lock()
	db.tokens = append(db.tokens, postgres.SandboxToken{ID: "sb3", Token: "t3"})
	db.mu.Unlock()
	queries := db.keyQueries.Load()
	if w := authorizeFrom(g, next(), key); w.Code != http.StatusUnauthorized || db.keyQueries.Load() != queries {
		t.Errorf("key refused a moment ago: status %d after %d queries, want 401 from memory",
			w.Code, db.keyQueries.Load()-queries)
	}
	reads := db.tokenReads.Load()
	if _, code := signerOf(g, next(), signed); code != http.StatusUnauthorized || db.tokenReads.Load() != reads {
		t.Errorf("signature refused a moment ago: status %d after %d reads, want 401 from memory",
			code, db.tokenReads.Load()-reads)
	}

	deadline := time.Now().Add(30 * time.Second)
	keyIn, sigIn := false, false
	for (!keyIn || !sigIn) && time.Now().Before(deadline) {
		keyIn = keyIn || authorizeFrom(g, next(), key).Code == http.StatusNoContent
		if !sigIn {
			id, _ := signerOf(g, next(), signed)
			sigIn = id == "sb3"
		}
		time.Sleep(10 * time.Millisecond) // polls a condition: the entries' expiry
	}
	if !keyIn {
		t.Error("a key added to the database was still refused 30 s later")
	}
	if !sigIn {
		t.Error("a new sandbox's signature was still refused 30 s later")
	}
}

// TestSignerRemembered: the sandbox that made a signed URL is remembered,
// and is answered again only while it runs with the same token.
func TestSignerRemembered(t *testing.T) {
	db := &fakeDB{}
	for i := range 1000 {
		db.tokens = append(db.tokens, postgres.SandboxToken{ID: fmt.Sprintf("sb%d", i), Token: fmt.Sprintf("t%d", i)})
	}
	g := authGateway(db)
	url := signedURL("/a", "t999")
	if id, code := signerOf(g, "10.9.0.1", url); id != "sb999" {
		t.Fatalf("signer: %q %d", id, code)
	}
	key := readSignedRequest(httptest.NewRequest(http.MethodGet, url, nil)).key
	if id, ok := g.tokens.signers.Get(key); !ok || id != "sb999" {
		t.Fatalf("signer not remembered: %q %v", id, ok)
	}
	if id, _ := signerOf(g, "10.9.0.1", url); id != "sb999" {
		t.Fatalf("signer the second time: %q", id)
	}
	// sb999 ends: once the tokens are read again, its URL is refused.
	db.mu.Lock()
	db.tokens = db.tokens[:999]
	db.mu.Unlock()
	if err := g.tokens.reads.since(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if id, code := signerOf(g, "10.9.0.2", url); code != http.StatusUnauthorized {
		t.Errorf("URL of an ended sandbox: %q %d, want 401", id, code)
	}
}

// TestSignerDatabaseFailing: while token reads fail, requests that need
// one keep to a read per gap between them all, and each is told of the
// failure rather than waiting on; the database back, they are answered.
func TestSignerDatabaseFailing(t *testing.T) {
	db := &fakeDB{tokens: []postgres.SandboxToken{{ID: "sb1", Token: "t1"}}}
	db.tokensDown.Store(true)
	const gap = 50 * time.Millisecond
	set := newTokenSet(db, gap, new(atomic.Int64))
	start := time.Now()
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 8*gap {
				calls.Add(1)
				if err := set.reads.since(context.Background(), time.Now()); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	allowed := 2 + int64(time.Since(start)/gap)
	if n := db.tokenReads.Load(); n > allowed || n == 0 {
		t.Errorf("%d calls while the database failed made %d reads in %v, want 1 to %d", calls.Load(), n, time.Since(start), allowed)
	}
	if failed.Load() != calls.Load() {
		t.Errorf("%d of %d calls failed while every read did", failed.Load(), calls.Load())
	}

	db.tokensDown.Store(false)
	if err := set.reads.since(context.Background(), time.Now()); err != nil {
		t.Fatalf("the database back: %v", err)
	}
	if id := set.match(readSignedRequest(httptest.NewRequest(http.MethodGet, signedURL("/a", "t1"), nil))); id != "sb1" {
		t.Errorf("signer once the database is back: %q", id)
	}
}

// TestSignerReaderGone: a request that goes away while the read it asked
// for waits does not end that read: the requests still waiting get its
// tokens, and nothing is read twice.
func TestSignerReaderGone(t *testing.T) {
	db := &fakeDB{tokens: []postgres.SandboxToken{{ID: "sb1", Token: "t1"}}}
	// Made outside the bubble: its cache's cleaner runs for ever.
	set := newTokenSet(db, time.Second, new(atomic.Int64))
	synctest.Test(t, func(t *testing.T) {
		set.reads.last = time.Now() // the next read waits a second
		goneCtx, gone := context.WithCancel(context.Background())
		first, second := make(chan error, 1), make(chan error, 1)
		go func() {
			err := set.reads.since(goneCtx, time.Now())
			first <- err
		}()
		synctest.Wait() // the first request's read waits for the gap
		go func() {
			err := set.reads.since(context.Background(), time.Now())
			second <- err
		}()
		synctest.Wait() // the second waits for the first's read
		gone()
		if err := <-first; !errors.Is(err, context.Canceled) {
			t.Errorf("the request gone: %v, want its context's end", err)
		}
		if err := <-second; err != nil {
			t.Errorf("the request waiting: %v, want the tokens read", err)
		}
		if n := db.tokenReads.Load(); n != 1 {
			t.Errorf("%d reads, want the waiting request's one", n)
		}
	})
}

// BenchmarkSigner finds the signer of a signed URL among 100,000 running
// sandboxes: a URL seen before, and a new one (a hash per sandbox).
func BenchmarkSigner(b *testing.B) {
	db := &fakeDB{}
	for i := range 100000 {
		db.tokens = append(db.tokens, postgres.SandboxToken{ID: fmt.Sprintf("sb%d", i), Token: fmt.Sprintf("t%d", i)})
	}
	g := authGateway(db)
	if err := g.tokens.reads.since(context.Background(), time.Now()); err != nil {
		b.Fatal(err)
	}
	b.Run("known URL", func(b *testing.B) {
		r := httptest.NewRequest(http.MethodGet, signedURL("/a", "t99999"), nil)
		for b.Loop() {
			if id := g.tokens.match(readSignedRequest(r)); id != "sb99999" {
				b.Fatal(id)
			}
		}
	})
	b.Run("new URL", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			r := httptest.NewRequest(http.MethodGet, signedURL(fmt.Sprintf("/n%d", i), "t99999"), nil)
			if id := g.tokens.match(readSignedRequest(r)); id != "sb99999" {
				b.Fatal(id)
			}
		}
	})
}

// A signed file URL forwarded by the gateway names its sandbox to the
// node (E2b-Sandbox-Id), which then need not search its own sandboxes
// again; envd checks the signature itself.
func TestSignedURLForwardedWithSandboxID(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-Sandbox", r.Header.Get(api.HeaderSandboxID))
	}))
	t.Cleanup(upstream.Close)
	db := &fakeDB{tokens: []postgres.SandboxToken{{ID: "sb1", Token: "t1"}, {ID: "sb2", Token: "t2"}}}
	g := authGateway(db)
	g.cfg = Config{ClusterSecret: "cluster-secret"}
	g.nodes = newNodes(nil, time.Minute, new(atomic.Int64))
	n := &nodeState{Node: postgres.Node{ID: "n1", Address: strings.TrimPrefix(upstream.URL, "http://")}, reachable: true}
	g.nodes.view.Store(&nodeView{byID: map[string]*nodeState{n.ID: n}, list: []*nodeState{n}})
	g.proxy = g.newProxy(http.DefaultTransport)
	g.routes = newRouteCache(16)
	g.routes.put("sb2", "n1")
	r := httptest.NewRequest(http.MethodGet, signedURL("/a", "t2"), nil)
	r.RemoteAddr = "10.10.0.1:1"
	w := httptest.NewRecorder()
	g.envd(w, r)
	if w.Code != http.StatusOK || w.Header().Get("X-Got-Sandbox") != "sb2" {
		t.Fatalf("status %d, node got %s %q, want sb2: %s", w.Code, api.HeaderSandboxID, w.Header().Get("X-Got-Sandbox"), w.Body)
	}
}

// An address that sent too many bad signed URLs is refused new bad ones
// (429), but a URL signed by a running sandbox whose token the gateway
// holds still passes, as a known key does: one client's bad URLs do not
// lock out its good ones.
func TestSignerBlockedAddressStillPassesValidURLs(t *testing.T) {
	db := &fakeDB{tokens: []postgres.SandboxToken{{ID: "sb1", Token: "t1"}}}
	g := authGateway(db)
	g.tokens = newTokenSet(db, time.Millisecond, new(atomic.Int64)) // each bad URL reads the tokens: no need to wait
	if id, _ := signerOf(g, "10.11.0.2", signedURL("/first", "t1")); id != "sb1" {
		t.Fatalf("signer before any failure: %q", id) // the tokens are now held
	}
	blocked := false
	for i := 0; i < 200 && !blocked; i++ {
		_, code := signerOf(g, "10.11.0.1", signedURL(fmt.Sprintf("/bad%d", i), "nobody"))
		blocked = code == http.StatusTooManyRequests
	}
	if !blocked {
		t.Fatal("200 bad signed URLs from one address were never refused with 429")
	}
	if id, code := signerOf(g, "10.11.0.1", signedURL("/new", "t1")); id != "sb1" {
		t.Errorf("a new valid URL from the blocked address: %q %d, want sb1", id, code)
	}
	if _, code := signerOf(g, "10.11.0.1", signedURL("/bad-again", "nobody")); code != http.StatusTooManyRequests {
		t.Errorf("another bad URL from the blocked address: %d, want 429", code)
	}
}
