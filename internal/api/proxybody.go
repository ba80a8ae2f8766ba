package api

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// errCallEnded is what the transport reads from a request body once the
// call it came with has been answered.
var errCallEnded = errors.New("the call was answered; its body is no longer read")

// callBody is a request body as the proxy's transport gets it. The
// transport reads and closes bodies from goroutines of its own, and may
// do so after the call has been answered; end makes such late reads fail
// and closes do nothing, having waited for one in flight.
//
// end also reads what the transport left of the body (a dial to a dead
// node reads none of it), up to leftoverBytes. With full duplex on, Go's
// HTTP/1 server reads that rest itself after the handler returns, and
// reaching the body's end there starts its watch on the connection beside
// its read of the next request: the connection panics away, and the
// client's next call on it fails. Read while the handler still runs, the
// end of the body is reached where the server expects it. The bound is
// the server's own: past it, it gives up the connection instead.
type callBody struct {
	mu    sync.Mutex
	rc    io.ReadCloser
	ended bool
}

// GuardBody gives r, about to be proxied with full duplex on, a body that
// end (the returned func, to be called before the handler returns) cuts
// off; r without a body is left as it is.
func GuardBody(r *http.Request) (*http.Request, func()) {
	if r.Body == nil || r.Body == http.NoBody {
		return r, func() {}
	}
	b := &callBody{rc: r.Body}
	r2 := *r
	r2.Body = b
	return &r2, b.end
}

func (b *callBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, errCallEnded
	}
	return b.rc.Read(p)
}

func (b *callBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil // the server closes what is left of it
	}
	return b.rc.Close()
}

// leftoverBytes bounds what end reads of a body the call left unread, as
// net/http's server bounds its own reading of it.
const leftoverBytes = 256 << 10

func (b *callBody) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.ended = true
	io.CopyN(io.Discard, b.rc, leftoverBytes)
}
