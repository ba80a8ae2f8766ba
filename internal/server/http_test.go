package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHeaderBytesBounded: every listener refuses a header block beyond
// maxHeaderBytes with 431 before any handler (which might look up or keep
// a header's value) sees it; Go's default would take 1 MiB.
func TestHeaderBytesBounded(t *testing.T) {
	_, addr := startLimited(t, 16, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	for _, tc := range []struct {
		name string
		size int
		want int
	}{
		{"a 40 KiB key", 40 << 10, http.StatusNoContent},
		{"a 128 KiB key", 128 << 10, http.StatusRequestHeaderFieldsTooLarge},
		{"a 1000 KiB key", 1000 << 10, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/sandboxes", nil)
			req.Header.Set("X-API-Key", strings.Repeat("k", tc.size))
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}
