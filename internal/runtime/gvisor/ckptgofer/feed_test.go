package ckptgofer

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// testWait bounds each wait on a condition: far longer than any should
// take.
const testWait = 10 * time.Second

// testSocket is an abstract socket name of the test's own, as the server's
// feeds use.
func testSocket(t *testing.T) string {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	return "@aenv-test-" + hex.EncodeToString(b[:])
}

type readRange struct{ off, n int64 }

// newTestFeed starts a feed of size bytes at socket; the channel has each
// range the gofer asks for.
func newTestFeed(t *testing.T, socket string, size int64) (*Feed, <-chan readRange) {
	t.Helper()
	reads := make(chan readRange, 64)
	f, err := NewFeed(socket, size, func(off, n int64) { reads <- readRange{off, n} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, reads
}

// newTestClient connects a gofer's client to the feed at socket. A failed
// feed ends the sandbox of the gofer's environment: here there is none.
func newTestClient(t *testing.T, socket string, grace time.Duration) *feedClient {
	t.Helper()
	t.Setenv(SandboxCgroupsEnv, "")
	c, err := dialFeed(socket, grace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

// startAwait waits for [off, off+n) in a goroutine of its own.
func startAwait(c *feedClient, off int64, n uint64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.await(off, n) }()
	return done
}

// waitRead waits for the feed to be asked for [off, off+n), skipping other
// ranges.
func waitRead(t *testing.T, reads <-chan readRange, off, n int64) {
	t.Helper()
	timeout := time.After(testWait)
	for {
		select {
		case r := <-reads:
			if r == (readRange{off, n}) {
				return
			}
		case <-timeout:
			t.Fatalf("the feed was not asked for [%d, +%d)", off, n)
		}
	}
}

func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testWait):
		t.Fatal("the wait did not end")
		return nil
	}
}

func requirePending(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("the wait ended (%v) before its range was ready", err)
	default:
	}
}

// A wait is answered once its range is ready, not before; one for a range
// ready is answered at once, and once every page is, none asks.
func TestFeedAnswersWaitAfterReady(t *testing.T) {
	socket := testSocket(t)
	feed, reads := newTestFeed(t, socket, 16*pageSize)
	c := newTestClient(t, socket, time.Minute)

	done := startAwait(c, pageSize, 2*pageSize)
	waitRead(t, reads, pageSize, 2*pageSize)
	feed.Ready(pageSize, pageSize)
	// Nothing answers it until the second page is ready: the feed has it
	// waiting (the read is told before the wait is kept, so ask again for
	// a ready range, whose answer comes after).
	if err := waitDone(t, startAwait(c, pageSize, pageSize)); err != nil {
		t.Fatalf("wait for a ready range: %v", err)
	}
	requirePending(t, done)
	feed.Ready(2*pageSize, pageSize)
	if err := waitDone(t, done); err != nil {
		t.Fatalf("wait: %v", err)
	}

	feed.Ready(0, 16*pageSize)
	if !feed.Complete() {
		t.Fatal("every page is ready, yet the feed is not complete")
	}
	// The feed's completeID reaches the client after that answer: wait
	// until it has, then the feed going no longer matters.
	deadline := time.Now().Add(testWait)
	for !c.quiet() {
		if time.Now().After(deadline) {
			t.Fatal("the client was not told the feed is complete")
		}
		time.Sleep(time.Millisecond)
	}
	feed.Close()
	if err := waitDone(t, startAwait(c, 10*pageSize, pageSize)); err != nil {
		t.Fatalf("wait after the feed completed and closed: %v", err)
	}
}

// A feed closed before it is complete (its server exiting) leaves the
// waits waiting; the client redials the socket and asks the successor
// again, which answers them.
func TestFeedClosedWaitsForSuccessor(t *testing.T) {
	socket := testSocket(t)
	feed, reads := newTestFeed(t, socket, 16*pageSize)
	c := newTestClient(t, socket, time.Minute)

	before := startAwait(c, 3*pageSize, pageSize)
	waitRead(t, reads, 3*pageSize, pageSize)
	if err := feed.Close(); err != nil {
		t.Fatal(err)
	}
	// Asked with no feed there (or the old connection not yet seen gone).
	between := startAwait(c, 5*pageSize, 2*pageSize)

	successor, reads2 := newTestFeed(t, socket, 16*pageSize)
	// Both are asked again of the successor, in either order.
	asked := map[readRange]bool{}
	timeout := time.After(testWait)
	for !asked[readRange{3 * pageSize, pageSize}] || !asked[readRange{5 * pageSize, 2 * pageSize}] {
		select {
		case r := <-reads2:
			asked[r] = true
		case <-timeout:
			t.Fatalf("the successor was asked for %v only", asked)
		}
	}
	requirePending(t, before)
	requirePending(t, between)
	successor.Ready(3*pageSize, pageSize)
	if err := waitDone(t, before); err != nil {
		t.Fatalf("wait asked of the closed feed: %v", err)
	}
	successor.Ready(5*pageSize, 2*pageSize)
	if err := waitDone(t, between); err != nil {
		t.Fatalf("wait asked between the feeds: %v", err)
	}
	after := startAwait(c, 9*pageSize, pageSize)
	waitRead(t, reads2, 9*pageSize, pageSize)
	successor.Ready(9*pageSize, pageSize)
	if err := waitDone(t, after); err != nil {
		t.Fatalf("wait asked of the successor: %v", err)
	}
}

// A failed feed fails the waits at once, and later ones, and a client
// connecting to it is told too: none waits for a successor.
func TestFeedFailEndsWaits(t *testing.T) {
	socket := testSocket(t)
	feed, reads := newTestFeed(t, socket, 16*pageSize)
	// A grace far beyond the test's waits: only failedID ends them in time.
	c := newTestClient(t, socket, time.Hour)

	done := startAwait(c, 0, pageSize)
	waitRead(t, reads, 0, pageSize)
	feed.Fail(errors.New("the fetch failed"))
	if err := waitDone(t, done); !errors.Is(err, ErrFailed) {
		t.Fatalf("wait on a failed feed: %v, want ErrFailed", err)
	}
	if err := c.await(pageSize, pageSize); !errors.Is(err, ErrFailed) {
		t.Fatalf("wait after the feed failed: %v, want ErrFailed", err)
	}

	late := newTestClient(t, socket, time.Hour)
	if err := waitDone(t, startAwait(late, 0, pageSize)); !errors.Is(err, ErrFailed) {
		t.Fatalf("wait of a client connecting to a failed feed: %v, want ErrFailed", err)
	}
}

// A feed gone with no successor within the grace fails the waits.
func TestFeedGoneForGood(t *testing.T) {
	const grace = 200 * time.Millisecond
	socket := testSocket(t)
	feed, reads := newTestFeed(t, socket, 16*pageSize)
	c := newTestClient(t, socket, grace)

	done := startAwait(c, 0, pageSize)
	waitRead(t, reads, 0, pageSize)
	closed := time.Now()
	feed.Close()
	if err := waitDone(t, done); !errors.Is(err, ErrFailed) {
		t.Fatalf("wait on a feed gone: %v, want ErrFailed", err)
	}
	if waited := time.Since(closed); waited < grace {
		t.Errorf("the wait failed %v after the feed went, before the grace of %v", waited, grace)
	}
	if err := c.await(pageSize, pageSize); !errors.Is(err, ErrFailed) {
		t.Fatalf("wait after the grace: %v, want ErrFailed", err)
	}
}

// Replies for ids not waited for (unknown, or answered already, as a
// request re-sent to a successor may be) are ignored, and the ids the feed
// replies with for the whole image are never a request's.
func TestFeedClientIgnoresStrayReplies(t *testing.T) {
	socket := testSocket(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := newTestClient(t, socket, time.Minute)
	ln.SetDeadline(time.Now().Add(testWait))
	conn, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testWait))
	readRequest := func() (uint32, readRange) {
		t.Helper()
		var buf [requestSize]byte
		if _, err := io.ReadFull(conn, buf[:]); err != nil {
			t.Fatal(err)
		}
		id := binary.LittleEndian.Uint32(buf[0:])
		if id == failedID || id == completeID {
			t.Fatalf("a request's id is the reserved %#x", id)
		}
		return id, readRange{int64(binary.LittleEndian.Uint64(buf[4:])), int64(binary.LittleEndian.Uint64(buf[12:]))}
	}
	reply := func(id uint32) {
		t.Helper()
		var buf [replySize]byte
		binary.LittleEndian.PutUint32(buf[:], id)
		if _, err := conn.Write(buf[:]); err != nil {
			t.Fatal(err)
		}
	}

	// The next ids would be the reserved ones: they are skipped.
	c.mu.Lock()
	c.nextID = failedID - 1
	c.mu.Unlock()
	a := startAwait(c, 0, pageSize)
	idA, _ := readRequest()
	b := startAwait(c, pageSize, pageSize)
	idB, _ := readRequest()
	if idA != failedID-1 || idB != 0 {
		t.Fatalf("request ids %#x, %#x; want %#x, 0", idA, idB, failedID-1)
	}

	reply(12345)
	reply(idB)
	// Replies are read in order: b answered, the unknown id was read.
	if err := waitDone(t, b); err != nil {
		t.Fatalf("wait b: %v", err)
	}
	requirePending(t, a)
	reply(idB) // answered already
	reply(idA)
	if err := waitDone(t, a); err != nil {
		t.Fatalf("wait a: %v", err)
	}
	next := startAwait(c, 2*pageSize, pageSize)
	idNext, r := readRequest()
	if r != (readRange{2 * pageSize, pageSize}) {
		t.Fatalf("asked for %v", r)
	}
	reply(idNext)
	if err := waitDone(t, next); err != nil {
		t.Fatalf("wait after the stray replies: %v", err)
	}
}

// impostorFeed is a process of another user (nobody) that binds socket and
// tells every gofer connecting that every range is ready: what a local
// user could do while the node's server restarts. It runs until the test
// ends.
const impostorFeed = `
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("\0" + sys.argv[1][1:])
s.listen(8)
print("ready", flush=True)
conns = []
while True:
    c, _ = s.accept()
    c.sendall(b"\xff\xff\xff\xff")
    conns.append(c)
`

// A gofer whose feed went takes no word from a process of another user
// that bound the socket meanwhile: its read waits, and fails after the
// grace, rather than reading pages that never arrived.
func TestFeedImpostorRefused(t *testing.T) {
	roottest.Require(t)
	socket := testSocket(t)
	f, reads := newTestFeed(t, socket, 64*pageSize)
	c := newTestClient(t, socket, 3*time.Second)
	done := startAwait(c, 0, pageSize)
	waitRead(t, reads, 0, pageSize)
	f.Close()

	cmd := exec.Command("/usr/bin/python3", "-c", impostorFeed, socket) // Debian's (python3-ipython), which any user may run
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		t.Fatalf("impostor: %q, %v", line, err)
	}
	if err := waitDone(t, done); !errors.Is(err, ErrFailed) {
		t.Fatalf("a read answered by another user's process: %v, want ErrFailed", err)
	}
}
