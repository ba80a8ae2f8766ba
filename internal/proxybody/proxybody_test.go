package proxybody

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fullDuplexProxy is a proxy to upstream as the envd proxy and the gateway
// are: full duplex, answers marked by EndsEarly, and an error handler that
// ends the body when ended.
func fullDuplexProxy(t *testing.T, upstream *url.URL, ended bool) *httptest.Server {
	t.Helper()
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	proxy.ModifyResponse = func(resp *http.Response) error {
		EndsEarly(resp)
		return nil
	}
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, _ error) {
		if ended {
			defer EndBody(w, r)
		}
		w.WriteHeader(http.StatusBadGateway)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, KeepBody(r))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the unended panics below are expected
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// goneUpstream is an address nothing listens on any more.
func goneUpstream(t *testing.T) *url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// A proxy whose upstream is gone (a sandbox or node that just died)
// answers call after call on the client's one connection when its error
// handler ends the body; without it, net/http's server panics the
// connection away on the next call.
func TestEndBodyKeepsConnection(t *testing.T) {
	for _, ended := range []bool{true, false} {
		srv := fullDuplexProxy(t, goneUpstream(t), ended)
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
		if ended && failed > 0 {
			t.Errorf("with the body ended: %d of 20 calls failed", failed)
		}
		if !ended && failed == 0 {
			t.Log("without EndBody no call failed: the net/http behaviour it works around may be gone")
		}
	}
}

// A body still open and idle (a stream of input to a sandbox that just
// died) holds the error answer back for no more than a moment.
func TestEndBodyOpenBody(t *testing.T) {
	srv := fullDuplexProxy(t, goneUpstream(t), true)
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte(`{"first":"chunk"}`)) // then nothing, and the body stays open
	start := time.Now()
	resp, err := srv.Client().Post(srv.URL, "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || time.Since(start) > 30*time.Second {
		t.Fatalf("status %d after %s", resp.StatusCode, time.Since(start))
	}
}

// A streamed answer from a live upstream ends when the upstream ends it,
// though the client's body is still open: successful calls' bodies are
// left to the stream.
func TestStreamAnswerEndsWithBodyOpen(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Write([]byte("answered"))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	srv := fullDuplexProxy(t, u, true)
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("input"))
	done := make(chan string, 1)
	go func() {
		resp, err := srv.Client().Post(srv.URL, "application/octet-stream", pr)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	select {
	case got := <-done:
		if got != "answered" {
			t.Fatalf("answer %q", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the answer did not end while the request body stayed open")
	}
}

// An upstream that answers before it has read the body (a full volume, a
// file too big) has its answer reach the client with "Connection: close",
// and the client does not send its next call on a connection the server
// closes after the answer. An answer to a body read whole keeps the
// connection.
func TestEarlyAnswerEndsConnection(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/early" {
			io.CopyN(io.Discard, r.Body, 1<<10)
			w.WriteHeader(http.StatusInsufficientStorage)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	upstream.Config.ErrorLog = log.New(io.Discard, "", 0)
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	srv := fullDuplexProxy(t, u, true)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	in := bufio.NewReader(conn)
	call := func(path string, size int, wait bool) *http.Response {
		t.Helper()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: upstream\r\nContent-Length: %d\r\n\r\n", path, size)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			conn.Write(make([]byte, size)) // fails once the proxy drops the connection
		}()
		if wait {
			<-sent
		}
		resp, err := http.ReadResponse(in, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for range 2 {
		if resp := call("/whole", 256<<10, true); resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("a body read whole: status %d, connection closed: %v", resp.StatusCode, resp.Close)
		}
	}
	// Bigger than the socket buffers between the client and the upstream
	// hold: most of it is never read.
	resp := call("/early", 32<<20, false)
	if resp.StatusCode != http.StatusInsufficientStorage || !resp.Close {
		t.Fatalf("a body answered early: status %d, connection closed: %v (want 507 and Connection: close)", resp.StatusCode, resp.Close)
	}
	// What the header says is so: the proxy closes the connection (a
	// client that kept it would have its next call reset).
	if n, err := in.Read(make([]byte, 1)); err == nil {
		t.Fatalf("after the early answer the connection still carries data (%d bytes)", n)
	}
}

// Over HTTP/2 an early answer ends its stream alone: the answer says
// nothing of the connection, whose other calls go on.
func TestEarlyAnswerHTTP2KeepsConnection(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.CopyN(io.Discard, r.Body, 1<<10)
		w.WriteHeader(http.StatusInsufficientStorage)
	}))
	upstream.Config.ErrorLog = log.New(io.Discard, "", 0)
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	proxy.ModifyResponse = func(resp *http.Response) error {
		EndsEarly(resp)
		return nil
	}
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, KeepBody(r))
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	for range 3 {
		resp, err := srv.Client().Post(srv.URL, "application/octet-stream", bytes.NewReader(make([]byte, 8<<20)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusInsufficientStorage || resp.Close {
			t.Fatalf("HTTP/%d, status %d, connection closed: %v (want HTTP/2, 507, open)", resp.ProtoMajor, resp.StatusCode, resp.Close)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for three calls, want one", n)
	}
}

// An upgrade answered while the request body is still unsent keeps its
// Connection: Upgrade (the proxy would otherwise refuse it as a 502).
func TestEarlyAnswerKeepsUpgrade(t *testing.T) {
	resp := &http.Response{StatusCode: http.StatusSwitchingProtocols, Header: http.Header{"Connection": {"Upgrade"}}}
	req := KeepBody(httptest.NewRequest(http.MethodPost, "/", strings.NewReader("unsent")))
	resp.Request = req
	EndsEarly(resp)
	if got := resp.Header.Get("Connection"); got != "Upgrade" {
		t.Fatalf("Connection: %q, want Upgrade", got)
	}
	resp.StatusCode = http.StatusOK
	EndsEarly(resp)
	if got := resp.Header.Get("Connection"); got != "close" {
		t.Fatalf("Connection: %q, want close for an answer before the body", got)
	}
}
