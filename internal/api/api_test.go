package api

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

func TestCheckSandboxPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/tmp/a", true},
		{"/home/user/x y.txt", true},
		{"/", true},
		{"", false},
		{"relative", false},
		{"./x", false},
		{"/tmp/../etc/passwd", false},
		{"/tmp/..", false},
		{"/a\x00b", false},
		{"/tmp/..hidden", true},
	} {
		if err := checkSandboxPath(tc.path); (err == nil) != tc.ok {
			t.Errorf("checkSandboxPath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
}

func TestParseMetadataQuery(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want map[string]string
		ok   bool
	}{
		{"k=v", map[string]string{"k": "v"}, true},
		{"a=1&b=2", map[string]string{"a": "1", "b": "2"}, true},
		// What the E2B SDK sends for {"a b": "c&d"} once the query itself
		// is decoded: the pairs are encoded twice more.
		{"a%2520b%3Dc%2526d", map[string]string{"a b": "c&d"}, true},
		{"novalue", nil, false},
		{"%zz", nil, false},
	} {
		got, err := parseMetadataQuery(tc.raw)
		if (err == nil) != tc.ok {
			t.Fatalf("%q: err %v", tc.raw, err)
		}
		if tc.ok && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q: got %v, want %v", tc.raw, got, tc.want)
		}
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	at := time.Unix(1700000000, 123).UTC()
	gotAt, gotID, err := parsePageToken(pageToken(at, "abc"))
	if err != nil || !gotAt.Equal(at) || gotID != "abc" {
		t.Fatalf("round trip: %v %q %v", gotAt, gotID, err)
	}
	for _, bad := range []string{"!!!", "bm9jb2xvbg", pageToken(at, "x")[:3]} {
		if _, _, err := parsePageToken(bad); err == nil {
			t.Errorf("parsePageToken(%q) accepted", bad)
		}
	}
}

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("x: %w", node.ErrNotFound), 404},
		{fmt.Errorf("x: %w", envdclient.ErrNotFound), 404},
		{fmt.Errorf("x: %w", node.ErrInvalid), 400},
		{fmt.Errorf("x: %w", envdclient.ErrInvalidArgument), 400},
		{fmt.Errorf("x: %w", node.ErrConflict), 409},
		{fmt.Errorf("x: %w", node.ErrUnavailable), 503},
		{fmt.Errorf("x: %w", node.ErrInsufficientStorage), 507},
		{fmt.Errorf("x: %w", node.ErrBadGateway), 502},
		{fmt.Errorf("x: %w", node.ErrStopped), 410},
		{fmt.Errorf("x: %w", envdclient.ErrUnauthenticated), 401},
		{fmt.Errorf("x: %w", envdclient.ErrPermission), 403},
		{fmt.Errorf("x: %w", envdclient.ErrNoSpace), 507},
		{&http.MaxBytesError{Limit: 1}, 413},
		{badRequest("nope"), 400},
		{errors.New("runsc: secret internal detail"), 500},
	} {
		status, msg := statusOf(tc.err)
		if status != tc.want {
			t.Errorf("%v: status %d, want %d", tc.err, status, tc.want)
		}
		if status == 500 && strings.Contains(msg, "secret") {
			t.Errorf("internal error text leaked: %q", msg)
		}
	}
}

func TestDecodeJSON(t *testing.T) {
	type body struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	for _, tc := range []struct {
		in     string
		status int // 0 = ok
	}{
		{`{"name":"a","count":1}`, 0},
		{`{"name":"a","unknown":true}`, 0},
		{`{"name":`, 400},
		{`{"count":"two"}`, 400},
		{`{} {}`, 400},
		{``, 400},
		{`{"name":"` + strings.Repeat("a", 200) + `"}`, 413},
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(tc.in))
		var b body
		err := decodeJSON(httptest.NewRecorder(), r, 100, &b)
		status := 0
		if err != nil {
			status, _ = statusOf(err)
		}
		if status != tc.status {
			t.Errorf("%.30q: status %d (%v), want %d", tc.in, status, err, tc.status)
		}
	}
}

func TestExposedPortHost(t *testing.T) {
	s := &Server{cfg: Config{Domain: "localhost"}}
	id := "abcdefghij0123456789"
	for _, tc := range []struct {
		host string
		port int
		ok   bool
	}{
		{"8080-" + id + ".localhost", 8080, true},
		{"8080-" + id + ".localhost:8000", 8080, true},
		{"8080-" + id + ".LOCALHOST", 8080, true},
		{"49983-" + id + ".localhost", 49983, true},
		{"localhost:8000", 0, false},
		{"127.0.0.1:8000", 0, false},
		{"0-" + id + ".localhost", 0, false},
		{"70000-" + id + ".localhost", 0, false},
		{"8080-short.localhost", 0, false},
		{"8080-" + id + ".example.com", 0, false},
	} {
		gotID, port, ok := s.exposedPort(tc.host)
		if ok != tc.ok || (ok && (gotID != id || port != tc.port)) {
			t.Errorf("%q: got %q %d %v", tc.host, gotID, port, ok)
		}
	}
	if _, _, ok := (&Server{}).exposedPort("8080-" + id + ".localhost"); ok {
		t.Error("exposed ports must be off without a domain")
	}
}

func TestNetworkPolicyFromRequest(t *testing.T) {
	f, tr := false, true
	for _, tc := range []struct {
		name string
		req  wire.NewSandbox
		want *store.NetworkPolicy
	}{
		{"nothing said", wire.NewSandbox{}, nil},
		{"seed", wire.NewSandbox{AllowInternetAccess: &f, AlwaysAllowedCIDRs: []string{"1.1.1.1/32"}},
			&store.NetworkPolicy{AllowInternet: false, AllowOut: []string{"1.1.1.1/32"}}},
		{"e2b", wire.NewSandbox{AllowInternetAccessE2B: &f, Network: &wire.NetworkConfig{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}},
			&store.NetworkPolicy{AllowInternet: false, AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}},
		{"deny only keeps internet", wire.NewSandbox{AlwaysDeniedCIDRs: []string{"10.0.0.0/8"}},
			&store.NetworkPolicy{AllowInternet: true, DenyOut: []string{"10.0.0.0/8"}}},
		{"seed spelling wins", wire.NewSandbox{AllowInternetAccess: &tr, AllowInternetAccessE2B: &f},
			&store.NetworkPolicy{AllowInternet: true}},
	} {
		got := policyOf(&tc.req)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// fileSignature signs as the spec says envd does: v1_ + unpadded base64
// of sha256("path:op:user:token[:exp]").
func fileSignature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// The proxy must find a sandbox from a signed URL exactly as envd checks
// the signature: every part of the message counts, and nothing else
// passes.
func TestFileSignature(t *testing.T) {
	signed := func(method, path, user, token, exp string) *http.Request {
		q := url.Values{"path": {path}, "username": {user}, "signature": {fileSignature(path,
			map[string]string{http.MethodGet: "read", http.MethodPost: "write"}[method], user, token, exp)}}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		return httptest.NewRequest(method, "/files?"+q.Encode(), nil)
	}
	tamper := func(r *http.Request, key, value string) *http.Request {
		q := r.URL.Query()
		q.Set(key, value)
		r.URL.RawQuery = q.Encode()
		return r
	}
	for _, tc := range []struct {
		name  string
		r     *http.Request
		token string
		want  bool
	}{
		{"read", signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "tok", true},
		{"write", signed(http.MethodPost, "/tmp/a", "user", "tok", ""), "tok", true},
		{"with expiration", signed(http.MethodGet, "/tmp/a", "user", "tok", "1900000000"), "tok", true},
		{"another token", signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "tok2", false},
		{"no token", signed(http.MethodGet, "/tmp/a", "user", "", ""), "", false},
		{"an extra parameter", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "x", "1"), "tok", true},
		{"another path", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "path", "/tmp/b"), "tok", false},
		{"another user", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "username", "root"), "tok", false},
		{"expiration moved", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", "1900000000"),
			"signature_expiration", "1900000001"), "tok", false},
		{"not base64", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "signature", "v1_!!"), "tok", false},
		{"no v1_", tamper(signed(http.MethodGet, "/tmp/a", "user", "tok", ""), "signature",
			strings.TrimPrefix(fileSignature("/tmp/a", "read", "user", "tok", ""), "v1_")), "tok", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParseFileSignature(tc.r).MadeWith(tc.token); got != tc.want {
				t.Errorf("MadeWith = %v, want %v", got, tc.want)
			}
		})
	}
	// A read's signature does not let the same URL write.
	r := signed(http.MethodGet, "/tmp/a", "user", "tok", "")
	r.Method = http.MethodPost
	if ParseFileSignature(r).MadeWith("tok") {
		t.Error("a read's signature passed for a write")
	}
}

func TestPage(t *testing.T) {
	at := time.Unix(1700000000, 0).UTC()
	keys := []pageKey{{at.Add(2 * time.Second), "a"}, {at.Add(time.Second), "a"}, {at.Add(time.Second), "b"}, {at, "c"}}
	ident := func(k pageKey) pageKey { return k }
	var all []pageKey
	token := ""
	for range 10 {
		w := httptest.NewRecorder()
		got, err := page(w, keys, ident, newestFirst(true), token, 1)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
		token = w.Header().Get("X-Next-Token")
		if token == "" {
			break
		}
	}
	if fmt.Sprint(all) != fmt.Sprint(keys) {
		t.Fatalf("paging one by one gave %v, want %v", all, keys)
	}
	// IDs descending at equal times (snapshots) pages the same way.
	desc := []pageKey{{at, "c"}, {at, "b"}, {at, "a"}}
	var got []pageKey
	token = ""
	for range 10 {
		w := httptest.NewRecorder()
		p, _ := page(w, desc, ident, newestFirst(false), token, 1)
		got = append(got, p...)
		if token = w.Header().Get("X-Next-Token"); token == "" {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(desc) {
		t.Fatalf("ids descending: %v", got)
	}
	// Oldest first walks the reversed list the same way.
	rev := []pageKey{keys[3], keys[2], keys[1], keys[0]}
	w := httptest.NewRecorder()
	first, _ := page(w, rev, ident, oldestFirst(true), "", 2)
	rest, _ := page(httptest.NewRecorder(), rev, ident, oldestFirst(true), w.Header().Get("X-Next-Token"), 10)
	if fmt.Sprint(append(first, rest...)) != fmt.Sprint(rev) {
		t.Fatalf("oldest first: %v then %v", first, rest)
	}
}
