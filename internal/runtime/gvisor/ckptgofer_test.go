package gvisor

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/runtime"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
	"github.com/aenv-dev/aenv/internal/runtime/runtimetest"
)

// TestMain lets this test binary be the checkpoint gofer, as aenv is: runsc
// starts it under the gofer's name.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == ckptgofer.ProcessName {
		os.Exit(ckptgofer.Main(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// lazyImage is a checkpoint of a sandbox holding allocMiB of data, copied
// for a restore whose memory file arrives while it runs: every other file
// whole, the memory file at its size with nothing in it yet (under its
// partial name), a feed for it at socket (abstract, as the server's).
type lazyImage struct {
	d      *Driver
	fx     *runtimetest.Fixture
	parent *runtimetest.Sandbox
	sum    string // the parent's memory checksum
	dir    string
	src    *os.File // the memory file as checkpointed
	dst    *os.File // its lazy copy
	size   int64
	socket string

	mu       sync.Mutex
	feed     *ckptgofer.Feed // replaced when a test restarts it
	wanted   []int           // chunks read: out of order first, then in order of asking
	inOrder  int64           // the end of the furthest read in order
	askedEnd int64           // the end of the furthest read
	wants    int
	nudge    chan struct{}
}

const (
	allocMiB = 64
	chunk    = 1 << 20
)

func newLazyImage(t *testing.T) *lazyImage {
	t.Helper()
	runtimetest.RequireRoot(t)
	env := newTestEnv(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDriver(t, env)
	d.cfg.CheckpointGofer = exe
	if err := d.installGofer(); err != nil {
		t.Fatal(err)
	}
	l := &lazyImage{d: d, fx: runtimetest.NewFixture(t, d, env), nudge: make(chan struct{}, 1)}
	l.parent = l.fx.Start(t)
	l.sum = l.parent.Alloc(t, allocMiB)
	image := filepath.Join(t.TempDir(), "image")
	if err := d.Checkpoint(t.Context(), l.parent.Spec.ID, image, true); err != nil {
		t.Fatal(err)
	}
	l.dir = filepath.Join(t.TempDir(), "lazy")
	if err := os.Mkdir(l.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(image)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			t.Fatalf("image holds %s, not a regular file", e.Name())
		}
		if e.Name() != ckptgofer.PagesFile {
			copyFile(t, filepath.Join(image, e.Name()), filepath.Join(l.dir, e.Name()))
		}
	}
	if l.src, err = os.Open(filepath.Join(image, ckptgofer.PagesFile)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.src.Close() })
	info, err := l.src.Stat()
	if err != nil {
		t.Fatal(err)
	}
	l.size = info.Size()
	if l.size < allocMiB<<20 {
		t.Fatalf("pages file of %d bytes holds less than the %d MiB allocated", l.size, allocMiB)
	}
	// Named as aenv's fetch names it until it is complete.
	if l.dst, err = os.OpenFile(filepath.Join(l.dir, ckptgofer.PagesFile+ckptgofer.PartialSuffix), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.dst.Close() })
	if err := l.dst.Truncate(l.size); err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	crand.Read(b[:])
	l.socket = "@aenv-test-feed-" + hex.EncodeToString(b[:])
	if l.feed, err = ckptgofer.NewFeed(l.socket, l.size, l.want); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.currentFeed().Close() })
	if err := ckptgofer.WriteOptions(l.dir, l.socket); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *lazyImage) currentFeed() *ckptgofer.Feed {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.feed
}

func (l *lazyImage) chunks() int { return int((l.size + chunk - 1) / chunk) }

// want is told of each read, as aenv's fetch is: a read past the reads in
// order so far (by more than a chunk) is one the sandbox waits for out of
// the background load's order, and goes first.
func (l *lazyImage) want(off, n int64) {
	l.mu.Lock()
	var chunks []int
	for c := off / chunk; c <= (off+n-1)/chunk; c++ {
		chunks = append(chunks, int(c))
	}
	if off > l.inOrder+chunk {
		l.wanted = append(chunks, l.wanted...)
	} else {
		l.wanted = append(l.wanted, chunks...)
		l.inOrder = max(l.inOrder, off+n)
	}
	l.askedEnd = max(l.askedEnd, off+n)
	l.wants++
	l.mu.Unlock()
	select {
	case l.nudge <- struct{}{}:
	default:
	}
}

// copyChunk writes chunk c of the memory file and tells the feed.
func (l *lazyImage) copyChunk(c int, buf []byte) error {
	off := int64(c) * chunk
	n, err := l.src.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return err
	}
	if _, err := l.dst.WriteAt(buf[:n], off); err != nil {
		return err
	}
	l.currentFeed().Ready(off, int64(n))
	return nil
}

// fill writes the memory file: the chunks reads ask for first, in the
// order they ask, and, once rest is closed, the others in random order, a
// chunk every few milliseconds. A chunk keep refuses is never written. It ends when every
// other chunk is, or ctx ends.
func (l *lazyImage) fill(ctx context.Context, rest <-chan struct{}, keep func(c int) bool) error {
	buf := make([]byte, chunk)
	chunks := l.chunks()
	filled := make([]bool, chunks)
	left := 0
	for c := range chunks {
		if keep(c) {
			left++
		}
	}
	order := rand.Perm(chunks)
	next := 0
	for left > 0 {
		l.mu.Lock()
		c := -1
		for len(l.wanted) > 0 && c < 0 {
			first := l.wanted[0]
			l.wanted = l.wanted[1:]
			if !filled[first] && keep(first) {
				c = first
			}
		}
		l.mu.Unlock()
		for c < 0 && next < chunks && isClosed(rest) {
			if !filled[order[next]] && keep(order[next]) {
				c = order[next]
			}
			next++
		}
		if c < 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-l.nudge:
			case <-rest:
			}
			continue
		}
		filled[c] = true
		left--
		if err := l.copyChunk(c, buf); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.nudge:
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// A sandbox is restored from an image whose memory file arrives while the
// restore runs: in pieces, out of order, slowly, and the ranges the
// sandbox's reads wait for first. Its memory comes back intact, the reads
// went through the feed, and the gofer goes once the memory is loaded.
func TestRestoreWhilePagesArrive(t *testing.T) {
	l := newLazyImage(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Until the restore has returned, only what its reads wait for
	// arrives: it can only have read through the feed.
	restoreReturned := make(chan struct{})
	fillDone := make(chan error, 1)
	go func() { fillDone <- l.fill(ctx, restoreReturned, func(int) bool { return true }) }()

	child := l.fx.NewSpec(t)
	child.Spec.MemoryMB = l.parent.Spec.MemoryMB
	start := time.Now()
	if err := l.d.Restore(t.Context(), child.Spec, l.dir); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	restored := time.Since(start)
	close(restoreReturned)
	child.WaitReady(t)
	answered := time.Since(start)
	l.mu.Lock()
	wants := l.wants
	l.mu.Unlock()
	if got := child.AllocSum(t); got != l.sum {
		t.Errorf("memory restored through the gofer: checksum %s, want %s", got, l.sum)
	}
	select {
	case err := <-fillDone:
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the memory file was not filled within 2 minutes")
	}
	if err := os.Rename(l.dst.Name(), filepath.Join(l.dir, ckptgofer.PagesFile)); err != nil {
		t.Fatal(err)
	}
	t.Logf("pages file %d MiB in %d chunks: restore returned after %v, envd answered after %v, %d ranges waited for",
		l.size>>20, l.chunks(), restored.Round(time.Millisecond), answered.Round(time.Millisecond), wants)
	if wants == 0 {
		t.Error("no read of the memory file waited on the feed: the gofer was not used")
	}
	// Loaded, the sandbox no longer reads the image: the gofer ends.
	waitGone(t, l.d, child.Spec.ID)
	if got := child.AllocSum(t); got != l.sum {
		t.Errorf("memory after the load: checksum %s, want %s", got, l.sum)
	}
}

// The memory file cannot be completed (its feed fails, as when the fetch
// fails or the node's server dies): the sandbox never runs on with memory
// missing. The restore fails, or the gofer ends the sandbox; either way
// nothing of it is left after Kill.
func TestRestoreWhosePagesNeverArrive(t *testing.T) {
	l := newLazyImage(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The upper half of the file never arrives.
	half := l.chunks() / 2
	restoreDone := make(chan error, 1)
	go l.fill(ctx, make(chan struct{}), func(c int) bool { return c < half })

	child := l.fx.NewSpec(t)
	child.Spec.MemoryMB = l.parent.Spec.MemoryMB
	go func() { restoreDone <- l.d.Restore(t.Context(), child.Spec, l.dir) }()
	var restoreErr error
	returned := false
	select {
	case restoreErr = <-restoreDone:
		returned = true
	case <-time.After(10 * time.Second):
		// Waiting for what never comes: the failure ends it below.
	}
	if l.currentFeed().Complete() {
		t.Fatal("the memory file is complete; the test withholds half of it")
	}
	l.currentFeed().Fail(errors.New("the fetch failed"))
	if !returned {
		select {
		case restoreErr = <-restoreDone:
		case <-time.After(2 * time.Minute):
			t.Fatal("Restore did not return within 2 minutes of the feed failing")
		}
	}
	if restoreErr == nil {
		// Restored before the failure: the sandbox ends (its gofer kills
		// it; with this guest the failed reads alone also end it).
		waitFor := time.Now().Add(time.Minute)
		for {
			state, err := l.d.State(t.Context(), child.Spec.ID)
			if err != nil || state != runtime.StateRunning {
				t.Logf("restored, then ended once its memory feed failed: state %q, %v", state, err)
				break
			}
			if time.Now().After(waitFor) {
				t.Fatal("the sandbox still runs a minute after its memory feed failed")
			}
			time.Sleep(50 * time.Millisecond)
		}
	} else {
		t.Logf("restore failed: %v", restoreErr)
	}
	if err := l.d.Kill(t.Context(), child.Spec.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitGone(t, l.d, child.Spec.ID)
	// The parent is still there; nothing of the child is.
	for _, left := range l.fx.Leftovers(t) {
		if strings.Contains(left, child.Spec.ID) {
			t.Errorf("left after Kill: %s", left)
		}
	}
}

// The node's server exits while a sandbox's memory file is arriving: its
// feed closes without a word. The restarted server resumes the fetch into
// the same file with a new feed on the same socket. The sandbox's gofer
// waits for it, asks it again for what it waited for, and the sandbox runs
// on with its memory intact.
func TestRestoreFeedRestarted(t *testing.T) {
	l := newLazyImage(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The first server writes the lower half of the file: what reads wait
	// for first, then the rest of that half.
	half := l.chunks() / 2
	rest := make(chan struct{})
	close(rest)
	firstDone := make(chan error, 1)
	go func() { firstDone <- l.fill(ctx, rest, func(c int) bool { return c < half }) }()

	child := l.fx.NewSpec(t)
	child.Spec.MemoryMB = l.parent.Spec.MemoryMB
	restoreDone := make(chan error, 1)
	go func() { restoreDone <- l.d.Restore(t.Context(), child.Spec, l.dir) }()
	select {
	case err := <-firstDone:
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the lower half of the memory file was not filled within 2 minutes")
	}
	// Midway: the gofer waits for a range of the upper half.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l.mu.Lock()
		asked := l.askedEnd
		l.mu.Unlock()
		if asked > int64(half)*chunk {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read of the upper half 2 minutes on (reads up to byte %d)", asked)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-restoreDone:
		t.Logf("restore returned before the server exited: %v", err)
		restoreDone <- err
	default:
		t.Log("restore still waits for memory as the server exits")
	}

	// The server exits; a while later (the gap is the restart's, not for
	// correctness), the next one opens a feed on the socket the options
	// name, tells it what is on disk, and fetches the rest. It knows only
	// of the reads its own feed is asked for, and fetches nothing else
	// until one is: the gofer's waits can only be answered once it asked
	// again.
	if err := l.currentFeed().Close(); err != nil {
		t.Fatalf("close the first feed: %v", err)
	}
	time.Sleep(time.Second)
	opts := readOptions(t, l.dir)
	if opts.Feed != l.socket {
		t.Fatalf("options name the feed %q, want %q", opts.Feed, l.socket)
	}
	l.mu.Lock()
	l.wanted, l.inOrder = nil, 0
	wantsBefore := l.wants
	l.mu.Unlock()
	successor, err := ckptgofer.NewFeed(opts.Feed, l.size, l.want)
	if err != nil {
		t.Fatalf("the successor's feed: %v", err)
	}
	successor.Ready(0, int64(half)*chunk)
	l.mu.Lock()
	l.feed = successor
	l.mu.Unlock()
	// A gofer that did not come back never asks.
	fillCtx, cancelFill := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelFill()
	asked := make(chan struct{})
	go func() {
		for fillCtx.Err() == nil {
			l.mu.Lock()
			wants := l.wants
			l.mu.Unlock()
			if wants > wantsBefore {
				close(asked)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := l.fill(fillCtx, asked, func(c int) bool { return c >= half }); err != nil {
		l.mu.Lock()
		wants := l.wants - wantsBefore
		l.mu.Unlock()
		t.Fatalf("fill through the successor: %v (%d reads asked of it)", err, wants)
	}
	if !successor.Complete() {
		t.Fatal("the memory file is filled, yet the successor's feed is not complete")
	}

	select {
	case err := <-restoreDone:
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Restore did not return within 2 minutes of the memory file's completion")
	}
	child.WaitReady(t)
	if got := child.AllocSum(t); got != l.sum {
		t.Errorf("memory restored across the feed's restart: checksum %s, want %s", got, l.sum)
	}
	l.mu.Lock()
	wantsAfter := l.wants - wantsBefore
	l.mu.Unlock()
	if wantsAfter == 0 {
		t.Error("no read of the memory file waited on the successor's feed")
	}
	t.Logf("pages file %d MiB: %d ranges asked of the first feed, %d of the successor", l.size>>20, wantsBefore, wantsAfter)
	if err := os.Rename(l.dst.Name(), filepath.Join(l.dir, ckptgofer.PagesFile)); err != nil {
		t.Fatal(err)
	}
	// Loaded, the sandbox no longer reads the image: the gofer ends, and
	// the sandbox runs on.
	waitGone(t, l.d, child.Spec.ID)
	if state, err := l.d.State(t.Context(), child.Spec.ID); err != nil || state != runtime.StateRunning {
		t.Fatalf("after the load: state %q, %v; want running", state, err)
	}
	if got := child.AllocSum(t); got != l.sum {
		t.Errorf("memory after the load: checksum %s, want %s", got, l.sum)
	}
}

func readOptions(t *testing.T, dir string) ckptgofer.Options {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ckptgofer.OptionsFile))
	if err != nil {
		t.Fatal(err)
	}
	var opts ckptgofer.Options
	if err := json.Unmarshal(b, &opts); err != nil {
		t.Fatal(err)
	}
	return opts
}

// waitGone waits until no checkpoint gofer runs for sandbox id.
func waitGone(t *testing.T, d *Driver, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for goferIn(d, id) {
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint gofer still runs a minute on")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goferIn says whether a checkpoint gofer runs in sandbox id's cgroup,
// where runsc starts it.
func goferIn(d *Driver, id string) bool {
	for _, pid := range d.cgroups.procs(d.cgroupPath(id)) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if argv0, _, _ := strings.Cut(string(cmdline), "\x00"); argv0 == ckptgofer.ProcessName {
			return true
		}
	}
	return false
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
