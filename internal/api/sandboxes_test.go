package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// recordingNode answers create, resume and setTimeout with a running
// sandbox and remembers what it was asked.
type recordingNode struct {
	noNode
	mu       sync.Mutex
	creates  []node.CreateRequest
	timeouts []time.Duration
	resumes  []time.Duration
}

func (n *recordingNode) Create(_ context.Context, req node.CreateRequest) (*store.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.creates = append(n.creates, req)
	sb := &store.Sandbox{ID: "sbx1", TemplateID: "base", State: store.StateRunning, AccessToken: "tok"}
	if req.Insecure {
		sb.AccessToken = ""
	}
	return sb, nil
}

func (n *recordingNode) SetTimeout(_ context.Context, _ string, d time.Duration) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.timeouts = append(n.timeouts, d)
	return nil
}

func (n *recordingNode) Resume(_ context.Context, id string, timeout time.Duration, _ bool) (*store.Sandbox, bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resumes = append(n.resumes, timeout)
	return &store.Sandbox{ID: id, State: store.StateRunning, AccessToken: "tok", EndAt: time.Now().Add(time.Hour)}, true, nil
}

func (n *recordingNode) lastCreate(t *testing.T) node.CreateRequest {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.creates) == 0 {
		t.Fatal("the node was asked for no sandbox")
	}
	return n.creates[len(n.creates)-1]
}

// TestCreateSecure checks E2B's secure flag: false on the v1 create gives
// a sandbox without an envd token and an answer without envdAccessToken;
// v2 (always secured in E2B) and an absent flag keep the token.
func TestCreateSecure(t *testing.T) {
	n := &recordingNode{}
	srv := tagServer(t, n)
	tests := []struct {
		name         string
		path, body   string
		wantStatus   int
		wantInsecure bool
	}{
		{"v1 secure false", "/sandboxes", `{"templateID":"base","secure":false}`, 201, true},
		{"v1 secure true", "/sandboxes", `{"templateID":"base","secure":true}`, 201, false},
		{"v1 secure absent", "/sandboxes", `{"templateID":"base"}`, 201, false},
		{"v2 always secure", "/v2/sandboxes", `{"templateID":"base","secure":false}`, 201, false},
		{"private needs secure", "/sandboxes", `{"templateID":"base","secure":false,"network":{"allowPublicTraffic":false}}`, 400, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(n.creates)
			status, body := callRaw(t, http.MethodPost, srv.URL+tt.path, tt.body)
			if status != tt.wantStatus {
				t.Fatalf("status %d %s, want %d", status, body, tt.wantStatus)
			}
			if status != 201 {
				if len(n.creates) != before {
					t.Fatal("a refused create reached the node")
				}
				return
			}
			if got := n.lastCreate(t).Insecure; got != tt.wantInsecure {
				t.Fatalf("node asked for Insecure %v, want %v", got, tt.wantInsecure)
			}
			var answer map[string]any
			if err := json.Unmarshal(body, &answer); err != nil {
				t.Fatalf("answer %s: %v", body, err)
			}
			if _, has := answer["envdAccessToken"]; has == tt.wantInsecure {
				t.Fatalf("answer %s: envdAccessToken present %v, want %v", body, has, !tt.wantInsecure)
			}
		})
	}
}

// TestTimeoutZero checks E2B's minimum of 0 for setTimeout (the deadline
// becomes now), resume and connect, and that negatives stay refused.
func TestTimeoutZero(t *testing.T) {
	n := &recordingNode{}
	srv := tagServer(t, n)
	tests := []struct {
		path, body string
		wantStatus int
	}{
		{"/sandboxes/sbx1/timeout", `{"timeout":0}`, 204},
		{"/sandboxes/sbx1/timeout", `{"timeout":-1}`, 400},
		{"/sandboxes/sbx1/resume", `{"timeout":0}`, 201},
		{"/sandboxes/sbx1/connect", `{"timeout":0}`, 201},
		{"/sandboxes/sbx1/connect", `{"timeout":-1}`, 400},
	}
	for _, tt := range tests {
		status, body := callRaw(t, http.MethodPost, srv.URL+tt.path, tt.body)
		if status != tt.wantStatus {
			t.Fatalf("POST %s %s: status %d %s, want %d", tt.path, tt.body, status, body, tt.wantStatus)
		}
	}
	if len(n.timeouts) != 1 || n.timeouts[0] != 0 {
		t.Fatalf("setTimeout calls %v, want one of 0", n.timeouts)
	}
	if len(n.resumes) != 2 || n.resumes[0] != 0 || n.resumes[1] != 0 {
		t.Fatalf("resume calls %v, want two with 0 (the sandbox's own lifetime)", n.resumes)
	}
}

// TestSignedByNeedsToken checks a signature computed with no token routes
// to no sandbox: secure: false sandboxes (and gateways' token sets holding
// them) must not match every such URL.
func TestSignedByNeedsToken(t *testing.T) {
	for _, token := range []string{"", "tok"} {
		sig := fileSignature("/f", "read", "user", token, "")
		r := httptest.NewRequest(http.MethodGet, "/files?path=/f&username=user&signature="+url.QueryEscape(sig), nil)
		if got, want := SignedBy(r, token), token != ""; got != want {
			t.Errorf("SignedBy with token %q = %v, want %v", token, got, want)
		}
	}
}

// TestParseTimeQueryBounds checks E2B's minimum of 0 for Unix-seconds
// times (metrics start/end).
func TestParseTimeQueryBounds(t *testing.T) {
	tests := []struct {
		value   string
		want    time.Time
		wantErr bool
	}{
		{"", time.Time{}, false},
		{"0", time.Unix(0, 0), false},
		{"1700000000", time.Unix(1700000000, 0), false},
		{"2024-01-02T03:04:05Z", time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), false},
		{"-1", time.Time{}, true},
		{"soon", time.Time{}, true},
	}
	for _, tt := range tests {
		got, err := parseTimeQuery(url.Values{"start": {tt.value}}, "start")
		if (err != nil) != tt.wantErr || !got.Equal(tt.want) {
			t.Errorf("parseTimeQuery(%q) = %v, %v; want %v (error %v)", tt.value, got, err, tt.want, tt.wantErr)
		}
	}
}
