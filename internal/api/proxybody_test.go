package api

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// A full-duplex proxy whose upstream is gone (a sandbox or node that just
// died: the dial is refused) answers call after call on the client's one
// connection when the bodies are guarded; unguarded, net/http's server
// panics the connection away on the second call.
func TestGuardBodyKeepsConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := &url.URL{Scheme: "http", Host: l.Addr().String()}
	l.Close() // nothing listens there now
	for _, guarded := range []bool{true, false} {
		proxy := httputil.NewSingleHostReverseProxy(gone)
		proxy.ErrorLog = nil
		proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.NewResponseController(w).EnableFullDuplex()
			if guarded {
				var end func()
				r, end = GuardBody(r)
				defer end()
			}
			proxy.ServeHTTP(w, r)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the unguarded panics are expected
		srv.Start()
		failed := 0
		for range 20 {
			resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{"command":"true"}`))
			if err != nil {
				failed++
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		srv.Close()
		if guarded && failed > 0 {
			t.Errorf("guarded: %d of 20 calls failed", failed)
		}
		if !guarded && failed == 0 {
			t.Log("unguarded: no call failed (the net/http behaviour this guards against may be fixed)")
		}
	}
}
