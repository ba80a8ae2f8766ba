package envd

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// doRaw sends one plain request and returns status and body.
func doRaw(t *testing.T, method, url, body string, header map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(data)
}

func TestAccessToken(t *testing.T) {
	env := newTestEnv(t)
	listURL := env.ts.URL + "/process.Process/List"
	jsonHeader := map[string]string{"Content-Type": "application/json"}
	if status, _, _ := doRaw(t, "POST", listURL, "{}", jsonHeader); status != 200 {
		t.Fatalf("list without any token configured: %d", status)
	}
	if status, _, _ := doRaw(t, "POST", env.ts.URL+"/init", `{"accessToken":"tok-1","envVars":{"K":"V"}}`, nil); status != 204 {
		t.Fatalf("first init: %d", status)
	}

	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		token      string
		wantStatus int
	}{
		{"rpc without token", "POST", "/process.Process/List", "{}", "", 401},
		{"rpc wrong token", "POST", "/process.Process/List", "{}", "nope", 401},
		{"rpc right token", "POST", "/process.Process/List", "{}", "tok-1", 200},
		{"fs rpc without token", "POST", "/filesystem.Filesystem/Stat", `{"path":"/"}`, "", 401},
		{"health is open", "GET", "/health", "", "", 204},
		{"envs needs token", "GET", "/envs", "", "", 401},
		{"envs with token", "GET", "/envs", "", "tok-1", 200},
		{"metrics with token", "GET", "/metrics", "", "tok-1", 200},
		{"init needs current token", "POST", "/init", `{"accessToken":"evil"}`, "", 401},
		{"files needs token", "GET", "/files?path=/etc/hostname", "", "", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{"Content-Type": "application/json"}
			if tt.token != "" {
				h["X-Access-Token"] = tt.token
			}
			status, header, body := doRaw(t, tt.method, env.ts.URL+tt.path, tt.body, h)
			if status != tt.wantStatus {
				t.Fatalf("status %d body %q, want %d", status, body, tt.wantStatus)
			}
			if status == 401 {
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != 401 || e.Message == "" ||
					header.Get("Content-Type") != "application/json" {
					t.Fatalf("401 body %q (%s)", body, header.Get("Content-Type"))
				}
			}
		})
	}

	// Re-key as the server does for a restored copy: the current token
	// authorizes the change, after which only the new token works.
	if status, _, body := doRaw(t, "POST", env.ts.URL+"/init", `{"accessToken":"tok-2"}`, map[string]string{"X-Access-Token": "tok-1"}); status != 204 {
		t.Fatalf("re-key: %d %s", status, body)
	}
	for token, want := range map[string]int{"tok-1": 401, "tok-2": 200} {
		if status, _, _ := doRaw(t, "POST", listURL, "{}", map[string]string{"Content-Type": "application/json", "X-Access-Token": token}); status != want {
			t.Fatalf("after re-key, token %s: %d, want %d", token, status, want)
		}
	}
	if _, _, body := doRaw(t, "GET", env.ts.URL+"/envs", "", map[string]string{"X-Access-Token": "tok-2"}); strings.TrimSpace(body) != `{"K":"V"}` {
		t.Fatalf("envs %q", body)
	}
}

// sign builds a signature the way the SDK's getSignature does.
func sign(path, op, user, token string, exp int64) string {
	msg := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		msg += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

func TestSignedFileURLs(t *testing.T) {
	env := newTestEnv(t)
	env.srv.settings.apply(initRequest{AccessToken: ptr("secret")})
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour).Unix()
	past := time.Now().Add(-time.Minute).Unix()
	tests := []struct {
		name       string
		method     string
		path       string
		sig        string
		exp        int64
		token      string // X-Access-Token header, when set
		wantStatus int
		wantMsg    string // upstream envd's words for the refusal
	}{
		{"read signed", "GET", file, sign(file, "read", "", "secret", 0), 0, "", 200, ""},
		{"read signed with expiry", "GET", file, sign(file, "read", "", "secret", future), future, "", 200, ""},
		{"read expired", "GET", file, sign(file, "read", "", "secret", past), past, "", 401, "signature is already expired"},
		{"forged and expired", "GET", file, sign(file, "read", "", "other", past), past, "", 401, "invalid signature"},
		{"read with write signature", "GET", file, sign(file, "write", "", "secret", 0), 0, "", 401, "invalid signature"},
		{"read wrong token", "GET", file, sign(file, "read", "", "other", 0), 0, "", 401, "invalid signature"},
		{"read tampered expiry", "GET", file, sign(file, "read", "", "secret", future), future + 1, "", 401, "invalid signature"},
		{"no signature", "GET", file, "", 0, "", 401, "missing signature query parameter"},
		{"wrong header token", "GET", file, sign(file, "read", "", "secret", 0), 0, "nope", 401, "access token present in header but does not match"},
		{"write signed", "POST", filepath.Join(dir, "new.txt"), sign(filepath.Join(dir, "new.txt"), "write", "", "secret", 0), 0, "", 200, ""},
		{"write with read signature", "POST", filepath.Join(dir, "new2.txt"), sign(filepath.Join(dir, "new2.txt"), "read", "", "secret", 0), 0, "", 401, "invalid signature"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := url.Values{"path": {tt.path}}
			if tt.sig != "" {
				q.Set("signature", tt.sig)
			}
			if tt.exp != 0 {
				q.Set("signature_expiration", strconv.FormatInt(tt.exp, 10))
			}
			header := map[string]string{"Content-Type": "application/octet-stream"}
			if tt.token != "" {
				header["X-Access-Token"] = tt.token
			}
			status, _, body := doRaw(t, tt.method, env.ts.URL+"/files?"+q.Encode(), "x", header)
			if status != tt.wantStatus {
				t.Fatalf("status %d body %q, want %d", status, body, tt.wantStatus)
			}
			if tt.wantMsg == "" {
				return
			}
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != 401 || e.Message != tt.wantMsg {
				t.Fatalf("body %q, want code 401 message %q", body, tt.wantMsg)
			}
		})
	}
}

func TestInitWritesResolvConf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(path, []byte("nameserver 127.0.0.53\n"), 0o644)
	srv := New(Config{Logger: slog.New(slog.DiscardHandler), ResolvConfPath: path})
	for _, tc := range []struct {
		body string
		want string
	}{
		{`{"nameservers":["1.1.1.1","10.0.0.2"]}`, "# written by aenv envd at /init\nnameserver 1.1.1.1\nnameserver 10.0.0.2\n"},
		{`{"nameservers":["not an ip"]}`, "# written by aenv envd at /init\nnameserver 1.1.1.1\nnameserver 10.0.0.2\n"}, // refused, unchanged
		{`{}`, "# written by aenv envd at /init\nnameserver 1.1.1.1\nnameserver 10.0.0.2\n"},
	} {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/init", strings.NewReader(tc.body)))
		if rec.Code != 204 {
			t.Fatalf("%s: status %d", tc.body, rec.Code)
		}
		got, _ := os.ReadFile(path)
		if string(got) != tc.want {
			t.Fatalf("%s: resolv.conf %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestClearDirKeepsTheDir(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"a", "sub/b", "sub/c/d"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := clearDir(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("left %d entries (%v)", len(entries), err)
	}
}
