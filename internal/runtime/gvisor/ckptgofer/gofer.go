package ckptgofer

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"
	"gvisor.dev/gvisor/pkg/sentry/state/stateipc"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// Main runs the gofer as runsc starts it: args are its command line after
// argv[0] (runsc's configuration flags, then "checkpointgofer" and the
// gofer's own flags). It serves one restore and returns its exit code once
// runsc closes the connection.
func Main(args []string, stderr io.Writer) int {
	if err := run(args); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", ProcessName, err)
		return 1
	}
	return 0
}

func run(args []string) error {
	// runsc's own flags come first; the gofer's follow its name.
	i := slices.Index(args, BinaryName)
	if i < 0 {
		return errors.New("not started by runsc (no checkpointgofer argument)")
	}
	fs := flag.NewFlagSet(BinaryName, flag.ContinueOnError)
	sockFD := fs.Int("sock-fd", -1, "the socket runsc reads the image through")
	optsFD := fs.Int("gcs-opts-fd", -1, "the image's options file")
	reads := fs.Bool("allow-checkpoint-reads", false, "serve reads (a restore)")
	if err := fs.Parse(args[i+1:]); err != nil {
		return err
	}
	if *sockFD < 0 || *optsFD < 0 {
		return errors.New("-sock-fd and -gcs-opts-fd are required")
	}
	if !*reads {
		// A checkpoint through the gofer would write; aenv checkpoints
		// into local files and never asks for it.
		return errors.New("only restores are served (no -allow-checkpoint-reads)")
	}
	optsFile := os.NewFile(uintptr(*optsFD), OptionsFile)
	opts, err := decodeOptions(optsFile)
	optsFile.Close()
	if err != nil {
		return fmt.Errorf("read options: %w", err)
	}
	if !filepath.IsAbs(opts.Dir) {
		return fmt.Errorf("options: image dir %q is not absolute", opts.Dir)
	}
	files := &imageFiles{opts: opts}
	afs, err := stateipc.NewAsyncFileServer(files)
	if err != nil {
		return err
	}
	srv := urpc.NewServer()
	srv.Register(afs)
	sock, err := unet.NewSocket(*sockFD)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	// Handle returns when runsc's side closes: the restore has read all it
	// will (or ended).
	srv.Handle(sock)
	srv.Stop(0)
	return nil
}

// imageFiles opens the image's files for stateipc.AsyncFileServer.
type imageFiles struct {
	opts Options

	mu    sync.Mutex
	feeds []*feedClient // one per open of the memory file
}

func (m *imageFiles) Destroy() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range m.feeds {
		f.close()
	}
}

func (m *imageFiles) OpenRead(name string) (stateio.AsyncReader, error) {
	if name != filepath.Base(name) || name == "." || name == ".." || name == OptionsFile {
		return nil, fmt.Errorf("open %q: not a file of the image", name)
	}
	if name != PagesFile || m.opts.Feed == "" {
		fd, err := unix.Open(filepath.Join(m.opts.Dir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", name, err)
		}
		return stateio.NewPagesFileFDReaderDefault(int32(fd)), nil
	}
	// Being written, the memory file has another name; complete, its own
	// (renamed before the feed says so, and before the options go).
	fd, err := unix.Open(filepath.Join(m.opts.Dir, name+PartialSuffix), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		fd, err = unix.Open(filepath.Join(m.opts.Dir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	grace := DefaultReconnectGrace
	if m.opts.ReconnectSeconds > 0 {
		grace = time.Duration(m.opts.ReconnectSeconds) * time.Second
	}
	feed, err := dialFeed(m.opts.Feed, grace)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.feeds = append(m.feeds, feed)
	return newLazyReader(int32(fd), feed), nil
}

func (m *imageFiles) OpenWrite(name string) (stateio.AsyncWriter, error) {
	return nil, fmt.Errorf("open %q for writing: this gofer serves restores only", name)
}

const (
	// The backoff between dials of a feed gone: a server restarting takes
	// a while, a sandbox waiting for its memory should not wait on after.
	redialFirst = 50 * time.Millisecond
	redialMax   = time.Second
	// stableConn is how long a connection must have lasted for its end to
	// start a new grace: a feed that takes connections only to close them
	// (one that fails without a word, say) must not keep the gofer waiting
	// for ever.
	stableConn = time.Second
)

// feedClient asks the Feed for ranges: one connection at a time, many
// waits. When the connection ends without the feed's word on the image
// (completeID or failedID), the feed went with its writer: the waits stay,
// and the client redials the socket for up to grace and asks the
// successor again.
type feedClient struct {
	socket string
	grace  time.Duration
	stop   chan struct{} // closed by close: no more redialing
	wmu    sync.Mutex    // one request written at a time

	mu       sync.Mutex
	conn     *net.UnixConn // the connection requests go to
	nextID   uint32
	pending  map[uint32]*request
	err      error
	complete bool // every range is ready: no more asking
	closing  bool // the gofer's own close
}

// request is a read waiting for its range.
type request struct {
	id   uint32
	off  int64
	n    uint64
	done chan error
}

// dialFeed connects to the feed at socket; grace is how long the client
// waits for a successor once that feed is gone without a word.
func dialFeed(socket string, grace time.Duration) (*feedClient, error) {
	conn, err := dialServer(socket)
	if err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	c := &feedClient{socket: socket, grace: grace, stop: make(chan struct{}),
		conn: conn, pending: map[uint32]*request{}}
	go c.readReplies(conn)
	return c, nil
}

// readReplies answers the waits from the feed's replies, over each
// connection in turn, until the feed says every range is ready, or that
// none will be, or is gone for longer than the grace.
func (c *feedClient) readReplies(conn *net.UnixConn) {
	var lost time.Time // when the grace started
	for {
		connected := time.Now()
		failed := c.readFrom(conn)
		conn.Close() // a request written to it meanwhile fails: it is re-sent
		if c.quiet() {
			return
		}
		var err error
		if failed {
			err = fmt.Errorf("%w: the feed says the image will not arrive", ErrFailed)
		} else {
			if lost.IsZero() || time.Since(connected) >= stableConn {
				lost = time.Now()
			}
			conn, err = c.redial(lost.Add(c.grace))
			if err == nil {
				continue
			}
			if c.quiet() {
				return
			}
			err = fmt.Errorf("%w: the feed went, and none came back at %s within %v: %v", ErrFailed, c.socket, c.grace, err)
		}
		c.fail(err)
		// The memory still missing will never arrive: the sandbox must not
		// run on with it unreadable.
		endSandbox()
		return
	}
}

// quiet says whether the feed's end no longer matters: every range is
// ready, or the gofer closed it.
func (c *feedClient) quiet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.complete || c.closing
}

// readFrom answers the waits from conn's replies until it ends; it says
// whether it ended with failedID.
func (c *feedClient) readFrom(conn *net.UnixConn) (failed bool) {
	var buf [replySize]byte
	for {
		if _, err := io.ReadFull(conn, buf[:]); err != nil {
			return false
		}
		id := binary.LittleEndian.Uint32(buf[:])
		if id == failedID {
			return true
		}
		c.mu.Lock()
		var answered []*request
		if id == completeID {
			// Everything is on disk: every read waiting is answered.
			c.complete = true
			for _, r := range c.pending {
				answered = append(answered, r)
			}
			clear(c.pending)
		} else if r := c.pending[id]; r != nil {
			answered = append(answered, r)
			delete(c.pending, id)
		}
		// Any other id was answered already: a request re-sent to a
		// successor may be answered twice.
		c.mu.Unlock()
		for _, r := range answered {
			r.done <- nil
		}
	}
}

// redial connects to the feed's successor at the same socket, with a
// backoff, until deadline, and sends it every request still pending; new
// requests go to it from then on. It fails once the deadline passes, or
// the gofer closes the client.
func (c *feedClient) redial(deadline time.Time) (*net.UnixConn, error) {
	backoff := redialFirst
	for {
		timer := time.NewTimer(max(0, min(backoff, time.Until(deadline))))
		select {
		case <-c.stop:
			timer.Stop()
			return nil, errors.New("closed")
		case <-timer.C:
		}
		conn, err := dialServer(c.socket)
		if err == nil {
			c.mu.Lock()
			if c.closing {
				c.mu.Unlock()
				conn.Close()
				return nil, errors.New("closed")
			}
			// Under the lock await registers a request under: one
			// registered before is re-sent here (its await wrote to the
			// old connection, closed, if at all); one after is sent by its
			// await to this connection.
			c.conn = conn
			resend := make([]*request, 0, len(c.pending))
			for _, r := range c.pending {
				resend = append(resend, r)
			}
			c.mu.Unlock()
			for _, r := range resend {
				if c.send(conn, r) != nil {
					break // the reader sees conn end, and redials
				}
			}
			return conn, nil
		}
		if !time.Now().Before(deadline) {
			return nil, err
		}
		backoff = min(2*backoff, redialMax)
	}
}

// dialServer connects to the feed at socket, served by a process of this
// one's user (samePeerUser): not one that bound the name while it was free.
func dialServer(socket string) (*net.UnixConn, error) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := samePeerUser(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", socket, err)
	}
	return conn, nil
}

// send writes r's request to conn. On an error conn is closed, so that the
// reader, seeing it end, redials and re-sends what is pending (r among
// them).
func (c *feedClient) send(conn *net.UnixConn, r *request) error {
	var buf [requestSize]byte
	binary.LittleEndian.PutUint32(buf[0:], r.id)
	binary.LittleEndian.PutUint64(buf[4:], uint64(r.off))
	binary.LittleEndian.PutUint64(buf[12:], r.n)
	c.wmu.Lock()
	_, err := conn.Write(buf[:])
	c.wmu.Unlock()
	if err != nil {
		conn.Close()
	}
	return err
}

func (c *feedClient) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	pending := c.pending
	c.pending = map[uint32]*request{}
	c.mu.Unlock()
	for _, r := range pending {
		r.done <- err
	}
}

func (c *feedClient) close() {
	c.mu.Lock()
	if !c.closing {
		c.closing = true
		close(c.stop)
	}
	conn := c.conn
	c.mu.Unlock()
	conn.Close()
	c.fail(ErrFailed)
}

// await blocks until bytes [off, off+n) are on disk, or the feed fails.
func (c *feedClient) await(off int64, n uint64) error {
	r := &request{off: off, n: n, done: make(chan error, 1)}
	c.mu.Lock()
	if c.complete {
		c.mu.Unlock()
		return nil
	}
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	r.id = c.nextID
	c.nextID++
	if c.nextID >= failedID {
		c.nextID = 0 // failedID and completeID are the feed's words
	}
	c.pending[r.id] = r
	conn := c.conn
	c.mu.Unlock()
	// An error is not this read's end: the connection is gone, and the
	// request, pending, goes to the successor.
	c.send(conn, r)
	return <-r.done
}

// lazyReader reads pages.img as stateio.FDReader would, each read once
// the feed says its range is written. Reads run in their own goroutines,
// so a read waiting for a range far ahead does not hold up one that is
// ready.
type lazyReader struct {
	stateio.NoRegisterClientFD
	fd   int32
	feed *feedClient
	done chan stateio.Completion
	wg   sync.WaitGroup
}

const lazyParallel = 128

func newLazyReader(fd int32, feed *feedClient) *lazyReader {
	return &lazyReader{fd: fd, feed: feed, done: make(chan stateio.Completion, lazyParallel)}
}

func (r *lazyReader) MaxReadBytes() uint64 { return maxReadBytes }
func (r *lazyReader) MaxRanges() int       { return maxReadBytes / pageSize }
func (r *lazyReader) MaxParallel() int     { return lazyParallel }

func (r *lazyReader) AddRead(id int, off int64, _ stateio.DestinationFile, _ memmap.FileRange, dst []byte) {
	r.start(id, off, uint64(len(dst)), [][]byte{dst})
}

func (r *lazyReader) AddReadv(id int, off int64, total uint64, _ stateio.DestinationFile, _ []memmap.FileRange, dsts []unix.Iovec) {
	bufs := make([][]byte, len(dsts))
	for i, iov := range dsts {
		// The server's mappings of the sandbox's memory, valid until this
		// read's completion is returned.
		bufs[i] = unsafe.Slice(iov.Base, iov.Len)
	}
	r.start(id, off, total, bufs)
}

func (r *lazyReader) start(id int, off int64, total uint64, bufs [][]byte) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		n, err := r.read(off, total, bufs)
		r.done <- stateio.Completion{ID: id, N: n, Err: err}
	}()
}

// read waits for the range, then reads it whole (as FDReader does: a short
// read is continued, a read at the end of the file is io.EOF).
func (r *lazyReader) read(off int64, total uint64, bufs [][]byte) (uint64, error) {
	if err := r.feed.await(off, total); err != nil {
		return 0, err
	}
	var done uint64
	for done < total {
		n, err := unix.Preadv(int(r.fd), bufs, off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.EOF
		}
		done += uint64(n)
		bufs = dropFirst(bufs, n)
	}
	return done, nil
}

// dropFirst returns bufs without their first n bytes.
func dropFirst(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			return bufs
		}
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	return bufs
}

func (r *lazyReader) Wait(cs []stateio.Completion, minCompletions int) ([]stateio.Completion, error) {
	return stateio.CompletionChanWait(r.done, cs, minCompletions)
}

// Close fails the reads still waiting (the feed's connection is shared by
// the gofer's files, so it is closed: only pages.img uses it) and waits for
// them to end.
func (r *lazyReader) Close() error {
	r.feed.close()
	go func() {
		// Completions nobody will Wait for must not block their reads.
		for range r.done {
		}
	}()
	r.wg.Wait()
	close(r.done)
	return unix.Close(int(r.fd))
}

// endSandbox kills the processes of the sandbox this gofer serves (itself
// among them): those of the cgroups SandboxCgroupsEnv names, if this
// process is in one of them (never another's, should the variable be
// wrong).
func endSandbox() {
	var dirs []string
	for _, dir := range filepath.SplitList(os.Getenv(SandboxCgroupsEnv)) {
		if filepath.IsAbs(dir) {
			dirs = append(dirs, dir)
		}
	}
	self := os.Getpid()
	var mine []string // the directories this process is in
	for _, dir := range dirs {
		if slices.Contains(cgroupProcs(dir), self) {
			mine = append(mine, dir)
		}
	}
	for _, dir := range mine {
		// cgroup v2 kills all at once, new processes too.
		if os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) == nil {
			return
		}
	}
	for _, dir := range mine {
		for _, pid := range cgroupProcs(dir) {
			if pid != self {
				unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	if len(mine) > 0 {
		unix.Kill(self, unix.SIGKILL)
	}
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
