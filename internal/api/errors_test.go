package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/store"
)

// downCatalog is a catalog whose database is away: every read fails as the
// PostgreSQL store fails when its server is down.
type downCatalog struct{}

func (downCatalog) err(what string) error {
	return fmt.Errorf("%s: dial unix /run/postgresql/.s.PGSQL.5432: connect: connection refused (%w)", what, store.ErrUnavailable)
}
func (c downCatalog) Get(context.Context, string) (*store.Sandbox, error) {
	return nil, c.err("get sandbox")
}
func (c downCatalog) SandboxTeam(context.Context, string) (string, error) {
	return "", c.err("get sandbox")
}
func (c downCatalog) List(context.Context, store.SandboxFilter) ([]*store.Sandbox, error) {
	return nil, c.err("list sandboxes")
}
func (c downCatalog) GetTemplate(context.Context, string) (*store.Template, error) {
	return nil, c.err("get template")
}
func (c downCatalog) TemplateNamed(context.Context, string) (*store.Template, error) {
	return nil, c.err("get template")
}
func (c downCatalog) ListTemplates(context.Context) ([]*store.Template, error) {
	return nil, c.err("list templates")
}
func (c downCatalog) ListSnapshots(context.Context, store.SnapshotFilter) ([]*store.Template, error) {
	return nil, c.err("list snapshots")
}

// A database outage answers 503 with a message, on every read a gateway
// serves from the database, never 500 "internal error" and never the
// database's own text.
func TestDatabaseOutageIs503(t *testing.T) {
	h := NewCatalog(Config{APIKey: "k"}, downCatalog{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	for _, path := range []string{"/sandboxes/sb1", "/sandboxes", "/v2/sandboxes", "/templates", "/templates/base", "/snapshots"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("X-API-Key", "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var body errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("GET %s: %d %q: %v", path, rec.Code, rec.Body, err)
		}
		if rec.Code != http.StatusServiceUnavailable || body.Code != http.StatusServiceUnavailable ||
			!strings.Contains(body.Message, "database is unavailable") || strings.Contains(body.Message, "PGSQL") {
			t.Errorf("GET %s: %d %+v, want 503 saying the database is unavailable", path, rec.Code, body)
		}
	}
}
