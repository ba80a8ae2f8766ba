package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/auth"
	"github.com/aenv-dev/aenv/internal/cluster"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/store/postgres"
)

// forwardingGateway is a gateway forwarding every request to one node, at
// upstream's address, as it forwards calls naming a sandbox there; its
// proxy sends through transport.
func forwardingGateway(t *testing.T, upstream *httptest.Server, transport http.RoundTripper) *httptest.Server {
	t.Helper()
	g := &Gateway{logger: slog.New(slog.DiscardHandler), nodes: newNodes(nil, time.Minute, new(atomic.Int64)),
		routes: newRouteCache(16)}
	n := &nodeState{Node: postgres.Node{ID: "n1", Address: strings.TrimPrefix(upstream.URL, "http://")}, reachable: true}
	g.nodes.view.Store(&nodeView{byID: map[string]*nodeState{n.ID: n}, list: []*nodeState{n}})
	g.proxy = g.newProxy(transport)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.forwardNode(w, r, n.ID, "sb1", false)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// streamSteps orders one stream's steps across the client, the gateway's
// transport and the node.
type streamSteps struct {
	firstFrame chan struct{} // the client has the answer's first frame
	endRead    chan struct{} // the gateway's transport has read the request body's end
}

// waitStep is a bound on waiting for another party's step: generous, since
// a step that does not come only makes the stream fail.
const waitStep = 10 * time.Second

// TestForwardStream sends server streams through the gateway as the E2B
// SDK sends Connect ones over HTTP/1.1 (a request body of known length,
// then frames flushed one by one) and checks that each arrives whole, all
// its frames and a clean end, while its answer already flows.
//
// A node answers once it has a request's bytes, and the gateway's
// transport, sending them from a goroutine of its own, reads the body's
// end after that: on a busy machine, after the answer has begun. Go's
// HTTP/1 server would close the request body when the answer starts,
// and the transport's read of its end then failed and dropped the node's
// connection, cutting the answer short.
func TestForwardStream(t *testing.T) {
	const frames = 8
	for _, tc := range []struct {
		name string
		// split: the client sends the body past split bytes once the first
		// frame reached it (0: the body is sent whole), and the node answers
		// once it has those bytes.
		split int
		// pause: the gateway's transport reads the body's end only once the
		// client has the first frame, and the node sends the rest only
		// after that read: a busy machine's scheduling, made certain.
		pause       bool
		streams     int
		concurrency int
	}{
		{name: "the body's end read after the answer began", pause: true, streams: 4, concurrency: 2},
		{name: "the answer begins before the body ends", split: 5, streams: 2, concurrency: 2},
		{name: "many streams at once", streams: 400, concurrency: 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps sync.Map // body -> *streamSteps
			stepsOf := func(body string) *streamSteps {
				s, _ := steps.LoadOrStore(body, &streamSteps{firstFrame: make(chan struct{}), endRead: make(chan struct{})})
				return s.(*streamSteps)
			}
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				want := r.Header.Get("X-Body")
				first := len(want)
				if tc.split > 0 {
					first = tc.split
				}
				got := make([]byte, first)
				if _, err := io.ReadFull(r.Body, got); err != nil {
					http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
					return
				}
				rc := http.NewResponseController(w)
				if err := rc.EnableFullDuplex(); err != nil {
					t.Errorf("upstream full duplex: %v", err)
				}
				w.Header().Set("Content-Type", "application/connect+json")
				fmt.Fprintf(w, "frame 0\n")
				rc.Flush()
				rest, err := io.ReadAll(r.Body)
				if err != nil || string(got)+string(rest) != want {
					fmt.Fprintf(w, "bad body %q (err %v)\n", string(got)+string(rest), err)
					return
				}
				if tc.pause {
					select {
					case <-stepsOf(want).endRead:
					case <-r.Context().Done():
						return // the gateway dropped the connection
					case <-time.After(waitStep):
						fmt.Fprintf(w, "the gateway did not read the body's end\n")
						return
					}
				}
				for i := 1; i < frames; i++ {
					fmt.Fprintf(w, "frame %d\n", i)
					rc.Flush()
				}
				fmt.Fprintf(w, "end\n")
			}))
			t.Cleanup(upstream.Close)
			transport := newTransport()
			t.Cleanup(transport.CloseIdleConnections)
			var rt http.RoundTripper = transport
			if tc.pause {
				rt = roundTripFunc(func(r *http.Request) (*http.Response, error) {
					s := stepsOf(r.Header.Get("X-Body"))
					r = r.Clone(r.Context())
					r.Body = &pausingBody{ReadCloser: r.Body, wait: s.firstFrame, done: sync.OnceFunc(func() { close(s.endRead) })}
					return transport.RoundTrip(r)
				})
			}
			gw := forwardingGateway(t, upstream, rt)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: tc.concurrency}}
			t.Cleanup(client.CloseIdleConnections)

			var failed atomic.Int64
			work := make(chan int)
			var wg sync.WaitGroup
			for range tc.concurrency {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range work {
						body := fmt.Sprintf(`{"process":{"cmd":"echo %d"}}`, i)
						s := stepsOf(body)
						err := stream(client, gw.URL, body, tc.split, frames, sync.OnceFunc(func() { close(s.firstFrame) }))
						if err != nil && failed.Add(1) <= 3 {
							t.Errorf("stream %d: %v", i, err)
						}
					}
				}()
			}
			for i := range tc.streams {
				work <- i
			}
			close(work)
			wg.Wait()
			if n := failed.Load(); n > 0 {
				t.Errorf("%d of %d streams were not received whole", n, tc.streams)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pausingBody is a request body whose end the transport reads only once
// wait is closed: the last bytes come without io.EOF, which the next read
// returns after the wait; done is called when that read does return it (a
// body closed meanwhile fails it instead).
type pausingBody struct {
	io.ReadCloser
	wait    <-chan struct{}
	done    func()
	pending bool
}

func (b *pausingBody) Read(p []byte) (int, error) {
	if b.pending {
		select {
		case <-b.wait:
		case <-time.After(waitStep):
		}
		n, err := b.ReadCloser.Read(p)
		if err == io.EOF {
			b.done()
		}
		return n, err
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 && err == io.EOF {
		b.pending = true
		err = nil
	}
	return n, err
}

// stream makes one streaming call with body and checks its answer: frames
// frames, then "end", then a clean end of the body. firstFrame is called
// when the first frame arrives. With split > 0 the body past split bytes is
// sent only then (or, when it does not come, after a while, and the call
// fails).
func stream(client *http.Client, url, body string, split, frames int, firstFrame func()) error {
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url+"/process.Process/Start", pr)
	if err != nil {
		return err
	}
	req.ContentLength = int64(len(body)) // known, as the SDK's
	req.Header.Set("X-Body", body)

	gotFirst := make(chan struct{})
	firstArrived := sync.OnceFunc(func() {
		firstFrame()
		close(gotFirst)
	})
	var late atomic.Bool
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		if split == 0 {
			io.WriteString(pw, body)
			pw.Close()
			return
		}
		if _, err := io.WriteString(pw, body[:split]); err != nil {
			return
		}
		select {
		case <-gotFirst:
		case <-time.After(waitStep):
			late.Store(true)
		}
		io.WriteString(pw, body[split:])
		pw.Close()
	}()
	defer func() {
		firstArrived()
		pr.Close()
		<-sent
	}()

	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("call: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	r := bufio.NewReader(resp.Body)
	var lines []string
	s, err := r.ReadString('\n')
	for ; err == nil; s, err = r.ReadString('\n') {
		firstArrived()
		lines = append(lines, strings.TrimSuffix(s, "\n"))
	}
	if err != io.EOF {
		return fmt.Errorf("answer cut after %q: %w", lines, err)
	}
	if late.Load() {
		return fmt.Errorf("no answer while the request body was open (held until the body ended)")
	}
	want := make([]string, 0, frames+1)
	for i := range frames {
		want = append(want, fmt.Sprintf("frame %d", i))
	}
	want = append(want, "end")
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		return fmt.Errorf("frames %q, want %q", lines, want)
	}
	return nil
}

// A node answering that a sandbox is not there (gone, or moved to another
// node) drops the gateway's route to it; other answers keep it.
func TestRouteForgottenOnNotFound(t *testing.T) {
	for _, tc := range []struct {
		status int
		kept   bool
	}{
		{http.StatusOK, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusNotFound, false},
		{http.StatusBadGateway, false}, // envd traffic to a sandbox gone
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
			}))
			t.Cleanup(upstream.Close)
			g := &Gateway{logger: slog.New(slog.DiscardHandler), nodes: newNodes(nil, time.Minute, new(atomic.Int64)),
				routes: newRouteCache(16)}
			n := &nodeState{Node: postgres.Node{ID: "n1", Address: strings.TrimPrefix(upstream.URL, "http://")}, reachable: true}
			g.nodes.view.Store(&nodeView{byID: map[string]*nodeState{n.ID: n}, list: []*nodeState{n}})
			g.proxy = g.newProxy(newTransport())
			g.routes.put("sb1", "n1")
			rec := httptest.NewRecorder()
			g.forwardNode(rec, httptest.NewRequest(http.MethodGet, "/sandboxes/sb1/metrics", nil), "n1", "sb1", true)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			if _, ok := g.routes.get("sb1"); ok != tc.kept {
				t.Errorf("route kept: %v, want %v", ok, tc.kept)
			}
		})
	}
}

// oneSandboxDB is a cluster database that holds one sandbox record and
// one node, silent for an hour.
type oneSandboxDB struct {
	Store
	sb   *store.Sandbox
	node postgres.Node
}

func (d oneSandboxDB) ListNodes(context.Context) ([]postgres.Node, error) {
	n := d.node
	n.HeartbeatAge = time.Hour
	return []postgres.Node{n}, nil
}

func (d oneSandboxDB) GetSandbox(_ context.Context, id string) (*store.Sandbox, error) {
	if id != d.sb.ID {
		return nil, store.ErrNotFound
	}
	c := *d.sb
	return &c, nil
}

// When the node of another team's sandbox is unreachable, a caller learns
// nothing: not that the sandbox exists (an unreachable node's 503 would
// say so), nor can it resume it elsewhere (a takeover). Its own team and
// the operator are told the node is unreachable.
func TestUnreachableNodeHidesOtherTeams(t *testing.T) {
	sb := &store.Sandbox{ID: "sb1", NodeID: "n1", TeamID: "team-x", State: store.StatePaused, ImageDir: "/img",
		ImageUpload: store.UploadUploaded}
	db := oneSandboxDB{sb: sb, node: postgres.Node{ID: "n1", Address: "127.0.0.1:1", Protocol: cluster.Protocol}}
	g := &Gateway{logger: slog.New(slog.DiscardHandler), nodes: newNodes(db, time.Minute, new(atomic.Int64)),
		routes: newRouteCache(16), db: db, cfg: Config{MaxJSONBytes: 1 << 20}}
	if err := g.nodes.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.routes.put("sb1", "n1")
	for _, tc := range []struct {
		name   string
		caller auth.Principal
		path   string
		want   int
	}{
		{"another team's call", auth.Principal{TeamID: "team-y"}, "/sandboxes/sb1/metrics", http.StatusNotFound},
		{"another team's resume", auth.Principal{TeamID: "team-y"}, "/sandboxes/sb1/connect", http.StatusNotFound},
		{"its team's call", auth.Principal{TeamID: "team-x"}, "/sandboxes/sb1/metrics", http.StatusServiceUnavailable},
		{"its team's resume", auth.Principal{TeamID: "team-x"}, "/sandboxes/sb1/connect", http.StatusServiceUnavailable},
		{"the operator's call", auth.Operator(), "/sandboxes/sb1/metrics", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader("{}"))
			r = r.WithContext(auth.WithPrincipal(r.Context(), tc.caller))
			rec := httptest.NewRecorder()
			g.forwardSandbox(rec, r, "sb1", true)
			if rec.Code != tc.want {
				t.Fatalf("status %d (%s), want %d", rec.Code, rec.Body, tc.want)
			}
			if tc.want == http.StatusNotFound && strings.Contains(rec.Body.String(), "n1") {
				t.Errorf("the answer names the sandbox's node: %s", rec.Body)
			}
		})
	}
}
