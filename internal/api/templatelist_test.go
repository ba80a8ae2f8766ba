package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/wire"
)

// templatesCatalog is a catalog holding only templates.
type templatesCatalog struct {
	downCatalog
	templates []*store.Template
}

func (c templatesCatalog) ListTemplates(context.Context) ([]*store.Template, error) {
	return c.templates, nil
}

// GET /templates lists a template whose first build runs (no record yet)
// with its build's status and shape, once if two nodes report it; a
// template rebuilt shows its build's status on its record.
func TestListTemplatesWithBuildsUnderWay(t *testing.T) {
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cat := templatesCatalog{templates: []*store.Template{{ID: "t1", Name: "app", RootfsPath: "/r/app", CreatedAt: created}}}
	building := []store.BuildProgress{
		{Template: "app", BuildID: "b1", Status: "building"},
		{Template: "fresh", BuildID: "b2", Status: "waiting", VCPU: 2, MemoryMB: 1024, Created: created},
		{Template: "fresh", BuildID: "b2", Status: "waiting", VCPU: 2, MemoryMB: 1024, Created: created},
	}
	h := NewCatalog(Config{APIKey: "k", Building: func() []store.BuildProgress { return building }}, cat,
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	req := httptest.NewRequest(http.MethodGet, "/templates", nil)
	req.Header.Set("X-API-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var got []wire.Template
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /templates: %d %s %v", rec.Code, rec.Body, err)
	}
	if len(got) != 2 {
		t.Fatalf("templates %+v, want app and fresh", got)
	}
	if got[0].TemplateID != "t1" || got[0].BuildStatus != "building" {
		t.Errorf("the rebuilt template: %+v, want t1 building", got[0])
	}
	if f := got[1]; f.TemplateID != "fresh" || f.Name != "fresh" || len(f.Aliases) != 1 || f.BuildStatus != "waiting" || f.Kind != "sandbox" ||
		f.CpuCount != 2 || f.MemoryMB != 1024 || !f.CreatedAt.Equal(created) {
		t.Errorf("the template of a first build: %+v", f)
	}
}

// A team lists its own first builds and public ones, never another
// team's.
func TestListTemplatesBuildsScoped(t *testing.T) {
	building := []store.BuildProgress{
		{Template: "mine", BuildID: "b1", Status: "building", TeamID: "lab-a"},
		{Template: "theirs", BuildID: "b2", Status: "building", TeamID: "lab-b"},
		{Template: "public", BuildID: "b3", Status: "waiting"},
	}
	h := NewCatalog(Config{APIKey: "k", Building: func() []store.BuildProgress { return building },
		Authorize: func(r *http.Request) (auth.Principal, bool) {
			return auth.Principal{TeamID: "lab-a"}, r.Header.Get("X-API-Key") == "team-key"
		}}, templatesCatalog{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	req := httptest.NewRequest(http.MethodGet, "/templates", nil)
	req.Header.Set("X-API-Key", "team-key")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var got []wire.Template
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /templates: %d %s %v", rec.Code, rec.Body, err)
	}
	var names []string
	for _, tpl := range got {
		names = append(names, tpl.TemplateID)
	}
	if len(names) != 2 || names[0] != "mine" || names[1] != "public" {
		t.Fatalf("lab-a lists %v, want its own build and the public one", names)
	}
}
