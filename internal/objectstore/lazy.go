package objectstore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// LazyFile names the file of an image that GetLazy hands over before it is
// written: a restore reads the rest of the image first, and this file (its
// memory) range by range as it arrives.
type LazyFile struct {
	// Name is a regular file at the image's top.
	Name string
	// Begin is called once every other file of the image is written, and
	// Name exists at its size with none of its contents yet. prioritize
	// moves a range of Name ahead of the rest still to come. Begin returns
	// written, which is told each range of Name once its bytes are there
	// (whole pages; the last page of the file may be short). An error
	// stops the Get.
	Begin func(size int64, prioritize func(off, n int64)) (written func(off, n int64), err error)
}

// GetLazy is Get for an image a restore can start from before it has all
// arrived. It writes dst in place (it must not exist; its parent must), and
// returns once the image is complete or has failed (dst then removed).
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
	m.Fetched, err = s.fetchChunks(ctx, m, digest, dst, &lazy)
	if err == nil {
		err = syncDir(filepath.Dir(dst))
	}
	if err != nil {
		os.RemoveAll(dst)
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
		if path.Clean(hdr.Name) == name {
			return next, pages, sz, true, nil
		}
		next += pages
	}
}

// packQueue hands out the packs a Get downloads: in order, except those
// asked for first.
type packQueue struct {
	mu      sync.Mutex
	order   []uint32
	pos     int
	urgent  []uint32
	started map[uint32]bool
}

func newPackQueue(order []uint32) *packQueue {
	return &packQueue{order: order, started: make(map[uint32]bool, len(order))}
}

// next returns the next pack to download; false when none is left.
func (q *packQueue) next() (uint32, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.urgent) > 0 {
		i := q.urgent[len(q.urgent)-1]
		q.urgent = q.urgent[:len(q.urgent)-1]
		if !q.started[i] {
			q.started[i] = true
			return i, true
		}
	}
	for q.pos < len(q.order) {
		i := q.order[q.pos]
		q.pos++
		if !q.started[i] {
			q.started[i] = true
			return i, true
		}
	}
	return 0, false
}

// hurry puts packs first (the last given goes first).
func (q *packQueue) hurry(packs ...uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, i := range packs {
		if !q.started[i] {
			q.urgent = append(q.urgent, i)
		}
	}
}

// lazyFill writes the lazy file's pages once the rest of the image is
// written: pack by pack, a pack a read waits for first.
type lazyFill struct {
	name    string
	r       *packReader
	q       *packQueue
	first   int // the file's first page in the index
	count   int
	size    int64
	mtime   time.Time
	written func(off, n int64)

	mu     sync.Mutex
	urgent []uint32 // packs to write next, the last first
	done   map[uint32]bool
}

// prioritize is LazyFile.Begin's prioritize: the packs holding [off,
// off+n) of the file are downloaded and written before the others.
func (l *lazyFill) prioritize(off, n int64) {
	if off < 0 || n <= 0 || off >= l.size {
		return
	}
	firstPage, end := int(off/pageSize), int(min(off+n, l.size)+pageSize-1)/pageSize
	var packs []uint32
	l.mu.Lock()
	// Backwards, so that the range's first pack ends on top of the stack.
	for p := end - 1; p >= firstPage; p-- {
		i := l.r.ix.pages[l.first+p].pack
		if i != 0 && !l.done[i] && (len(packs) == 0 || packs[len(packs)-1] != i) {
			packs = append(packs, i)
			l.urgent = append(l.urgent, i)
		}
	}
	l.mu.Unlock()
	l.q.hurry(packs...)
}

// run writes every page of the file into f, in order of its packs' first
// use, a prioritized pack first; zero pages need no write.
func (l *lazyFill) run(ctx context.Context, f *os.File, order []uint32) error {
	pages := l.r.ix.pages[l.first : l.first+l.count]
	byPack := map[uint32][]int32{}
	for p, pg := range pages {
		if pg.pack == 0 {
			continue
		}
		byPack[pg.pack] = append(byPack[pg.pack], int32(p))
	}
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
	next := 0
	for left := len(byPack); left > 0; left-- {
		if err := ctx.Err(); err != nil {
			return err
		}
		l.mu.Lock()
		i := uint32(0)
		for len(l.urgent) > 0 && i == 0 {
			u := l.urgent[len(l.urgent)-1]
			l.urgent = l.urgent[:len(l.urgent)-1]
			if !l.done[u] {
				i = u
			}
		}
		for i == 0 {
			if !l.done[order[next]] {
				i = order[next]
			}
			next++
		}
		l.done[i] = true
		l.mu.Unlock()
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
			for ; j < len(ps) && ps[j] == start+int32(len(buf)/pageSize); j++ {
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
