// Package proxybody keeps the request bodies a full-duplex reverse proxy
// forwards (aenv's envd proxy and its gateway) from costing the client its
// connection: net/http's server and httputil.ReverseProxy each handle a
// body the upstream did not read in a way that, together, can leave a
// connection the client believes open closed under it.
package proxybody

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// endBodyWait bounds how long EndBody waits for the rest of a request body
// that is still arriving.
const endBodyWait = time.Second

type bodyKey struct{}

// proxiedBody is a proxied request's body, counted as the proxy's
// transport reads it to send it on.
type proxiedBody struct {
	io.ReadCloser
	length int64 // Content-Length, or -1 (chunked)
	http1  bool  // the client's connection is HTTP/1 (one call at a time)
	read   atomic.Int64
	ended  atomic.Bool
}

func (b *proxiedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}

// sent reports whether the whole body has been read to be sent upstream.
// An upstream cannot have received more than was read: an answer that
// needed the whole body comes after this is true.
func (b *proxiedBody) sent() bool {
	return b.ended.Load() || b.length >= 0 && b.read.Load() >= b.length
}

// KeepBody notes r's body in r's context for EndBody and EndsEarly. A
// proxy calls it on the request it forwards: httputil.ReverseProxy hands
// its error handler a request whose body it wrapped so that closing it
// does nothing.
func KeepBody(r *http.Request) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	b := &proxiedBody{ReadCloser: r.Body, length: r.ContentLength, http1: r.ProtoMajor < 2}
	r = r.WithContext(context.WithValue(r.Context(), bodyKey{}, b))
	r.Body = b
	return r
}

// EndBody finishes the body KeepBody noted while the handler still runs: a
// proxy's error handler calls it when its upstream failed (a sandbox or a
// node that just died), after writing the error.
//
// Why: a failed call leaves the body unread, and ReverseProxy keeps the
// transport from closing it. With full duplex on, Go's HTTP/1 server then
// reads it to its end after the handler returns, and reaching the end there
// starts its watch on the connection beside its read of the next request:
// the connection panics away ("invalid concurrent Body.Read call") and the
// client's next call on it fails. Closed here (which reads up to what the
// server itself would, 256 KiB), the end is reached while the handler runs,
// where the server expects it. A body still open and idle (a stream of
// input) is waited for at most endBodyWait, the answer flushed first so
// that the client has it meanwhile; what is left then costs the
// connection, not a hang. Successful calls are not touched.
func EndBody(w http.ResponseWriter, r *http.Request) {
	body, _ := r.Context().Value(bodyKey{}).(*proxiedBody)
	if body == nil {
		return
	}
	rc := http.NewResponseController(w)
	rc.Flush()
	rc.SetReadDeadline(time.Now().Add(endBodyWait))
	body.Close()
	rc.SetReadDeadline(time.Time{})
}

// EndsEarly marks "Connection: close" on an upstream's answer that starts
// before the proxy has sent all of the request body KeepBody noted (a
// volume or a file refused as it arrives: full, too big, not allowed). A
// proxy's ModifyResponse calls it.
//
// Why: the rest of such a body is never read, so the server closes the
// connection after the answer. Without full duplex it says so itself when
// the answer starts; with full duplex on it answers as if the connection
// stayed open. A client that had already handed the server its whole body
// then keeps the connection and sends its next call on it, which fails
// with a reset. Said in the answer, the client drops the connection
// instead. (An HTTP/2 stream ends on its own; there the header would close
// every stream of the connection. An upgrade's answer keeps its
// Connection: Upgrade.)
func EndsEarly(resp *http.Response) {
	if resp.Request == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	b, _ := resp.Request.Context().Value(bodyKey{}).(*proxiedBody)
	if b != nil && b.http1 && !b.sent() {
		resp.Header.Set("Connection", "close")
	}
}
