package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestIdempotencyKey(t *testing.T) {
	s := &Server{cfg: Config{MaxJSONBytes: 1 << 20}, logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		idem: newIdempotency()}
	var calls atomic.Int32
	release := make(chan struct{})
	h := s.idempotent(func(w http.ResponseWriter, r *http.Request) error {
		n := calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "slow") {
			<-release
		}
		writeJSON(w, http.StatusCreated, map[string]any{"call": n, "body": string(body)})
		return nil
	})
	do := func(ctx context.Context, key, body string) (int, string) {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/sandboxes", strings.NewReader(body))
		if key != "" {
			req.Header.Set(headerIdempotencyKey, key)
		}
		rec := httptest.NewRecorder()
		if err := h(rec, req); err != nil {
			writeError(rec, req, s.logger, err)
		}
		return rec.Code, rec.Body.String()
	}
	ctx := context.Background()

	code1, body1 := do(ctx, "k1", `{"a":1}`)
	code2, body2 := do(ctx, "k1", `{"a":1}`)
	if code1 != 201 || code2 != 201 || body1 != body2 || calls.Load() != 1 {
		t.Fatalf("retry: %d %q / %d %q, %d calls", code1, body1, code2, body2, calls.Load())
	}
	if code, _ := do(ctx, "k1", `{"a":2}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d", code)
	}
	do(ctx, "", `{"a":1}`)
	do(ctx, "", `{"a":1}`)
	if calls.Load() != 3 {
		t.Fatalf("requests without a key ran %d times, want 2 more", calls.Load()-1)
	}

	// Concurrent retries wait for the first and get its answer.
	var wg sync.WaitGroup
	answers := make([]string, 5)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, answers[i] = do(ctx, "k2", `"slow"`)
		}()
	}
	for calls.Load() < 4 {
		runtime.Gosched() // wait until the first is inside the handler
	}
	close(release)
	wg.Wait()
	for _, a := range answers {
		if a != answers[0] {
			t.Fatalf("answers differ: %q vs %q", a, answers[0])
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("concurrent retries ran the handler %d times", calls.Load()-3)
	}

	// A first request abandoned by its client is not replayed.
	abandoned, cancel := context.WithCancel(ctx)
	cancel()
	do(abandoned, "k3", `{}`)
	_, body := do(ctx, "k3", `{}`)
	if !strings.Contains(body, fmt.Sprintf(`"call":%d`, calls.Load())) || calls.Load() != 6 {
		t.Fatalf("retry after an abandoned request: %q (%d calls)", body, calls.Load())
	}
}
