package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/requestid"
)

// The node keeps a gateway's request ID (or makes one), logs it in its
// lines for the request and echoes it; an exposed port's traffic passes
// untouched.
func TestNodeRequestID(t *testing.T) {
	const domain = "aenv.test"
	for _, tc := range []struct {
		name, host, sent string
		wantKept         bool
		wantNone         bool // no ID at all (exposed port)
	}{
		{name: "from the gateway", host: "node:3000", sent: "gw-1", wantKept: true},
		{name: "none sent", host: "node:3000"},
		{name: "exposed port", host: "8080-sbexposed01234567890." + domain, sent: "app-own", wantNone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			logger := requestLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
			var seen string
			h := withRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen = r.Header.Get(requestid.Header)
				logger.InfoContext(r.Context(), "handled")
			}), domain)
			r := httptest.NewRequest(http.MethodGet, "/sandboxes", nil)
			r.Host = tc.host
			if tc.sent != "" {
				r.Header.Set(requestid.Header, tc.sent)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)

			var line map[string]any
			if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &line); err != nil {
				t.Fatalf("log %q: %v", buf.String(), err)
			}
			logged, _ := line[requestid.LogKey].(string)
			answered := w.Header().Get(requestid.Header)
			if tc.wantNone {
				if answered != "" || logged != "" || seen != tc.sent {
					t.Errorf("exposed port touched: answer %q, logged %q, app saw %q", answered, logged, seen)
				}
				return
			}
			if !requestid.Valid(answered) || logged != answered || seen != answered {
				t.Errorf("answer %q, logged %q, handler saw %q: want one valid ID", answered, logged, seen)
			}
			if tc.wantKept && answered != tc.sent {
				t.Errorf("answer %q, want the gateway's %q", answered, tc.sent)
			}
			if !strings.Contains(buf.String(), `"msg":"handled"`) {
				t.Errorf("log %q", buf.String())
			}
		})
	}
}
