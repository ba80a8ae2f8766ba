package requestid

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"abc-123", true},
		{"0123456789abcdef0123456789abcdef", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{"has space", false},
		{"new\nline", false},
		{"tab\t", false},
		{"caf\u00e9", false},
		{"del\x7f", false},
	} {
		if got := Valid(tc.id); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

func TestMiddleware(t *testing.T) {
	for _, tc := range []struct {
		name, sent string
		kept       bool
	}{
		{"caller's ID kept", "req-42", true},
		{"none sent", "", false},
		{"invalid replaced", "two words", false},
		{"too long replaced", strings.Repeat("x", 500), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var inHeader, inContext string
			h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inHeader, inContext = r.Header.Get(Header), FromContext(r.Context())
			}))
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			if tc.sent != "" {
				r.Header.Set(Header, tc.sent)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			got := w.Header().Get(Header)
			if !Valid(got) {
				t.Fatalf("answer's ID %q is not valid", got)
			}
			if tc.kept && got != tc.sent {
				t.Errorf("answer's ID = %q, want the caller's %q", got, tc.sent)
			}
			if !tc.kept && got == tc.sent {
				t.Errorf("caller's ID %q kept", tc.sent)
			}
			if inHeader != got || inContext != got {
				t.Errorf("handler saw header %q and context %q, answer says %q", inHeader, inContext, got)
			}
			if r.Header.Get(Header) != tc.sent {
				t.Errorf("the caller's request was changed: header %q", r.Header.Get(Header))
			}
		})
	}
}

func TestMiddlewareMakesDistinctIDs(t *testing.T) {
	h := Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	seen := map[string]bool{}
	for range 100 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		id := w.Header().Get(Header)
		if seen[id] {
			t.Fatalf("ID %q made twice", id)
		}
		seen[id] = true
	}
}

func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "api")
	ctx := WithID(t.Context(), "req-7")
	logger.InfoContext(ctx, "with ID")
	logger.Info("without ID")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	for i, want := range []string{"req-7", ""} {
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &rec); err != nil {
			t.Fatal(err)
		}
		got, _ := rec[LogKey].(string)
		if got != want {
			t.Errorf("line %d: %s = %q, want %q (%s)", i, LogKey, got, want, lines[i])
		}
		if rec["component"] != "api" {
			t.Errorf("line %d lost the logger's attributes: %s", i, lines[i])
		}
	}
}

// A logger wrapped twice (a server's logger handed to a gateway that wraps
// it again) names the ID once.
func TestLogHandlerWrappedTwice(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(LogHandler(LogHandler(slog.NewJSONHandler(&buf, nil))))
	logger.InfoContext(WithID(t.Context(), "req-8"), "once")
	if n := strings.Count(buf.String(), `"`+LogKey+`"`); n != 1 {
		t.Errorf("%s appears %d times: %s", LogKey, n, buf.String())
	}
}
