package client

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/wire"
)

// The client reads the server's answers into its own types (they keep the
// raw JSON for -o json); each field it reads must be one the OpenAPI
// document gives that answer, so that a renamed field fails here rather
// than reading as empty.
func TestClientTypesReadWireFields(t *testing.T) {
	tests := []struct {
		client any
		wire   []any // the answers the type is read from
	}{
		{Sandbox{}, []any{wire.Sandbox{}, wire.ListedSandbox{}, wire.SandboxDetail{}}},
		{Template{}, []any{wire.Template{}}},
		{Snapshot{}, []any{wire.Snapshot{}}},
		{ForkResult{}, []any{wire.ForkResult{}}},
		{CreateSandboxRequest{}, []any{wire.NewSandbox{}}},
		{Node{}, []any{wire.ClusterNode{}}},
		{TemplateBuildRequest{}, []any{wire.NewTemplateBuild{}}},
		{TemplateBuildRef{}, []any{wire.TemplateBuildRef{}}},
		{TemplateBuildSpec{}, []any{wire.TemplateBuildStart{}}},
		{TemplateStep{}, []any{wire.TemplateStep{}}},
		{TemplateBuildStatus{}, []any{wire.TemplateBuildInfo{}}},
		{BuildLogEntry{}, []any{wire.BuildLogEntry{}}},
		{BuildStatusReason{}, []any{wire.BuildStatusReason{}}},
		{ExecuteRequest{}, []any{wire.ExecuteRequest{}}},
		{ExecuteResult{}, []any{wire.ExecuteResult{}}},
		{Metric{}, []any{wire.SandboxMetric{}}},
		{NetworkPolicy{}, []any{wire.NetworkUpdate{}}},
		{Team{}, []any{wire.Team{}}},
		{TeamLimits{}, []any{wire.TeamLimits{}, wire.NewTeam{}}},
		{APIKey{}, []any{wire.APIKey{}, wire.CreatedAPIKey{}}},
		{AuditEvent{}, []any{wire.AuditEvent{}}},
		{TeamUsage{}, []any{wire.TeamUsage{}}},
	}
	for _, tt := range tests {
		name := reflect.TypeOf(tt.client).Name()
		known := map[string]bool{}
		for _, w := range tt.wire {
			for _, f := range jsonFields(reflect.TypeOf(w)) {
				known[f] = true
			}
		}
		var unknown []string
		for _, f := range jsonFields(reflect.TypeOf(tt.client)) {
			if !known[f] {
				unknown = append(unknown, f)
			}
		}
		sort.Strings(unknown)
		if len(unknown) > 0 {
			t.Errorf("client.%s reads %v, which the document does not give it", name, unknown)
		}
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}
