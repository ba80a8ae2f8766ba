// Package ckptgofer lets `runsc restore` start before a checkpoint image's
// memory file has fully arrived.
//
// runsc reads a restore's files through a "checkpoint gofer" sidecar when
// the image directory holds a gcs_opts.json: it starts the gofer (from
// $GVISOR_SIDECAR_BINARIES_DIR/checkpointgofer) on a socket pair and reads
// checkpoint.img, pages_meta.img and pages.img over gVisor's stateipc
// protocol. With --background the sandbox runs while pages.img loads, and a
// page the guest touches first is read ahead of the rest.
//
// This package is both sides of that:
//   - Main is the gofer, run by runsc (aenv re-executes itself under the
//     gofer's name). It serves the image's files, and holds each read of
//     pages.img until the range is on disk.
//   - Feed is the image's writer's side (the node fetching the image): it
//     listens on a socket the gofer connects to, learns which ranges the
//     gofer waits for (so that the writer can fetch those first), and
//     answers each once the writer says its range is written.
//
// The protocol between them is this package's own: a request is a read's
// range (id, offset, length), a reply its id. Two ids are reserved for the
// feed's word on the whole image: completeID (every range is ready) and
// failedID (the image will never arrive: every read fails, and the gofer
// ends the sandbox). A connection that ends without either is a feed gone
// with its writer (the node's server exiting, say): the gofer keeps its
// reads waiting and redials the same socket, where a restarted server
// serves the same file with a new Feed, and asks the new one again.
package ckptgofer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// OptionsFile is the file in an image directory that makes runsc read
	// the image through the gofer (gVisor's name for it).
	OptionsFile = "gcs_opts.json"
	// PagesFile is the memory file whose reads wait for their ranges;
	// until it is complete it is named PagesFile+PartialSuffix (as
	// objectstore.GetLazy writes it), so that a restore reading it any
	// other way than through the gofer finds no file rather than zeros.
	PagesFile     = "pages.img"
	PartialSuffix = ".partial"
	// BinaryName is the gofer's file name in the sidecar directory, and
	// ProcessName its argv[0] as runsc starts it.
	BinaryName  = "checkpointgofer"
	ProcessName = "runsc-checkpointgofer"
	// SidecarDirEnv names the directory runsc takes sidecars from.
	SidecarDirEnv = "GVISOR_SIDECAR_BINARIES_DIR"

	// SandboxCgroupsEnv lists (separated by ':') the cgroup directories of
	// the sandbox a restore's gofer serves; the driver sets it on `runsc
	// restore`, whose environment the gofer inherits.
	SandboxCgroupsEnv = "AENV_SANDBOX_CGROUPS"

	// DefaultReconnectGrace is how long a gofer whose feed went without a
	// word waits for a successor before it fails its reads and ends the
	// sandbox: long enough for the node's server to restart.
	DefaultReconnectGrace = 5 * time.Minute

	pageSize     = 4096
	requestSize  = 20 // id u32, offset u64, length u64
	replySize    = 4  // id u32
	maxReadBytes = 256 << 10
	// completeID is the reply that says every range is ready: the gofer
	// asks no more, and the feed going away no longer matters to it.
	completeID = ^uint32(0)
	// failedID is the reply that says the image will never arrive: the
	// gofer waits for no successor, and fails every read.
	failedID = ^uint32(0) - 1
	// failWriteTimeout bounds telling a gofer of the failure: one that
	// stopped reading must not hold up Fail.
	failWriteTimeout = time.Second
)

// Options is what the gofer reads from OptionsFile.
type Options struct {
	// Dir holds the image's files (the directory OptionsFile is in).
	Dir string `json:"dir"`
	// Feed is the socket of the Feed for pages.img; empty when the file is
	// whole.
	Feed string `json:"feed,omitempty"`
	// ReconnectSeconds is how long the gofer waits for a successor on Feed
	// once the feed is gone without a word (0: DefaultReconnectGrace).
	ReconnectSeconds int `json:"reconnect_seconds,omitempty"`
}

// WriteOptions makes runsc read the image in dir through the gofer, with
// reads of pages.img waiting on the feed at socket (none if empty).
func WriteOptions(dir, socket string) error {
	b, err := json.Marshal(Options{Dir: dir, Feed: socket})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, OptionsFile), b, 0o600); err != nil {
		return fmt.Errorf("checkpoint gofer options: %w", err)
	}
	return nil
}

// ReadOptions reads the options WriteOptions wrote in dir.
func ReadOptions(dir string) (Options, error) {
	f, err := os.Open(filepath.Join(dir, OptionsFile))
	if err != nil {
		return Options{}, err
	}
	defer f.Close()
	return decodeOptions(f)
}

// decodeOptions decodes an options file, read up to 64 KiB (WriteOptions
// writes a few hundred bytes).
func decodeOptions(r io.Reader) (Options, error) {
	var opts Options
	if err := json.NewDecoder(io.LimitReader(r, 64<<10)).Decode(&opts); err != nil {
		return Options{}, fmt.Errorf("checkpoint gofer options: %w", err)
	}
	return opts, nil
}

// samePeerUser fails unless the process at the other end of conn runs as
// this one's user. An abstract socket has no file permissions: any process
// of the host may bind a name the moment it is free (while the node's
// server restarts) or connect to it. A gofer must take its pages' word
// (complete, failed, ready) only from the node's server, and a feed serve
// only its gofers: both run as root, as runsc does.
func samePeerUser(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("peer credentials: %w", credErr)
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("peer (pid %d) runs as uid %d, not %d", cred.Pid, cred.Uid, os.Geteuid())
	}
	return nil
}

// ErrFailed is what reads waiting on a failed feed see (or on one gone with
// no successor within the grace).
var ErrFailed = errors.New("image feed failed")

// Feed answers the gofer's waits on pages.img. Ready marks ranges written;
// a wait is answered once every page of its range is.
type Feed struct {
	ln    *net.UnixListener
	size  int64
	reads func(off, n int64)

	mu      sync.Mutex
	ready   []uint64 // one bit a page
	left    int      // pages not ready
	waits   []*wait
	conns   map[*feedConn]struct{}
	failed  error
	closed  bool
	serving sync.WaitGroup
}

type wait struct {
	c       *feedConn
	id      uint32
	off, n  int64
	pending int // pages of the range not ready yet
}

type feedConn struct {
	conn *net.UnixConn
	wmu  sync.Mutex
}

// NewFeed listens at socket for the gofer of a pages file of size bytes.
// reads, if not nil, is told of each range the gofer reads, in the order
// it asks, whether written yet or not: the writer's cue to fetch what is
// not. It is called without the feed's lock held, and must not block long.
func NewFeed(socket string, size int64, reads func(off, n int64)) (*Feed, error) {
	if size < 0 {
		return nil, fmt.Errorf("feed: negative size %d", size)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	pages := int((size + pageSize - 1) / pageSize)
	f := &Feed{ln: ln, size: size, reads: reads, ready: make([]uint64, (pages+63)/64),
		left: pages, conns: map[*feedConn]struct{}{}}
	f.serving.Add(1)
	go f.accept()
	return f, nil
}

func (f *Feed) accept() {
	defer f.serving.Done()
	backoff := time.Millisecond
	for {
		conn, err := f.ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors, say: a gofer dialing meanwhile waits
			// in the backlog.
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		if samePeerUser(conn) != nil {
			conn.Close()
			continue
		}
		c := &feedConn{conn: conn}
		f.mu.Lock()
		if f.failed != nil {
			f.mu.Unlock()
			// Told, the gofer waits for no successor on this socket.
			c.fail()
			continue
		}
		if f.closed && f.left > 0 {
			// Accepted as Close stopped listening: as with the connections
			// Close ends, the gofer redials, and the successor serves it. (A
			// complete feed serves it: it answers everything at once.)
			f.mu.Unlock()
			conn.Close()
			continue
		}
		f.conns[c] = struct{}{}
		f.serving.Add(1)
		f.mu.Unlock()
		go f.serve(c)
	}
}

// serve reads c's requests until it closes.
func (f *Feed) serve(c *feedConn) {
	defer f.serving.Done()
	defer f.drop(c)
	if f.Complete() {
		if c.reply(completeID) != nil {
			return
		}
	}
	var buf [requestSize]byte
	for {
		if _, err := io.ReadFull(c.conn, buf[:]); err != nil {
			return
		}
		id := binary.LittleEndian.Uint32(buf[0:])
		off := int64(binary.LittleEndian.Uint64(buf[4:]))
		n := int64(binary.LittleEndian.Uint64(buf[12:]))
		if off < 0 || n < 0 || off > f.size {
			return // not our gofer: its reads stay within the file
		}
		n = min(n, f.size-off)
		f.mu.Lock()
		reads := f.reads
		f.mu.Unlock()
		if reads != nil {
			reads(off, n)
		}
		w := &wait{c: c, id: id, off: off, n: n}
		f.mu.Lock()
		w.pending = f.countUnready(off, n)
		ready := w.pending == 0
		if !ready {
			f.waits = append(f.waits, w)
		}
		f.mu.Unlock()
		if ready {
			if c.reply(id) != nil {
				return
			}
			continue
		}
	}
}

func (f *Feed) drop(c *feedConn) {
	c.conn.Close()
	f.mu.Lock()
	delete(f.conns, c)
	kept := f.waits[:0]
	for _, w := range f.waits {
		if w.c != c {
			kept = append(kept, w)
		}
	}
	clear(f.waits[len(kept):])
	f.waits = kept
	f.mu.Unlock()
}

// fail tells the gofer at c that the image will not arrive, and closes c.
func (c *feedConn) fail() {
	// Also ends a reply blocked on a gofer that stopped reading, and with
	// it the wait for wmu.
	c.conn.SetWriteDeadline(time.Now().Add(failWriteTimeout))
	c.reply(failedID)
	c.conn.Close()
}

func (c *feedConn) reply(id uint32) error {
	var buf [replySize]byte
	binary.LittleEndian.PutUint32(buf[:], id)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.conn.Write(buf[:])
	return err
}

// pageRange returns the pages [first, end) that bytes [off, off+n) touch.
func pageRange(off, n int64) (first, end int) {
	return int(off / pageSize), int((off + n + pageSize - 1) / pageSize)
}

// countUnready counts the pages of [off, off+n) not ready. f.mu is held.
func (f *Feed) countUnready(off, n int64) int {
	first, end := pageRange(off, n)
	count := 0
	for p := first; p < end; p++ {
		if f.ready[p/64]&(1<<(p%64)) == 0 {
			count++
		}
	}
	return count
}

// Ready marks bytes [off, off+n) of the pages file as written (and synced
// as far as the reader needs: the gofer reads the same file on this host)
// and answers the waits it completes. A range is rounded out to whole
// pages: write pages whole before marking them.
func (f *Feed) Ready(off, n int64) {
	if n <= 0 || off < 0 || off >= f.size {
		return
	}
	n = min(n, f.size-off)
	first, end := pageRange(off, n)
	var done []*wait
	f.mu.Lock()
	for p := first; p < end; p++ {
		word, bit := p/64, uint64(1)<<(p%64)
		if f.ready[word]&bit == 0 {
			f.ready[word] |= bit
			f.left--
		}
	}
	for _, w := range f.waits {
		if wFirst, wEnd := pageRange(w.off, w.n); wFirst < end && first < wEnd {
			w.pending = f.countUnready(w.off, w.n)
		}
	}
	kept := f.waits[:0]
	for _, w := range f.waits {
		if w.pending == 0 {
			done = append(done, w)
		} else {
			kept = append(kept, w)
		}
	}
	clear(f.waits[len(kept):])
	f.waits = kept
	var conns []*feedConn
	if f.left == 0 {
		f.reads = nil // its writer is done: let go of it
		for c := range f.conns {
			conns = append(conns, c)
		}
	}
	f.mu.Unlock()
	for _, w := range done {
		if err := w.c.reply(w.id); err != nil {
			w.c.conn.Close() // its serve loop drops it
		}
	}
	for _, c := range conns {
		if err := c.reply(completeID); err != nil {
			c.conn.Close()
		}
	}
}

// Complete says whether every page is ready.
func (f *Feed) Complete() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.left == 0
}

// Fail ends the feed with err: each gofer connected is told the image will
// not arrive (failedID) and its connection closed, and so is each gofer
// that connects later (until Close), so that every read it waits for, and
// every later one, fails, and its sandbox ends.
func (f *Feed) Fail(err error) {
	f.mu.Lock()
	if f.failed == nil {
		f.failed = err
	}
	conns := f.takeConns()
	f.mu.Unlock()
	for _, c := range conns {
		c.fail()
	}
}

// takeConns forgets the feed's connections, their waits and its writer's
// cue, and returns the connections to end. f.mu is held.
func (f *Feed) takeConns() []*feedConn {
	conns := make([]*feedConn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	clear(f.conns)
	f.waits = nil
	f.reads = nil
	return conns
}

// Close stops listening. A feed not complete (nor failed) closes its
// connections without a word, as its writer's process exiting would, and
// waits for its goroutines: the gofers keep their reads waiting for a
// while and redial the socket, where a successor (a new Feed for the same
// file, from the restarted server) answers them. To end the reads for
// good, Fail first. A complete feed leaves its connections to end with
// their gofers, answering each read at once, since a sandbox may still be
// loading what is all there.
func (f *Feed) Close() error {
	f.mu.Lock()
	f.closed = true
	complete := f.left == 0
	var conns []*feedConn
	if !complete {
		conns = f.takeConns()
	}
	f.mu.Unlock()
	err := f.ln.Close()
	for _, c := range conns {
		c.conn.Close()
	}
	if !complete {
		f.serving.Wait()
	}
	return err
}
