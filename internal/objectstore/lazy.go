package objectstore

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// PartialSuffix marks a lazy file still being written.
const PartialSuffix = ".partial"

// LazyFile names the file of an image that GetLazy hands over before it is
// written: a restore reads the rest of the image first, and this file (its
// memory) range by range as it arrives. Until it is complete the file is
// named Name+PartialSuffix, so that a reader that does not wait for its
// ranges finds no file rather than one of zeros.
type LazyFile struct {
	// Name is a regular file at the image's top.
	Name string
	// Begin is called once every other file of the image is written, and
	// Name exists at its size with none of its contents yet. prioritize is
	// to be told of each range of Name a reader reads, in the order it
	// reads them, written yet or not: a range out of the readers' in-order
	// progress is fetched ahead of the rest still to come. Begin returns
	// written, which is told each range of Name once its bytes are there
	// (whole pages; the last page of the file may be short), from several
	// goroutines at once, and a range perhaps more than once. An error
	// stops the Get.
	Begin func(size int64, prioritize func(off, n int64)) (written func(off, n int64), err error)
	// Resume, if set, is the partial file of an earlier fetch of the same
	// image that readers still hold open (a node restarted while its
	// sandboxes' memory arrived): it becomes this fetch's file, linked in
	// as Name+PartialSuffix before Begin, and every page of it is written
	// again. It must be on dst's file system.
	Resume string
}

// GetLazy is Get for an image a restore can start from before it has all
// arrived. It writes dst in place (it must not exist; its parent must), and
// returns once the image is complete or has failed. A failed fetch removes
// dst, unless ctx ended after the handover: readers may still wait on the
// lazy file then, and a later fetch can resume it (LazyFile.Resume).
//
// Only a chunked image holding lazy.Name can be handed over early: every
// pack is checked against its digest before a page of it is written, and
// the index, which names every pack, against the recorded digest first. An
// image of the whole format is checked at its end, so it is fetched as Get
// does, and Begin is not called; nor is it for an image without the file.
func (s *Store) GetLazy(ctx context.Context, key, digest, dst string, lazy LazyFile) (Manifest, error) {
	m, err := s.statFor(ctx, key, digest, dst)
	if err != nil {
		return Manifest{}, err
	}
	if m.Format != formatChunks {
		return s.getWhole(ctx, m, key, digest, dst)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	handedOver := false
	begin := lazy.Begin
	lazy.Begin = func(size int64, prioritize func(off, n int64)) (func(off, n int64), error) {
		written, err := begin(size, prioritize)
		handedOver = err == nil
		return written, err
	}
	m.Fetched, err = s.fetchChunks(ctx, m, digest, dst, &lazy)
	if err == nil {
		err = syncDir(filepath.Dir(dst))
	}
	if err != nil {
		if !handedOver || ctx.Err() == nil {
			os.RemoveAll(dst)
		}
		// else readers may hold the partial file: dst stays for a later
		// fetch to resume (LazyFile.Resume).
		return Manifest{}, fmt.Errorf("get %s: %w", key, err)
	}
	return m, nil
}

// lazyPages finds name among the index's regular files: its first page in
// ix.pages, its page count and size. ok is false if the image has no such
// file at its top.
func lazyPages(ix *chunkIndex, name string) (first, count int, size int64, ok bool, err error) {
	tr := tar.NewReader(bytes.NewReader(ix.skeleton))
	next := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return 0, 0, 0, false, nil
		}
		if err != nil {
			return 0, 0, 0, false, fmt.Errorf("%w: index: %v", ErrCorrupt, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		sz, err := strconv.ParseInt(hdr.PAXRecords[paxSize], 10, 64)
		if err != nil || sz < 0 {
			return 0, 0, 0, false, fmt.Errorf("%w: %s has no size", ErrCorrupt, hdr.Name)
		}
		pages := int((sz + pageSize - 1) / pageSize)
		if next+pages > len(ix.pages) {
			return 0, 0, 0, false, fmt.Errorf("%w: the index ends inside %s", ErrCorrupt, hdr.Name)
		}
		if path.Clean(hdr.Name) == name {
			return next, pages, sz, true, nil
		}
		next += pages
	}
}

// packQueue hands out the packs a Get downloads, in order, to its
// download workers; packs may be added until it is closed, and a pack
// claimed (downloaded elsewhere first) is skipped.
type packQueue struct {
	mu      sync.Mutex
	more    *sync.Cond
	order   []uint32
	pos     int
	started map[uint32]bool
	closed  bool
}

func newPackQueue(order []uint32) *packQueue {
	q := &packQueue{order: order, started: make(map[uint32]bool, len(order))}
	q.more = sync.NewCond(&q.mu)
	return q
}

// next returns the next pack to download; it waits for more unless the
// queue is closed, and returns false once a closed queue is empty.
func (q *packQueue) next() (uint32, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for q.pos < len(q.order) {
			i := q.order[q.pos]
			q.pos++
			if !q.started[i] {
				q.started[i] = true
				return i, true
			}
		}
		if q.closed {
			return 0, false
		}
		q.more.Wait()
	}
}

// add queues packs after those queued.
func (q *packQueue) add(packs ...uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.order = append(q.order, packs...)
	q.more.Broadcast()
}

// close says no pack will be added.
func (q *packQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.more.Broadcast()
}

// abort drops what is queued: the Get failed.
func (q *packQueue) abort() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.order, q.pos, q.closed = nil, 0, true
	q.more.Broadcast()
}

// hurry moves pack i, if not started, to the front of what is queued.
func (q *packQueue) hurry(i uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.started[i] {
		return
	}
	q.order = slices.Insert(q.order, q.pos, i)
	q.more.Broadcast()
}

// isStarted says whether pack i's download has begun.
func (q *packQueue) isStarted(i uint32) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.started[i]
}

// claim marks pack i as downloading elsewhere; false if it already was.
func (q *packQueue) claim(i uint32) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.started[i] {
		return false
	}
	q.started[i] = true
	return true
}

// lazyFill writes the lazy file's pages once the rest of the image is
// written: each pack as it arrives, a pack a read waits for first (its
// download started at once).
type lazyFill struct {
	name     string
	r        *packReader
	q        *packQueue
	first    int // the file's first page in the index
	count    int
	size     int64
	mtime    time.Time
	lazyOnly int      // packs only the lazy file uses
	later    []uint32 // of those, the ones to download after the handover
	download func(i uint32)
	written  func(off, n int64)

	// f is the file being written, byPack its pages by pack (1-based),
	// ascending: set before Begin.
	f      *os.File
	byPack map[uint32][]int32
	// frames are the fetches of single frames prioritize started (see
	// frames.go); ending them cancels those still running.
	frames    sync.WaitGroup
	endFrames context.CancelFunc
	framesCtx context.Context
	// frameSlots bounds the frame fetches running; begun closes when
	// Begin has returned written.
	frameSlots chan struct{}
	begun      chan struct{}

	mu      sync.Mutex
	urgent  []uint32 // packs reads wait for, the last asked for on top
	arrived map[uint32]bool
	ready   []uint32 // arrived, in order of arrival
	done    map[uint32]bool
	wake    chan struct{}
	stopped bool // the Get is over: start no download
	// inOrder is the end of the furthest range read in order so far.
	inOrder int64
	// fetching counts the downloads prioritize started, still running.
	fetching int
	// tails are the framed packs' tails fetched; unframed the packs whose
	// frames cannot be fetched alone (written before frames); asked the
	// frames (pack<<32 | frame) fetched or being fetched.
	tails    map[uint32]*tailFetch
	unframed map[uint32]bool
	asked    map[uint64]bool
	// framesOver says stopFrames has run.
	framesOver bool
	// progress counts the frames streamed and the packs arrived: a hedge
	// waits on while it moves.
	progress int64
	// streamed are the packs streamPack wrote: run need not write them;
	// framesStreamed, of a pack being streamed, how many of its frames
	// are in hand, written or being written (a read in them needs no
	// frame fetched).
	streamed       map[uint32]bool
	framesStreamed map[uint32]int
	// noTails says a pack's tail could not be had (a store refusing ranged
	// GETs, or one failing): the streams that follow download their packs
	// whole, and run writes them.
	noTails bool
}

// hotEnd is how much of the lazy file's end is downloaded first, beside
// the restore's in-order load from its start. gVisor hands out its memory
// file's offsets top-down for a guest's memory (amd64's mmap layout is
// top-down) and for each guest process's platform context queues, so the
// file's last pages are the guest's oldest: its init (envd, the first
// process a restored sandbox is asked to run something by), the platform
// state its every system call goes through. A restore's first faults land
// there: the cold-create benchmark's out-of-order reads all fell in the
// 300 MB file's last 4.5 MB, and in file order 16 of them in one create
// waited for a frame's ranged GET.
const hotEnd = packTarget

// maxHotPacks bounds the packs endFirst moves ahead: an image whose last
// pages are spread over many packs (a child's, over its parents') would
// otherwise hold every download away from the load's front.
const maxHotPacks = 2

// endFirst returns packs, the lazy file's packs to download in the file's
// order, with those holding its last hotEnd bytes of data (zero pages need
// no download) moved to the front, the last first, maxHotPacks at most.
func (l *lazyFill) endFirst(ix *chunkIndex, packs []uint32) []uint32 {
	queued := make(map[uint32]bool, len(packs))
	for _, i := range packs {
		queued[i] = true
	}
	var hot []uint32
	for p, data := l.count-1, int64(0); p >= 0 && data < hotEnd && len(hot) < maxHotPacks; p-- {
		i := ix.pages[l.first+p].pack
		if i == 0 {
			continue
		}
		data += pageSize
		if queued[i] && !slices.Contains(hot, i) {
			hot = append(hot, i)
		}
	}
	if len(hot) == 0 {
		return packs
	}
	order := slices.Clone(hot)
	for _, i := range packs {
		if !slices.Contains(hot, i) {
			order = append(order, i)
		}
	}
	return order
}

// inOrderSlack is how far past the in-order reads a read still counts as
// one of them: the load skips ranges already loaded out of order.
const inOrderSlack = packTarget

// stop ends prioritize's downloads: after it, none starts. It lets go of
// the Get's state (decoded packs, the index), which readers of a cached
// image would otherwise keep alive through prioritize.
func (l *lazyFill) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.r, l.q, l.download = nil, nil, nil
	l.urgent, l.ready, l.arrived, l.done = nil, nil, nil, nil
	l.f, l.byPack, l.tails, l.unframed, l.asked, l.streamed, l.framesStreamed = nil, nil, nil, nil, nil, nil, nil
}

// arrive is told of each pack downloaded (or failed: the Get then ends).
func (l *lazyFill) arrive(i uint32) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.arrived[i] = true
	l.ready = append(l.ready, i)
	l.progress++
	l.mu.Unlock()
	l.nudge()
}

func (l *lazyFill) nudge() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// prioritize is LazyFile.Begin's prioritize. A restore's reads come in
// two kinds: its background load asks for the file in order, a fixed number
// of ranges at a time, and a page the guest (or the restore itself) needs
// out of that order is asked for on its own. The first follow the packs'
// download order anyway; the second block the sandbox: the frames holding
// their pages are fetched at once by ranged GETs and written (a pack
// without frames is downloaded whole at once), and their packs go to the
// front of the download queue.
//
// A read counted as the in-order load's is hedged: if its pages are still
// to come once the downloads have gone hedgeAfter without moving (a store
// stalling, a connection hung), their frames are fetched as an out-of-order
// read's would be. A guest's fault near the load's front counts as the
// load's too, and would otherwise wait for a download that does not come.
func (l *lazyFill) prioritize(off, n int64) {
	if off < 0 || n <= 0 || off >= l.size {
		return
	}
	l.mu.Lock()
	defer l.nudge()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if off <= l.inOrder+inOrderSlack {
		// The load in order (or a range it skipped to): on its way.
		l.inOrder = max(l.inOrder, off+n)
		if l.waiting(off, n) {
			progress := l.rangeProgress(off, n)
			time.AfterFunc(hedgeAfter, func() { l.hedge(off, n, progress) })
		}
		return
	}
	l.fetchRange(off, n)
}

// hedgeAfter is how long the downloads a read counted as the in-order
// load's waits for may go without moving before its frames are fetched
// (see prioritize). While they move the read waits on: fetching its frames
// too would take the store's time from them.
const hedgeAfter = 250 * time.Millisecond

// hedge fetches what is still to come of a range read in order, if its
// downloads have not moved since they were at progress; else it looks
// again later.
func (l *lazyFill) hedge(off, n int64, progress int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.framesOver || !l.waiting(off, n) {
		return
	}
	if now := l.rangeProgress(off, n); now != progress {
		time.AfterFunc(hedgeAfter, func() { l.hedge(off, n, now) })
		return
	}
	l.fetchRange(off, n)
	l.nudge()
}

// rangeProgress is a number that grows as the downloads of a range's packs
// move: the frames streamed and packs arrived of those started, and, while
// one is still queued, those of every pack (its turn comes as the others
// end). A pack whose download hangs while the others flow stops it. l.mu
// is held.
func (l *lazyFill) rangeProgress(off, n int64) int64 {
	firstPage, end := int(off/pageSize), int(min(off+n, l.size)+pageSize-1)/pageSize
	var sum int64
	queued := false
	last := uint32(0)
	for p := firstPage; p < end; p++ {
		i := l.r.ix.pages[l.first+p].pack
		if i == 0 || i == last {
			continue
		}
		last = i
		switch {
		case l.arrived[i]:
			sum += 1 << 20
		case l.q.isStarted(i):
			sum += int64(l.framesStreamed[i])
		default:
			queued = true
		}
	}
	if queued {
		sum += l.progress << 21
	}
	return sum
}

// waiting says whether a page of the range is still to come: in a pack
// neither on disk nor arrived, in a frame neither streamed nor asked for.
// l.mu is held.
func (l *lazyFill) waiting(off, n int64) bool {
	firstPage, end := int(off/pageSize), int(min(off+n, l.size)+pageSize-1)/pageSize
	for p := firstPage; p < end; p++ {
		pg := l.r.ix.pages[l.first+p]
		i := pg.pack
		if i == 0 || l.done[i] || l.r.arriving[i] == nil || l.arrived[i] {
			continue
		}
		frame := int(pg.off / pageSize / framePages)
		if l.unframed[i] || (frame >= l.framesStreamed[i] && !l.asked[uint64(i)<<32|uint64(frame)]) {
			return true
		}
	}
	return false
}

// fetchRange fetches the frames holding the pages of a range read out of
// order (those neither written nor on their way in a frame already asked
// for or streamed) and moves their packs to the front. l.mu is held.
func (l *lazyFill) fetchRange(off, n int64) {
	firstPage, end := int(off/pageSize), int(min(off+n, l.size)+pageSize-1)/pageSize
	// The frames the range's pages lie in, by pack.
	frames := map[uint32][]int{}
	// Backwards, so that the range's first pack ends on top of the stack.
	var order []uint32
	for p := end - 1; p >= firstPage; p-- {
		pg := l.r.ix.pages[l.first+p]
		i := pg.pack
		if i == 0 || l.done[i] {
			continue
		}
		if _, seen := frames[i]; !seen {
			order = append(order, i)
			frames[i] = nil
		}
		if l.r.arriving[i] == nil || l.arrived[i] || l.unframed[i] {
			continue // here already, or to be downloaded whole
		}
		frame := int(pg.off / pageSize / framePages)
		if frame < l.framesStreamed[i] {
			continue // written
		}
		if key := uint64(i)<<32 | uint64(frame); !l.asked[key] {
			l.asked[key] = true
			frames[i] = append(frames[i], frame)
		}
	}
	for _, i := range order {
		if !slices.Contains(l.urgent, i) {
			l.urgent = append(l.urgent, i)
		}
		if l.r.arriving[i] == nil || l.arrived[i] {
			continue // on disk: written next
		}
		if len(frames[i]) > 0 {
			slices.Sort(frames[i])
			l.fetchFrames(i, slices.Compact(frames[i]))
			l.q.hurry(i)
			continue
		}
		if l.unframed[i] {
			l.downloadNow(i)
		} else {
			l.q.hurry(i) // its frames are on their way
		}
	}
}

// maxFrameFetches bounds the frame fetches running at once; more wait.
const maxFrameFetches = 8

// downloadNow downloads pack i at once, beside the Get's own downloads, or
// moves it to the front of their queue if enough run already. l.mu is
// held.
func (l *lazyFill) downloadNow(i uint32) {
	if l.fetching < maxUrgentDownloads && l.q.claim(i) {
		l.fetching++
		l.download(i) // starts it, under l.mu so that stop sees it
	} else {
		l.q.hurry(i)
	}
}

// fetchFrames fetches frames of pack i in the background and writes the
// file's pages in them. If the pack has no frames (written before them),
// or its frames cannot be had, the whole pack is downloaded at once
// instead: its download checks it whole, and fails the Get if it is
// corrupt. l.mu is held.
func (l *lazyFill) fetchFrames(i uint32, frames []int) {
	if l.framesOver {
		return // the file is written, or the Get failed
	}
	s, p := l.r.s, l.r.ix.packs[i-1]
	pages, ix := l.byPack[i], l.r.ix.pages[l.first:l.first+l.count]
	tail, first := l.tailOf(i)
	l.frames.Add(1)
	go func() {
		defer l.frames.Done()
		ctx := l.framesCtx
		// The tail first, outside the bound: a fetch holding a slot never
		// waits on one that waits for a slot.
		if !tail.get(ctx, s, p, first) {
			return
		}
		select {
		case l.frameSlots <- struct{}{}:
			defer func() { <-l.frameSlots }()
		case <-ctx.Done():
			return
		}
		err := tail.err
		if err == nil {
			err = l.writeFrames(s, p, tail.t, frames, pages, ix)
		}
		if err == nil || ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.stopped || l.done[i] || l.arrived[i] {
			return
		}
		l.unframed[i] = true
		l.downloadNow(i)
	}()
}

// tailOf returns pack i's tail fetch: the one under way, or a new one
// that the caller (first) is to run. The tail is fetched once per pack,
// by the first of its frame fetches or its stream. l.mu is held.
func (l *lazyFill) tailOf(i uint32) (tail *tailFetch, first bool) {
	if tail = l.tails[i]; tail != nil {
		return tail, false
	}
	tail = &tailFetch{done: make(chan struct{})}
	l.tails[i] = tail
	return tail, true
}

// tailFetch is a pack's tail being fetched: t or err once done closes.
type tailFetch struct {
	done chan struct{}
	t    *packTail
	err  error
}

// get fetches pack p's tail if first (tailOf said so), else waits for the
// fetch under way; false if ctx ends first.
func (tf *tailFetch) get(ctx context.Context, s *Store, p packRef, first bool) bool {
	if first {
		tf.t, tf.err = s.fetchTail(ctx, p)
		close(tf.done)
	}
	select {
	case <-tf.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// writeFrames fetches frames of pack p, whose tail is tail, and writes the
// file's pages (pages, their refs ix) that lie in them, each checked
// against the pack's hash list.
func (l *lazyFill) writeFrames(s *Store, p packRef, tail *packTail, frames []int, pages []int32, ix []pageRef) error {
	ctx := l.framesCtx
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(framePages*pageSize+pageSize))
	if err != nil {
		return err
	}
	defer dec.Close()
	got, err := s.fetchFrames(ctx, p, tail, frames, dec)
	if err != nil {
		return err
	}
	// A read may come while Begin runs, before written is set.
	select {
	case <-l.begun:
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.writePages(l.f, p, tail, got, pages, ix)
}

// writePages writes the file's pages (pages, their refs ix) that lie in
// got, frames of pack p (by frame number) whose tail is tail, each page
// checked against the pack's hash list, in runs of consecutive pages, each
// told once written. Begin has returned.
func (l *lazyFill) writePages(f *os.File, p packRef, tail *packTail, got map[int][]byte, pages []int32, ix []pageRef) error {
	// A run is pages that follow each other both in the file and in one
	// frame's bytes: it is written straight from the frame, uncopied.
	var frame []byte
	var from, to int64 // the run: frame[from:to]
	runAt := int64(-1)
	flush := func() error {
		if to == from {
			return nil
		}
		if _, err := f.WriteAt(frame[from:to], runAt); err != nil {
			return err
		}
		l.written(runAt, to-from)
		from, to = 0, 0
		return nil
	}
	for _, fp := range pages {
		slot := int(ix[fp].off / pageSize)
		data, ok := got[slot/framePages]
		if !ok {
			continue
		}
		off := int64(fp) * pageSize
		n := min(pageSize, l.size-off)
		at := int64(slot%framePages) * pageSize
		if at+n > int64(len(data)) {
			return fmt.Errorf("%w: pack %s: a page of the memory file lies past its frame %d", ErrCorrupt, p.name(), slot/framePages)
		}
		if !tail.check(slot, data[at:at+n]) {
			return fmt.Errorf("%w: pack %s: a page of frame %d does not match its hash", ErrCorrupt, p.name(), slot/framePages)
		}
		if to > from && runAt+(to-from) == off && to == at && &frame[0] == &data[0] {
			to += n
			continue
		}
		if err := flush(); err != nil {
			return err
		}
		frame, from, to, runAt = data, at, at+n, off
	}
	return flush()
}

// prepare readies l to be handed over: the file f and its pages by pack.
func (l *lazyFill) prepare(ctx context.Context, f *os.File) {
	l.f = f
	l.byPack = map[uint32][]int32{}
	for p, pg := range l.r.ix.pages[l.first : l.first+l.count] {
		if pg.pack != 0 {
			l.byPack[pg.pack] = append(l.byPack[pg.pack], int32(p))
		}
	}
	l.tails, l.unframed, l.asked = map[uint32]*tailFetch{}, map[uint32]bool{}, map[uint64]bool{}
	l.streamed, l.framesStreamed = map[uint32]bool{}, map[uint32]int{}
	l.framesCtx, l.endFrames = context.WithCancel(ctx)
	l.frameSlots, l.begun = make(chan struct{}, maxFrameFetches), make(chan struct{})
}

// stopFrames ends the frame fetches: the file is written, or the Get has
// failed.
func (l *lazyFill) stopFrames() {
	if l.endFrames == nil {
		return
	}
	l.mu.Lock()
	l.framesOver = true // no fetch starts after: Wait is not raced by Add
	l.mu.Unlock()
	l.endFrames()
	l.frames.Wait()
}

// maxUrgentDownloads bounds the downloads prioritize starts beside the
// Get's own; past it a pack goes to the front of the Get's queue.
const maxUrgentDownloads = 4

// fetched says a download prioritize started ended.
func (l *lazyFill) fetched() {
	l.mu.Lock()
	l.fetching--
	l.mu.Unlock()
}

// nextPack returns a pack of the file to write: the newest a read waits for
// that is here, else the first arrived; it waits for one.
func (l *lazyFill) nextPack(ctx context.Context, byPack map[uint32][]int32) (uint32, error) {
	for {
		l.mu.Lock()
		for k := len(l.urgent) - 1; k >= 0; k-- {
			i := l.urgent[k]
			if l.done[i] {
				l.urgent = append(l.urgent[:k], l.urgent[k+1:]...)
				continue
			}
			if l.arrived[i] {
				l.urgent = append(l.urgent[:k], l.urgent[k+1:]...)
				l.done[i] = true
				delete(l.tails, i) // its hash list is of no more use
				l.mu.Unlock()
				return i, nil
			}
		}
		for len(l.ready) > 0 {
			i := l.ready[0]
			l.ready = l.ready[1:]
			if !l.done[i] && byPack[i] != nil {
				l.done[i] = true
				delete(l.tails, i)
				l.mu.Unlock()
				return i, nil
			}
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-l.wake:
		}
	}
}

// run writes every page of the file into f; zero pages need no write.
func (l *lazyFill) run(ctx context.Context, f *os.File) error {
	pages := l.r.ix.pages[l.first : l.first+l.count]
	byPack := l.byPack
	// Packs already on disk are here from the start, in the order of the
	// file's pages: the order a restore's background load reads them in,
	// which waits at the first page not written yet.
	var onDisk []uint32
	for i := range byPack {
		if l.r.arriving[i] == nil {
			onDisk = append(onDisk, i)
		}
	}
	slices.SortFunc(onDisk, func(a, b uint32) int { return int(byPack[a][0]) - int(byPack[b][0]) })
	l.mu.Lock()
	for _, i := range onDisk {
		if !l.arrived[i] {
			l.arrived[i] = true
			l.ready = append(l.ready, i)
		}
	}
	l.mu.Unlock()
	// Zero pages read as the file's holes: ready now, in runs.
	for p := 0; p < len(pages); {
		if pages[p].pack != 0 {
			p++
			continue
		}
		start := p
		for p < len(pages) && pages[p].pack == 0 {
			p++
		}
		off := int64(start) * pageSize
		l.written(off, min(int64(p)*pageSize, l.size)-off)
	}
	buf := make([]byte, 0, packTarget)
	for left := len(byPack); left > 0; left-- {
		i, err := l.nextPack(ctx, byPack)
		if err != nil {
			return err
		}
		l.mu.Lock()
		streamed := l.streamed[i]
		l.mu.Unlock()
		if streamed {
			continue // its pages were written as they came
		}
		data, err := l.r.pack(i)
		if err != nil {
			return err
		}
		// The file's pages in this pack, written in runs of consecutive
		// pages, each told once written.
		ps := byPack[i]
		for j := 0; j < len(ps); {
			start := ps[j]
			buf = buf[:0]
			for ; j < len(ps) && ps[j] == start+int32(len(buf)/pageSize) && len(buf) < cap(buf); j++ {
				pOff := int64(ps[j]) * pageSize
				n := min(pageSize, l.size-pOff)
				at := int64(pages[ps[j]].off)
				if at+n > int64(len(data)) {
					return fmt.Errorf("%w: a page of the memory file lies past its pack", ErrCorrupt)
				}
				buf = append(buf, data[at:at+n]...)
			}
			off := int64(start) * pageSize
			if _, err := f.WriteAt(buf, off); err != nil {
				return err
			}
			l.written(off, int64(len(buf)))
		}
	}
	return f.Sync()
}

// streamPack downloads pack i, one only the lazy file uses, into dir as
// Store.downloadPack does, and writes the file's pages in each of its
// frames as soon as the frame's bytes are in, each page checked against
// the pack's hash list, rather than once the whole pack is.
//
// Why: a restore's background load keeps every read it may have in
// flight waiting at the front of the download, and a page the guest needs
// out of order is asked for only once one of them ends. So the grain at
// which the download lands is the grain of a fault's wait: a pack (8 MiB,
// ~100 ms apart on two cores shared with the S3 server), or a frame
// (256 KiB, a few ms).
//
// The pack is still checked whole against its digest before it is kept
// and said arrived. One without frames (written before them), or whose
// tail cannot be had, is downloaded as downloadPack does and written by
// run once it has arrived.
func (l *lazyFill) streamPack(ctx context.Context, s *Store, dir string, i uint32, p packRef) error {
	l.mu.Lock()
	if l.stopped || l.byPack == nil || l.noTails || s.rangesIgnored.Load() {
		l.mu.Unlock()
		return s.downloadPack(ctx, dir, p)
	}
	f := l.f
	pages, ix := l.byPack[i], l.r.ix.pages[l.first:l.first+l.count]
	tail, first := l.tailOf(i)
	l.mu.Unlock()
	if !tail.get(ctx, s, p, first) {
		return ctx.Err()
	}
	if tail.err != nil {
		if !errors.Is(tail.err, errNotFramed) && !errors.Is(tail.err, ErrCorrupt) && ctx.Err() == nil {
			l.mu.Lock()
			l.noTails = true
			l.mu.Unlock()
		}
		return s.downloadPack(ctx, dir, p)
	}
	select { // the frames are written once Begin has returned
	case <-l.begun:
	case <-ctx.Done():
		return ctx.Err()
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(framePages*pageSize+pageSize))
	if err != nil {
		return err
	}
	defer dec.Close()
	name := p.name()
	body, err := s.getPack(ctx, name)
	if err != nil {
		return err
	}
	defer body.Close()
	t := tail.t
	// The file's pages in this pack by their place in it, so that each
	// frame's are a run of them.
	bySlot := slices.Clone(pages)
	slices.SortFunc(bySlot, func(a, b int32) int { return cmp.Compare(ix[a].off, ix[b].off) })
	data := newPackBuffer(p)
	var have int64
	var frame []byte
	for j := 0; j+1 < len(t.starts); j++ {
		if _, err := io.ReadFull(body, data[have:t.starts[j+1]]); err != nil {
			return fmt.Errorf("pack %s: %w", name, err)
		}
		have = t.starts[j+1]
		want := min(framePages*pageSize, p.raw-int64(j)*framePages*pageSize)
		frame, err = dec.DecodeAll(data[t.starts[j]:have], frame[:0])
		if err != nil || int64(len(frame)) != want {
			return fmt.Errorf("%w: pack %s: frame %d does not decode to its size", ErrCorrupt, name, j)
		}
		// From here a read in this frame waits for the write below rather
		// than fetching the frame again.
		l.mu.Lock()
		if l.framesStreamed != nil {
			l.framesStreamed[i] = j + 1
			l.progress++
		}
		l.mu.Unlock()
		k := 0
		for k < len(bySlot) && int(ix[bySlot[k]].off/pageSize)/framePages == j {
			k++
		}
		if err := l.writePages(f, p, t, map[int][]byte{j: frame}, bySlot[:k], ix); err != nil {
			return err
		}
		bySlot = bySlot[k:]
	}
	if len(bySlot) > 0 {
		return fmt.Errorf("%w: a page of the memory file lies past its pack", ErrCorrupt)
	}
	if err := keepDownloaded(dir, p, body, data, have); err != nil {
		return err
	}
	l.mu.Lock()
	if l.streamed != nil {
		l.streamed[i] = true
	}
	l.mu.Unlock()
	return nil
}
