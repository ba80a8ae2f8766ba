package objectstore

import (
	"context"
	"sync"
	"time"
)

// Putter uploads an image directory. *Store is one.
type Putter interface {
	Put(ctx context.Context, key, dir string) (Manifest, error)
}

// UploadState is where an image's upload stands.
type UploadState string

const (
	UploadPending   UploadState = "pending"   // queued, or waiting to retry
	UploadUploading UploadState = "uploading" // an attempt is running
	UploadUploaded  UploadState = "uploaded"  // in the store; Manifest set
	UploadFailed    UploadState = "failed"    // an attempt failed; Err set
)

// UploadStatus is reported at every change of an upload's state.
type UploadStatus struct {
	Key      string
	State    UploadState
	Attempt  int // attempts made so far, this one included
	Err      error
	Retry    time.Time // when failed: the next attempt, zero if none
	Manifest Manifest  // when uploaded
}

// UploaderOptions tune an Uploader; zero values take the defaults.
type UploaderOptions struct {
	// Workers is the number of uploads run at once (default 2).
	Workers int
	// MinBackoff and MaxBackoff bound the wait between attempts, doubled
	// from the first to the second (defaults 1s and 5m).
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts ends retrying after that many failures; 0 retries until
	// the uploader stops.
	MaxAttempts int
	// OnState receives every status change, from the worker goroutines,
	// one call at a time per key. The caller records it (snapshot and
	// template records show it).
	OnState func(UploadStatus)
}

// Uploader copies images to the store after they are written locally: a
// queue served by a few workers, each failure retried with back-off (the
// store may be down for a while; the local copy serves meanwhile).
type Uploader struct {
	put  Putter
	opts UploaderOptions

	mu     sync.Mutex
	queue  []uploadJob     // ready to run, in order
	queued map[string]bool // queued, running or waiting to retry
	wake   chan struct{}   // signalled when queue grows
}

type uploadJob struct {
	key, dir string
	attempt  int
}

// NewUploader returns an uploader; Run serves its queue.
func NewUploader(put Putter, opts UploaderOptions) *Uploader {
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(opts.MinBackoff, 5*time.Minute)
	}
	if opts.OnState == nil {
		opts.OnState = func(UploadStatus) {}
	}
	return &Uploader{put: put, opts: opts, queued: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Enqueue schedules the upload of dir as key. A key already queued is not
// queued twice. Never blocks.
func (u *Uploader) Enqueue(key, dir string) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	u.mu.Lock()
	if u.queued[key] {
		u.mu.Unlock()
		return nil
	}
	u.queued[key] = true
	u.mu.Unlock()
	// Reported before a worker can see the job, so that pending never
	// arrives after uploading.
	u.opts.OnState(UploadStatus{Key: key, State: UploadPending})
	u.mu.Lock()
	u.queue = append(u.queue, uploadJob{key: key, dir: dir})
	u.mu.Unlock()
	u.signal()
	return nil
}

func (u *Uploader) signal() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// Run serves the queue until ctx ends (call it once), then stops its workers (an upload in
// progress is abandoned: the store discards its parts) and returns. Keys not
// uploaded by then stay pending: the caller's records say so, and it
// enqueues them again at its next start.
func (u *Uploader) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range u.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.work(ctx, &wg)
		}()
	}
	wg.Wait()
}

func (u *Uploader) next(ctx context.Context) (uploadJob, bool) {
	for {
		u.mu.Lock()
		if len(u.queue) > 0 {
			j := u.queue[0]
			u.queue = u.queue[1:]
			more := len(u.queue) > 0
			u.mu.Unlock()
			if more {
				u.signal() // another worker may take the next
			}
			return j, true
		}
		u.mu.Unlock()
		select {
		case <-ctx.Done():
			return uploadJob{}, false
		case <-u.wake:
		}
	}
}

func (u *Uploader) work(ctx context.Context, wg *sync.WaitGroup) {
	for {
		j, ok := u.next(ctx)
		if !ok {
			return
		}
		j.attempt++
		u.opts.OnState(UploadStatus{Key: j.key, State: UploadUploading, Attempt: j.attempt})
		m, err := u.put.Put(ctx, j.key, j.dir)
		if err == nil {
			u.mu.Lock()
			delete(u.queued, j.key)
			u.mu.Unlock()
			u.opts.OnState(UploadStatus{Key: j.key, State: UploadUploaded, Attempt: j.attempt, Manifest: m})
			continue
		}
		if ctx.Err() != nil {
			// Stopped, not failed: the key stays pending.
			u.opts.OnState(UploadStatus{Key: j.key, State: UploadPending, Attempt: j.attempt})
			return
		}
		st := UploadStatus{Key: j.key, State: UploadFailed, Attempt: j.attempt, Err: err}
		if u.opts.MaxAttempts > 0 && j.attempt >= u.opts.MaxAttempts {
			u.mu.Lock()
			delete(u.queued, j.key)
			u.mu.Unlock()
			u.opts.OnState(st)
			continue
		}
		wait := u.backoff(j.attempt)
		st.Retry = time.Now().Add(wait)
		u.opts.OnState(st)
		// The retry sleeps aside so that the worker serves other keys.
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			u.mu.Lock()
			if ctx.Err() == nil {
				u.queue = append(u.queue, j)
			}
			u.mu.Unlock()
			u.signal()
		}()
	}
}

func (u *Uploader) backoff(attempt int) time.Duration {
	d := u.opts.MinBackoff
	for i := 1; i < attempt && d < u.opts.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, u.opts.MaxBackoff)
}

// Idle reports whether nothing is queued, running or waiting to retry.
func (u *Uploader) Idle() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.queued) == 0
}
