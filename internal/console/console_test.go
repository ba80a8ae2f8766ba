package console

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const goodKey = "aenv_good"

// fakeAPI answers /api-keys/current for goodKey and records what every
// other call carried.
type fakeAPI struct {
	last *http.Request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.last = r
	if r.Header.Get("X-API-Key") != goodKey {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"code":401,"message":"invalid API key"}`)
		return
	}
	if r.URL.Path == "/api-keys/current" {
		io.WriteString(w, `{"teamID":"alice","keyName":"k","admin":false}`)
		return
	}
	io.WriteString(w, "api:"+r.URL.Path)
}

type nextHandler struct{ hit bool }

func (n *nextHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.hit = true
	io.WriteString(w, "next")
}

func serve(h http.Handler, method, target, body string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestLogin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		headers []string
		want    int
		cookie  bool
	}{
		{"good key", `{"key":"` + goodKey + `"}`, []string{CSRFHeader, "1"}, 200, true},
		{"bad key: the API's 401", `{"key":"aenv_bad"}`, []string{CSRFHeader, "1"}, 401, false},
		{"no CSRF header", `{"key":"` + goodKey + `"}`, nil, 403, false},
		{"another origin", `{"key":"` + goodKey + `"}`, []string{CSRFHeader, "1", "Origin", "http://evil.example"}, 403, false},
		{"malformed JSON", `{"key":`, []string{CSRFHeader, "1"}, 400, false},
		{"empty key", `{"key":"  "}`, []string{CSRFHeader, "1"}, 400, false},
		{"oversized body", `{"key":"` + strings.Repeat("a", 8<<10) + `"}`, []string{CSRFHeader, "1"}, 400, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := mustNew(t, &fakeAPI{}, &nextHandler{})
			w := serve(h, "POST", "/console/login", tc.body, tc.headers...)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			cookies := w.Result().Cookies()
			if !tc.cookie {
				if len(cookies) != 0 {
					t.Fatalf("a refused login set %v", cookies)
				}
				return
			}
			if len(cookies) != 1 {
				t.Fatalf("cookies %v", cookies)
			}
			c := cookies[0]
			if c.Name != Cookie || c.Value != goodKey || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode ||
				c.Path != Prefix || c.MaxAge <= 0 {
				t.Fatalf("cookie %+v", c)
			}
			if !strings.Contains(w.Body.String(), `"teamID":"alice"`) {
				t.Fatalf("login answer %s", w.Body)
			}
		})
	}
	h := mustNew(t, &fakeAPI{}, &nextHandler{})
	if w := serve(h, "GET", "/console/login", ""); w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET login: %d", w.Code)
	}
}

func TestLogout(t *testing.T) {
	h := mustNew(t, &fakeAPI{}, &nextHandler{})
	if w := serve(h, "POST", "/console/logout", ""); w.Code != http.StatusForbidden {
		t.Fatalf("logout without the CSRF header: %d", w.Code)
	}
	w := serve(h, "POST", "/console/logout", "", CSRFHeader, "1")
	c := w.Result().Cookies()
	if w.Code != http.StatusNoContent || len(c) != 1 || c[0].MaxAge >= 0 || c[0].Value != "" {
		t.Fatalf("logout: %d %v", w.Code, c)
	}
}

func TestAPICalls(t *testing.T) {
	session := "aenv_console=" + goodKey
	for _, tc := range []struct {
		name    string
		headers []string
		want    int
		body    string
	}{
		{"session and CSRF header", []string{"Cookie", session, CSRFHeader, "1"}, 200, "api:/v2/sandboxes"},
		{"same origin", []string{"Cookie", session, CSRFHeader, "1", "Origin", "http://example.com"}, 200, "api:/v2/sandboxes"},
		{"no session", []string{CSRFHeader, "1"}, 401, "not logged in"},
		{"no CSRF header", []string{"Cookie", session}, 403, "own pages"},
		{"another origin", []string{"Cookie", session, CSRFHeader, "1", "Origin", "http://evil.example"}, 403, "own pages"},
		{"a revoked key: the API's 401", []string{"Cookie", "aenv_console=aenv_gone", CSRFHeader, "1"}, 401, "invalid API key"},
		{"the HTTPS session", []string{"Cookie", "__Host-aenv_console=" + goodKey, CSRFHeader, "1", "X-Forwarded-Proto", "https"}, 200, "api:/v2/sandboxes"},
		{"over HTTPS a plain cookie (planted by a sibling host) is no session", []string{"Cookie", session, CSRFHeader, "1", "X-Forwarded-Proto", "https"}, 401, "not logged in"},
		{"over HTTP the __Host- cookie is no session", []string{"Cookie", "__Host-aenv_console=" + goodKey, CSRFHeader, "1"}, 401, "not logged in"},
		{"a second session cookie planted beside it", []string{"Cookie", session + "; aenv_console=aenv_planted", CSRFHeader, "1"}, 401, "not logged in"},
		{"behind a proxy that rewrites Host", []string{"Cookie", session, CSRFHeader, "1", "Origin", "https://console.example",
			"X-Forwarded-Host", "console.example"}, 200, "api:/v2/sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{}
			h := mustNew(t, api, &nextHandler{})
			w := serve(h, "GET", "http://example.com/console/api/v2/sandboxes?limit=5", "", tc.headers...)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.body) {
				t.Fatalf("status %d %q, want %d %q", w.Code, w.Body, tc.want, tc.body)
			}
			if tc.want != 200 {
				return
			}
			if api.last.URL.RawQuery != "limit=5" || api.last.Header.Get("Cookie") != "" || api.last.Header.Get(CSRFHeader) != "" {
				t.Fatalf("the API got %s?%s with headers %v", api.last.URL.Path, api.last.URL.RawQuery, api.last.Header)
			}
		})
	}
}

func TestOnlyConsoleRequests(t *testing.T) {
	for _, tc := range []struct {
		name    string
		target  string
		headers []string
		console bool
	}{
		{"the shell", "/console/", nil, true},
		{"a page", "/console/sandboxes/x", nil, true},
		{"the API", "/sandboxes", nil, false},
		{"a path that only starts alike", "/consoles", nil, false},
		{"envd traffic", "/console/", []string{"E2b-Sandbox-Id", "abc"}, false},
		{"a sandbox's exposed port", "http://8080-abcdefghij0123456789.example.test/console/", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := &nextHandler{}
			h := mustNew(t, &fakeAPI{}, next)
			w := serve(h, "GET", tc.target, "", tc.headers...)
			if next.hit == tc.console {
				t.Fatalf("console %v, but next hit %v (%d %s)", tc.console, next.hit, w.Code, w.Body)
			}
		})
	}
}

func TestShellAndAssets(t *testing.T) {
	h := mustNew(t, &fakeAPI{}, &nextHandler{})
	w := serve(h, "GET", "/console", "")
	if w.Code != http.StatusFound || w.Header().Get("Location") != "/console/" {
		t.Fatalf("/console: %d %v", w.Code, w.Header())
	}
	w = serve(h, "GET", "/console/", "")
	csp := w.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "script-src 'self' 'unsafe") ||
		w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("security headers %v", w.Header())
	}
	if h.bundle.Built() {
		if w.Code != 200 || !strings.Contains(w.Body.String(), "/console/assets/app.js") {
			t.Fatalf("shell: %d %s", w.Code, w.Body)
		}
		plain := serve(h, "GET", "/console/assets/app.js", "")
		if plain.Code != 200 || plain.Header().Get("Content-Encoding") != "" ||
			!strings.HasPrefix(plain.Header().Get("Content-Type"), "text/javascript") {
			t.Fatalf("app.js: %d %v", plain.Code, plain.Header())
		}
		gz := serve(h, "GET", "/console/assets/app.js", "", "Accept-Encoding", "br, gzip")
		if gz.Code != 200 || gz.Header().Get("Content-Encoding") != "gzip" || gz.Body.Len() >= plain.Body.Len() {
			t.Fatalf("app.js gzipped: %d %v, %d bytes of %d", gz.Code, gz.Header(), gz.Body.Len(), plain.Body.Len())
		}
		zr, err := gzip.NewReader(gz.Body)
		if err != nil {
			t.Fatal(err)
		}
		if unzipped, _ := io.ReadAll(zr); !bytes.Equal(unzipped, plain.Body.Bytes()) {
			t.Fatal("the gzipped app.js is not app.js")
		}
		etag := plain.Header().Get("ETag")
		if w := serve(h, "GET", "/console/assets/app.js", "", "If-None-Match", etag); etag == "" || w.Code != http.StatusNotModified {
			t.Fatalf("app.js again with its ETag %q: %d", etag, w.Code)
		}
	} else if w.Code != http.StatusNotImplemented || !strings.Contains(w.Body.String(), "make build") {
		t.Fatalf("a console not built: %d %s", w.Code, w.Body)
	}
	for _, bad := range []string{"/console/assets/", "/console/assets/../console.go", "/console/assets/x/../app.js", "/console/assets/README.md.nope"} {
		if w := serve(h, "GET", bad, ""); w.Code != http.StatusNotFound {
			t.Fatalf("%s: %d", bad, w.Code)
		}
	}
	if w := serve(h, "POST", "/console/", ""); w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST shell: %d", w.Code)
	}
}

func TestHTTPSSession(t *testing.T) {
	h := mustNew(t, &fakeAPI{}, &nextHandler{})
	for _, headers := range [][]string{{CSRFHeader, "1", "X-Forwarded-Proto", "https"}} {
		w := serve(h, "POST", "/console/login", `{"key":"`+goodKey+`"}`, headers...)
		c := w.Result().Cookies()
		if w.Code != 200 || len(c) != 1 || c[0].Name != SecureCookie || !c[0].Secure || c[0].Path != "/" || !c[0].HttpOnly {
			t.Fatalf("login over HTTPS: %d %+v", w.Code, c)
		}
	}
	r := httptest.NewRequest("POST", "https://example.com/console/login", strings.NewReader(`{"key":"`+goodKey+`"}`))
	r.Header.Set(CSRFHeader, "1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if c := w.Result().Cookies(); len(c) != 1 || c[0].Name != SecureCookie || !c[0].Secure {
		t.Fatalf("login over TLS: %+v", c)
	}
}

// What is not the console's but shares its origin (envd, signed file
// URLs, the API) is served as a sandboxed document, without the session
// cookie; a sandbox's exposed port (its own host) is left alone.
func TestOtherTrafficOfTheOrigin(t *testing.T) {
	var got *http.Request
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r })
	h := mustNew(t, &fakeAPI{}, next)
	for _, tc := range []struct {
		name      string
		target    string
		headers   []string
		sandboxed bool
	}{
		{"a signed file URL", "/files?path=x&signature=v1_y", nil, true},
		{"envd traffic", "/process.Process/Start", []string{"E2b-Sandbox-Id", "abc"}, true},
		{"the API", "/sandboxes", nil, true},
		{"an exposed port", "http://8080-abcdefghij0123456789.example.test/", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := append([]string{"Cookie", `a=hello world; __Host-aenv_console=` + goodKey + `; j={"k":"v"}; aenv_console=` + goodKey + "; b=x,y"}, tc.headers...)
			w := serve(h, "GET", tc.target, "", headers...)
			csp := w.Header().Get("Content-Security-Policy")
			if tc.sandboxed != (csp == "sandbox") {
				t.Fatalf("CSP %q", csp)
			}
			if !tc.sandboxed {
				return
			}
			if c := got.Header.Get("Cookie"); c != `a=hello world; j={"k":"v"}; b=x,y` {
				t.Fatalf("cookies passed on: %q", c)
			}
		})
	}
}

func mustNew(t *testing.T, api, next http.Handler) *Handler {
	t.Helper()
	b, err := LoadBundle()
	if err != nil {
		t.Fatal(err)
	}
	return New(b, api, next, "example.test")
}

func TestCookiesWithoutASessionPassUntouched(t *testing.T) {
	var got *http.Request
	h := mustNew(t, &fakeAPI{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r }))
	raw := `x=1;y="q";  z=a b`
	serve(h, "GET", "/files?path=x", "", "Cookie", raw)
	if c := got.Header.Get("Cookie"); c != raw {
		t.Fatalf("cookie %q became %q", raw, c)
	}
}
