package api

import (
	"context"
	"io"
	"net/http"
	"time"
)

// endBodyWait bounds how long EndBody waits for the rest of a request body
// that is still arriving.
const endBodyWait = time.Second

type bodyKey struct{}

// KeepBody notes r's body in r's context for EndBody. A proxy calls it on
// the request it forwards: httputil.ReverseProxy hands its error handler
// a request whose body it wrapped so that closing it does nothing.
func KeepBody(r *http.Request) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), bodyKey{}, r.Body))
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
	body, _ := r.Context().Value(bodyKey{}).(io.ReadCloser)
	if body == nil {
		return
	}
	rc := http.NewResponseController(w)
	rc.Flush()
	rc.SetReadDeadline(time.Now().Add(endBodyWait))
	body.Close()
	rc.SetReadDeadline(time.Time{})
}
