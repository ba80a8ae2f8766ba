package objectstore

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"
)

// Fetcher downloads an image into dst (which it creates, complete or not at
// all), checked against digest (see Store.Get). *Store is one.
type Fetcher interface {
	Get(ctx context.Context, key, digest, dst string) (Manifest, error)
}

// LazyFetcher is a Fetcher that can hand an image over before one of its
// files is complete (Store.GetLazy).
type LazyFetcher interface {
	Fetcher
	GetLazy(ctx context.Context, key, digest, dst string, lazy LazyFile) (Manifest, error)
}

// Streamer lets readers use a cache entry while its lazy file is still
// being written: the cache's side of LazyFile.
type Streamer interface {
	// File is the image's file handed over before it is written.
	File() string
	// Start is called when an entry's image in dir is handed over (see
	// LazyFile.Begin). resumed, if not empty, is the image directory of a
	// previous run's fetch that this one resumes (its lazy file is now
	// dir's): its readers, still waiting for the rest, are to be served
	// too.
	Start(dir string, size int64, prioritize func(off, n int64), resumed string) (Stream, error)
}

// Stream is one entry's lazy file being written.
type Stream interface {
	// Written says bytes [off, off+n) of the file are there.
	Written(off, n int64)
	// Finish ends the writing: err is nil once the file is complete
	// (restores that start from then on must read it as any image; an
	// error returned says they could not be made to, and the entry is
	// dropped), else why it never will be (readers waiting fail).
	Finish(err error) error
	// Close releases the stream when its entry is removed, or when the
	// cache closes with the file incomplete: readers then wait for the
	// next run to resume the fetch, and must not be failed.
	Close()
}

// Cache keeps fetched images in a local directory within a byte budget.
//
// Layout: <dir>/<name>/image is an image tree and <dir>/<name>/entry.json its
// key and size, where name is a hash of the key and a download sequence (a
// purged entry still in use keeps its directory while a new download of the
// key takes another). An entry is assembled in
// <dir>/.tmp-* and renamed into place whole, so at open anything else is
// debris of a crash and is removed; except a lazy fetch (with a Streamer),
// written in place and marked by <dir>/<name>/fetch.json: one handed over
// and left unfinished by the previous run is resumed, since restored
// sandboxes may still be reading it.
//
// Entries in use (acquired and not yet released) are never evicted; when they
// alone exceed the budget the cache stays over it until they are released.
type Cache struct {
	dir   string
	limit int64
	// minFree is the free space to keep on dir's file system (see
	// CacheOptions.MinFree), asked of free.
	minFree int64
	free    FreeSpace
	now     func() time.Time // the clock of freshFor
	fetch   Fetcher
	log     *slog.Logger
	// unfinished are the lazy fetches the previous run left, found at open.
	unfinished []unfinishedFetch

	// ctx bounds downloads: they are shared by every caller waiting for a
	// key, so no single caller's context may cancel one.
	ctx    context.Context
	cancel context.CancelFunc
	group  singleflight.Group
	// streamer, if set, hands entries over before their lazy file is
	// written: new fetches if lazy, and fetches of a previous run resumed.
	streamer Streamer
	lazy     bool
	// fetches are the lazy fetches running (they outlive Acquire); added
	// to under mu unless closed.
	fetches sync.WaitGroup
	closed  bool

	mu      sync.Mutex
	entries map[string]*cacheEntry
	lru     *list.List // front: most recently used; values *cacheEntry
	total   int64
}

type cacheEntry struct {
	key     string
	digest  string // what the image was checked against when fetched
	name    string
	size    int64 // bytes on disk
	refs    int
	removed bool // evicted or purged while in use: delete at last release
	elem    *list.Element
	stream  Stream // its lazy file's writing, if it was handed over early
	// fetched is when the entry was downloaded: the free-space floor
	// spares it for freshFor, or the callers that waited for the download
	// could find it gone.
	fetched time.Time
}

// freshFor is how long an entry just downloaded is spared by the free-space
// floor: far longer than the callers that waited for it take to take it
// (every one of them, which a first taker cannot know), short against a
// disk filling.
const freshFor = 10 * time.Second

type entryMeta struct {
	Key    string `json:"key"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// CacheOptions are a Cache's optional parts.
type CacheOptions struct {
	// Streamer hands a lazy fetch's image over before its lazy file is
	// complete (and resumes the fetches a previous run left unfinished:
	// set it wherever a previous run may have fetched lazily).
	Streamer Streamer
	// Lazy makes Acquire fetch lazily (with a Streamer).
	Lazy bool
	// Logger tells of what the cache does in the background and no
	// caller hears of: resumed fetches that fail, entries evicted for free
	// space (default: discarded).
	Logger *slog.Logger
	// MinFree is the free space the cache's file system is to keep
	// (capped at a tenth of its size): below it, least recently used
	// entries not in use are evicted beyond the budget too, save those
	// downloaded in the last seconds, for the callers that waited for them
	// (0: the budget alone).
	MinFree int64
	// FreeSpace asks a file system for its free space (default statfs).
	FreeSpace FreeSpace
}

// unfinishedFetch is a lazy fetch a previous run left in dir (a name).
type unfinishedFetch struct {
	name    string
	meta    entryMeta
	started time.Time
}

const (
	entryImage  = "image"
	entryMetaF  = "entry.json"
	entryFetchF = "fetch.json" // a lazy fetch's key and digest, from its start
	// entryHandedF marks a lazy fetch handed over: readers may hold its
	// lazy file, and its stream told them where to wait.
	entryHandedF = "handed-over"
	tmpPrefix    = ".tmp-"
)

// OpenCache opens (creating) the cache in dir with a budget of limit bytes.
// Complete entries of a previous run are kept, their recency taken from the
// last use recorded on disk. With a Streamer and a fetch that is a
// LazyFetcher, a lazy fetch the previous run left unfinished after handing
// it over is resumed now, into the same file; and with opts.Lazy as well,
// Acquire returns an image as soon as it can be restored from, before its
// lazy file is complete.
func OpenCache(dir string, limit int64, fetch Fetcher, opts CacheOptions) (*Cache, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("open cache %s: limit must be positive", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open cache: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cache{dir: dir, limit: limit, fetch: fetch, ctx: ctx, cancel: cancel,
		entries: map[string]*cacheEntry{}, lru: list.New()}
	c.log = opts.Logger
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.minFree, c.free, c.now = opts.MinFree, opts.FreeSpace, time.Now
	if c.free == nil {
		c.free = statFreeSpace
	}
	if _, ok := fetch.(LazyFetcher); ok && opts.Streamer != nil {
		c.streamer, c.lazy = opts.Streamer, opts.Lazy
	}
	if err := c.load(); err != nil {
		cancel()
		return nil, fmt.Errorf("open cache %s: %w", dir, err)
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	if err := c.resumeFetches(); err != nil {
		cancel()
		return nil, fmt.Errorf("open cache %s: %w", dir, err)
	}
	return c, nil
}

// resumeFetches resumes the newest unfinished lazy fetch of each image that
// was handed over (readers may hold its lazy file), and removes the rest. A
// resumed fetch is one flight of its key, as a download is: an Acquire
// meanwhile shares it.
func (c *Cache) resumeFetches() error {
	newest := map[string]unfinishedFetch{}
	var stale []string
	for _, u := range c.unfinished {
		// Handed over: its lazy file, and a stream serving it, were there.
		// (A resume that stopped before its own handover has the file
		// linked in, but not the stream: the fetch it resumed is kept.)
		_, err := os.Stat(filepath.Join(c.dir, u.name, entryHandedF))
		if c.streamer == nil || err != nil {
			stale = append(stale, u.name)
			continue
		}
		flight := u.meta.Key + "@" + u.meta.Digest
		if old, ok := newest[flight]; ok {
			if old.started.After(u.started) {
				stale = append(stale, u.name)
				continue
			}
			stale = append(stale, old.name)
		}
		newest[flight] = u
	}
	c.unfinished = nil
	for _, name := range stale {
		if err := os.RemoveAll(filepath.Join(c.dir, name)); err != nil {
			return err
		}
	}
	lf, _ := c.fetch.(LazyFetcher)
	for _, u := range newest {
		key, digest, from := u.meta.Key, u.meta.Digest, u.name
		c.group.DoChan(key+"@"+digest, func() (any, error) {
			return nil, c.downloadLazy(lf, key, digest, from)
		})
	}
	return nil
}

func (c *Cache) load() error {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	type found struct {
		e    *cacheEntry
		used time.Time
	}
	var all []found
	for _, de := range des {
		p := filepath.Join(c.dir, de.Name())
		meta, used, err := readEntryMeta(p)
		if err != nil && de.IsDir() {
			if u, started, ok := readUnfinished(p); ok && strings.HasPrefix(de.Name(), entryName(u.Key)+"-") {
				c.unfinished = append(c.unfinished, unfinishedFetch{name: de.Name(), meta: u, started: started})
				continue
			}
		}
		if strings.HasPrefix(de.Name(), tmpPrefix) || err != nil || !de.IsDir() || !strings.HasPrefix(de.Name(), entryName(meta.Key)+"-") {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			continue
		}
		all = append(all, found{&cacheEntry{key: meta.Key, digest: meta.Digest, name: de.Name(), size: meta.Size}, used})
	}
	// Oldest first, each pushed to the front: the newest ends at the front.
	slices.SortFunc(all, func(a, b found) int { return a.used.Compare(b.used) })
	for _, f := range all {
		if old := c.entries[f.e.key]; old != nil {
			// Two downloads of one key (a purge in use, then a crash):
			// the newer wins.
			c.dropLocked(old)
			if err := os.RemoveAll(filepath.Join(c.dir, old.name)); err != nil {
				return err
			}
		}
		f.e.elem = c.lru.PushFront(f.e)
		c.entries[f.e.key] = f.e
		c.total += f.e.size
	}
	return nil
}

func readEntryMeta(dir string) (entryMeta, time.Time, error) {
	p := filepath.Join(dir, entryMetaF)
	b, err := os.ReadFile(p)
	if err != nil {
		return entryMeta{}, time.Time{}, err
	}
	var m entryMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return entryMeta{}, time.Time{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return entryMeta{}, time.Time{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, entryImage)); err != nil {
		return entryMeta{}, time.Time{}, err
	}
	return m, fi.ModTime(), nil
}

// readUnfinished reads the key and digest of a lazy fetch in dir that
// never completed (no entry.json), and when it started.
func readUnfinished(dir string) (entryMeta, time.Time, bool) {
	p := filepath.Join(dir, entryFetchF)
	b, err := os.ReadFile(p)
	if err != nil {
		return entryMeta{}, time.Time{}, false
	}
	var m entryMeta
	fi, err := os.Stat(p)
	if err != nil || json.Unmarshal(b, &m) != nil || ValidKey(m.Key) != nil {
		return entryMeta{}, time.Time{}, false
	}
	return m, fi.ModTime(), true
}

func entryName(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:16])
}

// resumeRetryFor bounds the retries of a resumed fetch that fails before
// its handover: within the readers' own wait for it
// (ckptgofer.DefaultReconnectGrace, 5 minutes).
const resumeRetryFor = 4 * time.Minute

// Close cancels downloads in progress and waits for the lazy ones to stop.
// Entries stay on disk for the next run, as do lazy fetches handed over
// (their readers wait for the next run to resume them).
func (c *Cache) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.fetches.Wait()
}

// Handle is an acquired cache entry; the image stays on disk until Release.
type Handle struct {
	c    *Cache
	e    *cacheEntry
	once sync.Once
}

// Path is the image directory. Restore from it; do not change it.
func (h *Handle) Path() string {
	return filepath.Join(h.c.dir, h.e.name, entryImage)
}

// Release gives the entry back; it may be evicted from then on.
func (h *Handle) Release() {
	h.once.Do(func() { h.c.release(h.e) })
}

// Acquire returns the image key whose digest is digest (recorded at its
// upload), downloading it first if it is not cached. A cached copy checked
// against another digest (one fetched before digests were recorded, or of
// an upload since replaced) is not used. Concurrent calls for one key share
// one download; a caller whose ctx ends stops waiting, while the download
// goes on for the others.
func (c *Cache) Acquire(ctx context.Context, key, digest string) (*Handle, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	// Bounded: an entry can be evicted between its download and our taking
	// a reference only under heavy churn.
	for range 3 {
		if h := c.take(key, digest); h != nil {
			return h, nil
		}
		ch := c.group.DoChan(key+"@"+digest, func() (any, error) { return nil, c.download(key, digest) })
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cache %s: %w", key, ctx.Err())
		case r := <-ch:
			if r.Err != nil {
				return nil, fmt.Errorf("cache %s: %w", key, r.Err)
			}
		}
	}
	return nil, fmt.Errorf("cache %s: evicted as soon as fetched; the cache limit is too small for the images in use", key)
}

func (c *Cache) take(key, digest string) *Handle {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return nil
	}
	if e.digest != digest {
		c.forgetLocked(e)
		return nil
	}
	e.refs++
	c.lru.MoveToFront(e.elem)
	// Recency survives a restart through the metadata file's time; a
	// failure only costs accuracy of the order.
	now := time.Now()
	os.Chtimes(filepath.Join(c.dir, e.name, entryMetaF), now, now)
	return &Handle{c: c, e: e}
}

func (c *Cache) download(key, digest string) error {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && e.digest != digest {
		c.forgetLocked(e)
		ok = false
	}
	if !ok {
		// Room for the fetch, before it writes.
		c.evictLocked()
	}
	c.mu.Unlock()
	if ok {
		return nil // fetched by a flight that ended just before ours began
	}
	if lf, ok := c.fetch.(LazyFetcher); ok && c.lazy {
		return c.downloadLazy(lf, key, digest, "")
	}
	tmp, err := os.MkdirTemp(c.dir, tmpPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if _, err := c.fetch.Get(c.ctx, key, digest, filepath.Join(tmp, entryImage)); err != nil {
		return err
	}
	size, err := c.finishEntry(tmp, key, digest)
	if err != nil {
		return err
	}
	e = &cacheEntry{key: key, digest: digest, name: fmt.Sprintf("%s-%d", entryName(key), time.Now().UnixNano()), size: size}
	if err := os.Rename(tmp, filepath.Join(c.dir, e.name)); err != nil {
		return err
	}
	if err := syncDir(c.dir); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(e)
	c.total += size
	c.evictLocked()
	return nil
}

// downloadLazy fetches the image key into an entry directory of its own,
// in place, and returns once the entry can be acquired: when the fetch
// hands the image over (its lazy file then arrives while restores read it),
// or when it is complete. The entry's metadata file is written only once
// the image is complete. A fetch that fails before the handover leaves
// nothing; one handed over and stopped by Close is left as it is, for the
// next run to resume (from: the directory name of the fetch resumed, whose
// lazy file this one takes over).
func (c *Cache) downloadLazy(lf LazyFetcher, key, digest, from string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("fetch %s: the cache is closed", key)
	}
	c.fetches.Add(1)
	c.mu.Unlock()
	started := false
	defer func() {
		if !started {
			c.fetches.Done()
		}
	}()
	e := &cacheEntry{key: key, digest: digest, name: fmt.Sprintf("%s-%d", entryName(key), time.Now().UnixNano())}
	dir := filepath.Join(c.dir, e.name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	// Neither this file nor entryHandedF is synced: they matter to a
	// next run only while the sandboxes reading the fetch live, which a
	// crash of the host ends (a torn fetch.json is then debris). Unsynced,
	// they cost a lazy create nothing it waits for.
	b, err := json.Marshal(entryMeta{Key: key, Digest: digest})
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, entryFetchF), b, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	image := filepath.Join(dir, entryImage)
	lazy := LazyFile{Name: c.streamer.File()}
	var fromImage string
	if from != "" {
		fromImage = filepath.Join(c.dir, from, entryImage)
		lazy.Resume = filepath.Join(fromImage, lazy.Name+PartialSuffix)
	}
	handedOver := make(chan struct{})
	fetched := make(chan error, 1)
	resumeStart := time.Now()
	lazy.Begin = func(size int64, prioritize func(off, n int64)) (func(off, n int64), error) {
		st, err := c.streamer.Start(image, size, prioritize, fromImage)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, entryHandedF), nil, 0o600); err != nil {
			st.Finish(err)
			st.Close()
			return nil, err
		}
		if from != "" {
			// Its file is this entry's now, and its readers this
			// stream's.
			os.RemoveAll(filepath.Join(c.dir, from))
		}
		c.mu.Lock()
		// In use by the fetch until it ends.
		e.stream, e.refs = st, 1
		c.addLocked(e)
		c.mu.Unlock()
		close(handedOver)
		return st.Written, nil
	}
	started = true
	go func() {
		defer c.fetches.Done()
		_, err := lf.GetLazy(c.ctx, key, digest, image, lazy)
		// A resume that fails before its handover is tried again while
		// its readers still wait (the store unreachable for a while after
		// the node's restart, say).
		for wait := time.Second; err != nil && !final(err) && from != "" && e.stream == nil && c.ctx.Err() == nil &&
			time.Since(resumeStart) < resumeRetryFor; wait = min(2*wait, 30*time.Second) {
			select {
			case <-c.ctx.Done():
			case <-time.After(wait):
				_, err = lf.GetLazy(c.ctx, key, digest, image, lazy)
			}
		}
		if err != nil && c.ctx.Err() != nil {
			// Closed (the node stops): left for the next run.
			c.abandon(e)
			fetched <- err
			return
		}
		if from != "" && e.stream == nil {
			// Its readers were never handed to a stream: told now that
			// the memory will not come, they end rather than wait.
			if err != nil {
				c.failReaders(image, fromImage, lazy.Resume, err)
			}
			os.RemoveAll(filepath.Join(c.dir, from))
		}
		if e.stream != nil {
			// Before the entry is recorded complete: a complete entry is
			// read as any image, by this run and the next.
			if ferr := e.stream.Finish(err); err == nil {
				err = ferr
			}
		}
		var size int64
		if err == nil {
			size, err = c.finishEntry(dir, key, digest)
		}
		if err == nil {
			err = syncDir(c.dir)
		}
		if e.stream != nil {
			c.mu.Lock()
			// Unless purged meanwhile (then removed at its last release).
			if c.entries[key] == e {
				if err != nil {
					c.forgetLocked(e)
				} else {
					e.size = size
					c.total += size
				}
			}
			c.mu.Unlock()
			c.release(e)
		} else if err == nil {
			e.size = size
			c.mu.Lock()
			c.addLocked(e)
			c.total += size
			c.evictLocked()
			c.mu.Unlock()
		} else {
			os.RemoveAll(dir)
		}
		fetched <- err
	}()
	select {
	case <-handedOver:
		return nil
	case err := <-fetched:
		return err
	}
}

// final says whether a fetch that failed with err would fail again: the
// image is gone from the store, or is not what was recorded.
func final(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedFormat)
}

// failedFeedListens is how long the stream of a resume that failed stays
// to tell the readers that dial it: longer than a reader's pause between
// dials (a second).
const failedFeedListens = 5 * time.Second

// failReaders tells the readers of the lazy file partial (of the fetch
// resumed from fromImage, whose resume failed with cause) that its pages
// will not come: the sandboxes restored from it end now, rather than once
// they give up waiting (minutes). dir is the failed resume's image
// directory.
func (c *Cache) failReaders(dir, fromImage, partial string, cause error) {
	c.log.Warn("object store cache: a fetch that sandboxes wait on cannot be resumed; they are told it failed",
		"image", fromImage, "err", cause)
	fi, err := os.Stat(partial)
	if err == nil {
		err = os.MkdirAll(dir, 0o700) // the failed fetch left nothing of it
	}
	var st Stream
	if err == nil {
		st, err = c.streamer.Start(dir, fi.Size(), nil, fromImage)
	}
	if err != nil {
		c.log.Warn("object store cache: could not tell the readers of a failed fetch; they end once they give up waiting",
			"image", fromImage, "err", err)
		return
	}
	st.Finish(cause)
	c.fetches.Add(1) // within the caller's: Close waits for this too
	go func() {
		defer c.fetches.Done()
		select {
		case <-c.ctx.Done():
		case <-time.After(failedFeedListens):
		}
		st.Close()
	}()
}

// abandon lets go of the lazy fetch of e, stopped by Close: its directory
// stays as it is (the next open resumes it if it was handed over, else
// removes it), and its stream is closed without failing its readers.
func (c *Cache) abandon(e *cacheEntry) {
	if e.stream == nil {
		os.RemoveAll(filepath.Join(c.dir, e.name))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[e.key] == e {
		c.dropLocked(e)
	}
	// Released later or not, the directory is not removed by this run.
	e.removed = false
	e.stream.Close()
}

// finishEntry writes the metadata of a complete entry in dir (synced;
// the cache directory's entry for dir is the caller's to sync).
func (c *Cache) finishEntry(dir, key, digest string) (int64, error) {
	size, err := diskUsage(filepath.Join(dir, entryImage))
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(entryMeta{Key: key, Digest: digest, Size: size})
	if err != nil {
		return 0, err
	}
	if err := writeFileSync(filepath.Join(dir, entryMetaF), b); err != nil {
		return 0, err
	}
	return size, nil
}

// addLocked puts e, just downloaded (or handed over), in the cache, most
// recently used.
func (c *Cache) addLocked(e *cacheEntry) {
	e.fetched = c.now()
	if old := c.entries[e.key]; old != nil {
		// Downloads of a key are single-flight; keep the accounting right
		// if another ever lands first.
		c.forgetLocked(old)
	}
	e.elem = c.lru.PushFront(e)
	c.entries[e.key] = e
}

// removeLocked deletes the directory of e, dropped and unused.
func (c *Cache) removeLocked(e *cacheEntry) error {
	if e.stream != nil {
		e.stream.Close()
	}
	return os.RemoveAll(filepath.Join(c.dir, e.name))
}

// evictLocked removes least recently used entries not in use until the
// total fits the limit, and while the file system has less free than
// minFree: for the free space, it also spares an entry downloaded less
// than freshFor ago.
func (c *Cache) evictLocked() {
	short := spaceShort(c.free, c.dir, c.minFree)
	var freed int64
	for el := c.lru.Back(); el != nil && (c.total > c.limit || short > 0); {
		e := el.Value.(*cacheEntry)
		prev := el.Prev()
		over := c.total > c.limit
		if e.refs == 0 && (over || c.now().Sub(e.fetched) >= freshFor) {
			c.dropLocked(e)
			c.removeLocked(e)
			short -= e.size
			if !over {
				freed += e.size
			}
		}
		el = prev
	}
	if freed > 0 {
		c.log.Info("image cache: evicted for free space", "dir", c.dir, "freed_mb", freed>>20,
			"still_short_mb", max(0, short)>>20)
	}
}

// Reclaim evicts what the budget and the free-space floor call for now.
// Fetches and releases do so themselves; this is for a node whose disk
// fills from elsewhere (its sandboxes, its templates) while it fetches
// nothing, for it to be called on a clock.
func (c *Cache) Reclaim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evictLocked()
}

func (c *Cache) dropLocked(e *cacheEntry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	c.total -= e.size
}

func (c *Cache) release(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.refs == 0 && e.removed {
		c.removeLocked(e)
		return
	}
	c.evictLocked()
}

// Purge forgets key (its image was deleted): removed now if unused, else at
// its last release.
func (c *Cache) Purge(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return nil
	}
	if err := c.forgetLocked(e); err != nil {
		return fmt.Errorf("purge %s: %w", key, err)
	}
	return nil
}

// forgetLocked drops e: removed now if unused, else at its last release.
func (c *Cache) forgetLocked(e *cacheEntry) error {
	c.dropLocked(e)
	if e.refs > 0 {
		e.removed = true
		return nil
	}
	return c.removeLocked(e)
}

// Size returns the bytes the cached entries occupy.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Keys returns the cached keys, most recently used first.
func (c *Cache) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for el := c.lru.Front(); el != nil; el = el.Next() {
		out = append(out, el.Value.(*cacheEntry).key)
	}
	return out
}

// diskUsage sums the blocks a tree occupies (holes are free).
func diskUsage(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

func writeFileSync(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return errors.Join(f.Close())
}
