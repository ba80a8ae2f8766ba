package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/build"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// templatesNode knows a fixed set of templates (by ID or name) and
// nothing else.
type templatesNode struct {
	noNode
	templates []*store.Template
}

func (n templatesNode) GetTemplate(_ context.Context, idOrName string) (*store.Template, error) {
	for _, t := range n.templates {
		if t.ID == idOrName || t.Name == idOrName {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: template %s", node.ErrNotFound, idOrName)
}

func (n templatesNode) TemplateNamed(_ context.Context, name string) (*store.Template, error) {
	for _, t := range n.templates {
		if t.Name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("%w: template %s", node.ErrNotFound, name)
}

func tagServer(t *testing.T, n node.Node) *httptest.Server {
	t.Helper()
	dir := t.TempDir()
	uploads, err := build.NewUploads(filepath.Join(dir, "files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	builds, err := build.New(build.Config{}, n, uploads, filepath.Join(dir, "state"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(builds.Close)
	s := New(Config{APIKey: "key", MaxJSONBytes: 1 << 20, Builds: builds}, n, slog.New(slog.DiscardHandler),
		prometheus.NewRegistry(), http.NotFoundHandler())
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func callRaw(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func TestTagRoutes(t *testing.T) {
	srv := tagServer(t, templatesNode{templates: []*store.Template{
		{ID: "tpl-1", Name: "app"},
		{ID: "tpl-2", Name: "tpl-2"}, // unnamed
	}})
	listed := func() []string {
		status, data := callRaw(t, "GET", srv.URL+"/templates/app/tags", "")
		var tags []struct {
			Tag       string    `json:"tag"`
			BuildID   string    `json:"buildID"`
			CreatedAt time.Time `json:"createdAt"`
		}
		if err := json.Unmarshal(data, &tags); status != http.StatusOK || err != nil {
			t.Fatalf("list tags: %d %s", status, data)
		}
		out := []string{}
		for _, tag := range tags {
			if len(tag.BuildID) != 36 || tag.CreatedAt.IsZero() {
				t.Fatalf("tag %+v", tag)
			}
			out = append(out, tag.Tag)
		}
		return out
	}
	if got := listed(); len(got) != 0 {
		t.Fatalf("tags before any: %v", got)
	}

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		tags                     []string // listed afterwards; nil: not checked
	}{
		{"assign by name", "POST", "/templates/tags", `{"target":"app","tags":["v1"]}`, 201, []string{"v1"}},
		{"assign by name:tag", "POST", "/templates/tags", `{"target":"app:v1","tags":["prod"]}`, 201, []string{"v1", "prod"}},
		// Any tag names the one version, as elsewhere.
		{"assign by an unknown tag", "POST", "/templates/tags", `{"target":"app:other","tags":["stable"]}`, 201,
			[]string{"v1", "prod", "stable"}},
		{"unknown template", "POST", "/templates/tags", `{"target":"nope","tags":["v1"]}`, 404, nil},
		{"unknown template with tag", "POST", "/templates/tags", `{"target":"nope:v1","tags":["v1"]}`, 404, nil},
		{"no target", "POST", "/templates/tags", `{"tags":["v1"]}`, 400, nil},
		{"bad target", "POST", "/templates/tags", `{"target":"a/b","tags":["v1"]}`, 400, nil},
		{"no tags", "POST", "/templates/tags", `{"target":"app","tags":[]}`, 400, nil},
		{"bad tag", "POST", "/templates/tags", `{"target":"app","tags":["x y"]}`, 400, nil},
		{"tag with a colon", "POST", "/templates/tags", `{"target":"app","tags":["a:b"]}`, 400, nil},
		{"tags not a list", "POST", "/templates/tags", `{"target":"app","tags":"v1"}`, 400, nil},
		{"malformed", "POST", "/templates/tags", `{"target":`, 400, []string{"v1", "prod", "stable"}},
		{"unnamed template", "POST", "/templates/tags", `{"target":"tpl-2","tags":["v1"]}`, 400, nil},
		{"remove", "DELETE", "/templates/tags", `{"name":"app","tags":["prod"]}`, 204, []string{"v1", "stable"}},
		{"remove absent", "DELETE", "/templates/tags", `{"name":"app","tags":["prod"]}`, 204, []string{"v1", "stable"}},
		{"remove from unknown", "DELETE", "/templates/tags", `{"name":"nope","tags":["v1"]}`, 404, nil},
		{"remove no name", "DELETE", "/templates/tags", `{"tags":["v1"]}`, 400, nil},
		{"remove no tags", "DELETE", "/templates/tags", `{"name":"app"}`, 400, []string{"v1", "stable"}},
		{"list by ID", "GET", "/templates/tpl-1/tags", ``, 200, nil},
		{"list by name:tag", "GET", "/templates/app:v1/tags", ``, 200, nil},
		{"list unknown", "GET", "/templates/nope/tags", ``, 404, nil},
	} {
		status, data := callRaw(t, tc.method, srv.URL+tc.path, tc.body)
		if status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, status, data, tc.status)
		}
		if tc.tags != nil {
			if got := listed(); strings.Join(got, ",") != strings.Join(tc.tags, ",") {
				t.Fatalf("%s: tags %v, want %v", tc.name, got, tc.tags)
			}
		}
	}

	// The answer to an assignment names the build and the tags.
	status, out := call(t, "POST", srv.URL+"/templates/tags", `{"target":"app","tags":["a","b"]}`, true)
	if status != 201 || len(out["buildID"].(string)) != 36 || fmt.Sprint(out["tags"]) != "[a b]" {
		t.Fatalf("assign: %d %v", status, out)
	}
	// Without the key, nothing.
	if status, _ := call(t, "GET", srv.URL+"/templates/app/tags", "", false); status != http.StatusUnauthorized {
		t.Fatalf("without the key: %d", status)
	}
}
