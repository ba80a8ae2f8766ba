package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// packHold is a proxy in front of the S3 server that holds every whole
// GET of a pack made after the first ranged one (a lazy restore's handover:
// its ranged GETs are the packs' tails and the frames reads ask for),
// until release is closed. A lazy restore's memory file then cannot
// complete, while its sandbox runs on the frames it reads: those out of
// the restore's in-order load at once, the rest once the downloads stall.
// After holdAll, ranged GETs are held too: reads then wait.
type packHold struct {
	proxy   *httputil.ReverseProxy
	release chan struct{}

	mu     sync.Mutex
	ranged bool
	all    bool
	held   int
	// heldRanged counts the ranged GETs held: reads waiting on frames.
	heldRanged int
}

func startPackHold(t testing.TB, srv *s3test.Server) (*packHold, string) {
	t.Helper()
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	h := &packHold{proxy: httputil.NewSingleHostReverseProxy(target), release: make(chan struct{})}
	// The Host header stays the proxy's: the requests are signed for it.
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		h.open()
		ts.Close()
	})
	return h, ts.URL
}

func (h *packHold) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/chunks/") {
		h.mu.Lock()
		hold := false
		if h.all {
			h.held++
			if r.Header.Get("Range") != "" {
				h.heldRanged++
			}
			hold = true
		} else if r.Header.Get("Range") != "" {
			h.ranged = true
		} else if h.ranged {
			h.held++
			hold = true
		}
		h.mu.Unlock()
		if hold {
			select {
			case <-h.release:
			case <-r.Context().Done():
				return
			}
		}
	}
	h.proxy.ServeHTTP(w, r)
}

// holdAll holds ranged GETs of packs too, from now until release.
func (h *packHold) holdAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = true
}

func (h *packHold) heldCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func (h *packHold) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// midFetch is a sandbox restored lazily on node b from a snapshot of node
// a, b stopped (without killing its sandboxes) while the sandbox's memory
// was still arriving.
type midFetch struct {
	srv  *s3test.Server
	hold *packHold
	g    *gateway
	b    *server
	id   string // the sandbox on b
	snap string // the snapshot it was restored from
	want string // the memory digest of the snapshot's source
}

// stopMidFetch makes a midFetch.
func stopMidFetch(t *testing.T) midFetch {
	t.Helper()
	srv := s3test.Start(t)
	hold, endpoint := startPackHold(t, srv)
	c := newCluster(t)
	a := c.sharedNode("node-a", srv)
	// Lazy restores are the default. Its object store is behind the hold.
	b := c.sharedNode("node-b", srv, "--object-store-endpoint", endpoint, "--kill-on-exit=false", "--warm-snapshots", "0")
	g := c.addGateway()
	g.waitReady(t, "node-a", "node-b")

	src := a.create(map[string]any{"templateID": "base"}).SandboxID
	want := startMemoryKeeper(t, a, src)
	snap, err := a.api.CreateSnapshot(context.Background(), src, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "snapshot uploaded", func() bool {
		state, _ := templateUpload(t, g, snap.SnapshotID)
		return state == "uploaded"
	})

	id := b.create(map[string]any{"templateID": snap.SnapshotID}).SandboxID
	if res := b.exec(id, client.ExecuteRequest{Command: "echo restored"}); res.Stdout != "restored\n" {
		t.Fatalf("exec in the restored sandbox: %+v", res)
	}
	// From here the sandbox's reads of pages still to come wait too.
	hold.holdAll()
	if hold.heldCount() == 0 {
		t.Fatal("no download of the memory file was held: the test did not stop a fetch midway")
	}
	if strings.Contains(b.logs.String(), "memory file arrived") {
		t.Fatal("the memory file arrived although its packs were held")
	}

	// Whether the sandbox's reads still waited at the stop depends on how
	// far its restore's load had come by frames (hedged while the packs
	// were held); the fetch is unfinished either way.
	hold.mu.Lock()
	t.Logf("at the stop: %d downloads held, %d of them frames reads wait for", hold.held, hold.heldRanged)
	hold.mu.Unlock()
	b.stop(syscall.SIGTERM)
	if runscProcesses(id) == 0 {
		t.Fatal("the node's stop ended the sandbox whose memory was arriving")
	}
	// The next stop (cleanup) kills everything.
	b.extra = slices.DeleteFunc(b.extra, func(f string) bool { return f == "--kill-on-exit=false" })
	return midFetch{srv: srv, hold: hold, g: g, b: b, id: id, snap: snap.SnapshotID, want: want}
}

// TestClusterLazyRestoreSurvivesRestart: a node stopped (without killing
// its sandboxes) while the memory of a sandbox it restored from another
// node's snapshot is still arriving; the sandbox waits, the restarted node
// resumes the fetch into the same file, and the sandbox's memory is whole.
func TestClusterLazyRestoreSurvivesRestart(t *testing.T) {
	t.Parallel()
	m := stopMidFetch(t)
	b, id, want := m.b, m.id, m.want
	b.start()
	waitFor(t, time.Minute, "the fetch resumed", func() bool {
		return strings.Contains(b.logs.String(), "resuming the memory file")
	})
	m.hold.open()
	waitFor(t, 2*time.Minute, "the memory file arrived", func() bool {
		return strings.Contains(b.logs.String(), "memory file arrived")
	})
	if got, wantFile := memoryDigest(t, b.api, id); got != want || wantFile != want {
		t.Fatalf("after the restart: memory digest %q, file %q, want %q", got, wantFile, want)
	}
	// Restores from now on read the image whole from the cache.
	again := b.create(map[string]any{"templateID": m.snap}).SandboxID
	if got, wantFile := memoryDigest(t, b.api, again); got != want || wantFile != want {
		t.Fatalf("a create from the resumed image: memory digest %q, file %q, want %q", got, wantFile, want)
	}
}

// TestClusterLazyRestoreImageDeletedMeanwhile: the snapshot deleted while
// the node was stopped mid-fetch; the restarted node cannot resume the
// fetch, and tells the sandbox's gofer so at once: the sandbox ends within
// a minute, not once its gofer gives up waiting (5 minutes).
func TestClusterLazyRestoreImageDeletedMeanwhile(t *testing.T) {
	t.Parallel()
	m := stopMidFetch(t)
	if err := m.g.api.DeleteTemplate(context.Background(), m.snap); err != nil {
		t.Fatalf("delete the snapshot while node-b is stopped: %v", err)
	}
	m.hold.open()
	m.b.start()
	start := time.Now()
	waitFor(t, time.Minute, "the sandbox whose memory cannot come ended", func() bool {
		return runscProcesses(m.id) == 0
	})
	t.Logf("the sandbox ended %v after the node's start", time.Since(start))
	if !strings.Contains(m.b.logs.String(), "cannot be resumed") {
		t.Fatalf("the node did not say why the sandbox ended; its log:\n%s", m.b.logs.String())
	}
}
