package api

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// noNode is a node with no sandboxes nor templates: the routes tested
// here must not reach it beyond a name's lookup (any other call but
// Transport panics).
type noNode struct{ node.Node }

func (noNode) Transport() http.RoundTripper { return http.DefaultTransport }

func (noNode) TemplateNamed(_ context.Context, name string) (*store.Template, error) {
	return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, name)
}

func (noNode) GetTemplate(_ context.Context, idOrName string) (*store.Template, error) {
	return nil, fmt.Errorf("%w: template %q", node.ErrNotFound, idOrName)
}

const testHash = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

// buildServer serves the build routes; the steps of a build never run
// here (no node), only what the routes check before one starts.
func buildServer(t *testing.T) *httptest.Server {
	t.Helper()
	dir := t.TempDir()
	uploads, err := build.NewUploads(filepath.Join(dir, "files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	builds, err := build.New(build.Config{}, noNode{}, uploads, filepath.Join(dir, "state"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(builds.Close)
	s := New(Config{APIKey: "key", MaxJSONBytes: 1 << 20, Builds: builds}, noNode{}, slog.New(slog.DiscardHandler),
		prometheus.NewRegistry(), http.NotFoundHandler())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, method, url, body string, key bool) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key {
		req.Header.Set("X-API-Key", "key")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(data, &out)
	return resp.StatusCode, out
}

func TestBuildRoutes(t *testing.T) {
	srv := buildServer(t)

	status, out := call(t, "POST", srv.URL+"/v3/templates", `{"name":"my-app:v1","cpuCount":2}`, true)
	if status != http.StatusAccepted || out["templateID"] != "my-app" {
		t.Fatalf("request build: %d %v", status, out)
	}
	if tags, _ := out["tags"].([]any); len(tags) != 1 || tags[0] != "v1" {
		t.Fatalf("tags = %v", out["tags"])
	}
	buildID, _ := out["buildID"].(string)
	statusURL := srv.URL + "/templates/my-app/builds/" + buildID + "/status"

	for _, tc := range []struct {
		name, method, path, body string
		key                      bool
		want                     int
	}{
		{"no key", "POST", "/v3/templates", `{"name":"x"}`, false, 401},
		{"no name", "POST", "/v3/templates", `{}`, true, 400},
		{"bad name", "POST", "/v3/templates", `{"name":"a/b"}`, true, 400},
		{"base is not rebuilt", "POST", "/v3/templates", `{"name":"base"}`, true, 409},
		{"bad hash", "GET", "/templates/my-app/files/xyz", "", true, 400},
		{"unknown build", "GET", "/templates/my-app/builds/nope/status", "", true, 404},
		{"build of another template", "GET", "/templates/other/builds/" + buildID + "/status", "", true, 404},
		{"bad offset", "GET", "/templates/my-app/builds/" + buildID + "/status?logsOffset=-1", "", true, 400},
		{"unsupported step", "POST", "/v2/templates/my-app/builds/" + buildID,
			`{"fromImage":"e2bdev/base","steps":[{"type":"ADD","args":["a"]}]}`, true, 400},
		{"copy not uploaded", "POST", "/v2/templates/my-app/builds/" + buildID,
			`{"steps":[{"type":"COPY","args":["a","/b"],"filesHash":"` + testHash + `"}]}`, true, 400},
		{"start unknown build", "POST", "/v2/templates/my-app/builds/nope", `{}`, true, 404},
	} {
		if got, out := call(t, tc.method, srv.URL+tc.path, tc.body, tc.key); got != tc.want {
			t.Errorf("%s: %d %v, want %d", tc.name, got, out, tc.want)
		}
	}

	status, out = call(t, "GET", statusURL+"?logsOffset=0", "", true)
	if status != 200 || out["status"] != build.StatusWaiting {
		t.Fatalf("status of a requested build: %d %v", status, out)
	}
	if entries, ok := out["logEntries"].([]any); !ok || len(entries) != 0 {
		t.Fatalf("logEntries = %v", out["logEntries"])
	}

	// The upload link is signed; the SDK PUTs to it without the key.
	status, out = call(t, "GET", srv.URL+"/templates/my-app/files/"+testHash, "", true)
	if status != http.StatusCreated || out["present"] != false {
		t.Fatalf("upload link: %d %v", status, out)
	}
	link, _ := out["url"].(string)
	if !strings.HasPrefix(link, srv.URL+"/build-uploads/"+testHash+"?") || !strings.Contains(link, "signature=") {
		t.Fatalf("link %q", link)
	}
	// Behind a TLS proxy (a gateway over https), the link is https.
	req, err := http.NewRequest("GET", srv.URL+"/templates/my-app/files/"+testHash, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "key")
	req.Header.Set(HeaderForwardedProto, "https")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var forwarded map[string]any
	json.NewDecoder(resp.Body).Decode(&forwarded)
	resp.Body.Close()
	if fl, _ := forwarded["url"].(string); !strings.HasPrefix(fl, "https://"+strings.TrimPrefix(srv.URL, "http://")+"/build-uploads/") {
		t.Fatalf("link behind a TLS proxy: %q", fl)
	}
	if got, _ := call(t, "PUT", srv.URL+"/build-uploads/"+testHash+"?signature=00", "tar", false); got != 403 {
		t.Fatalf("unsigned upload: %d", got)
	}
	forged := strings.Replace(link, testHash, strings.Repeat("a", 64), 1)
	if got, _ := call(t, "PUT", forged, "tar", false); got != 403 {
		t.Fatalf("link used for another hash: %d", got)
	}
	if got, _ := call(t, "PUT", link, strings.Repeat("x", 2<<20), false); got != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized upload: %d", got)
	}
	if got, out := call(t, "PUT", link, "not a tar archive", false); got != 400 {
		t.Fatalf("upload of something that is not an archive: %d %v", got, out)
	}
	if got, out := call(t, "PUT", link, tarArchive(t), false); got != 200 {
		t.Fatalf("upload: %d %v", got, out)
	}
	if _, out = call(t, "GET", srv.URL+"/templates/my-app/files/"+testHash, "", true); out["present"] != true {
		t.Fatalf("after upload: %v", out)
	}
}

// An upload link is one template's, for one hash, for a while: used for
// another template it is refused (and another template's files under the
// same hash stay as they were), and past its expiry it is refused.
func TestBuildUploadLinkScope(t *testing.T) {
	srv := buildServer(t)
	_, out := call(t, "GET", srv.URL+"/templates/attacker/files/"+testHash, "", true)
	link, _ := out["url"].(string)
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Get("template") != "attacker" || q.Get("expires") == "" {
		t.Fatalf("link %q names no template or expiry", link)
	}
	exp, _ := strconv.ParseInt(q.Get("expires"), 10, 64)
	if d := time.Until(time.Unix(exp, 0)); d <= 0 || d > 2*time.Hour {
		t.Fatalf("link expires in %s", d)
	}
	relinked := func(key, value string) string {
		q := u.Query()
		q.Set(key, value)
		v := *u
		v.RawQuery = q.Encode()
		return v.String()
	}
	if got, out := call(t, "PUT", relinked("template", "victim"), tarArchive(t), false); got != 403 {
		t.Fatalf("link used for another template: %d %v", got, out)
	}
	if _, out := call(t, "GET", srv.URL+"/templates/victim/files/"+testHash, "", true); out["present"] != false {
		t.Fatalf("the other template's files: %v", out)
	}
	if got, out := call(t, "PUT", relinked("expires", strconv.FormatInt(exp+3600, 10)), tarArchive(t), false); got != 403 {
		t.Fatalf("link with a later expiry: %d %v", got, out)
	}
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	if got, out := call(t, "PUT", relinked("expires", past), tarArchive(t), false); got != 403 ||
		!strings.Contains(fmt.Sprint(out["message"]), "expired") {
		t.Fatalf("expired link: %d %v", got, out)
	}
	if got, _ := call(t, "PUT", link, tarArchive(t), false); got != 200 {
		t.Fatalf("upload with the link as given: %d", got)
	}
}

// tarArchive is a small tar archive, as the SDK uploads.
func tarArchive(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("a"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
