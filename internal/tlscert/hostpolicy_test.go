package tlscert_test

import (
	"context"
	"testing"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/tlscert"
)

// An external test: the API's host parsing is what the policy is given in
// the server, and the API (through the egress gateway) imports tlscert.
func TestHostPolicy(t *testing.T) {
	const domain = "aenv.test"
	id := "abcdefghij0123456789"
	policy := tlscert.HostPolicy(domain, func(_ context.Context, h string) bool { _, _, ok := api.ExposedPort(h, domain); return ok })
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"aenv.test", true},
		{"api.aenv.test", true},
		{"API.AENV.TEST", true},
		{"api.aenv.test:80", true},
		{"evil.test:80", false},
		{"49983-" + id + ".aenv.test", true},
		{"8080-" + id + ".aenv.test", true},
		{"www.aenv.test", false},
		{"8080-short.aenv.test", false},
		{"70000-" + id + ".aenv.test", false},
		{"8080-" + id + ".other.test", false},
		{"x.api.aenv.test", false},
		{"evil.test", false},
		{"", false},
	} {
		if err := policy(context.Background(), tc.host); (err == nil) != tc.ok {
			t.Errorf("%q: allowed %v, want %v (%v)", tc.host, err == nil, tc.ok, err)
		}
	}
	if tlscert.HostPolicy("", nil)(context.Background(), "anything") == nil {
		t.Error("no domain allowed a host")
	}
}
