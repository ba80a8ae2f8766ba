package objectstore

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/objectstore/s3test"
)

// statusLog collects the states an uploader reports.
type statusLog struct {
	mu      sync.Mutex
	all     []UploadStatus
	changed chan struct{}
}

func newStatusLog() *statusLog { return &statusLog{changed: make(chan struct{}, 1)} }

func (l *statusLog) record(s UploadStatus) {
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// waitFor returns the first status satisfying ok, waiting for it.
func (l *statusLog) waitFor(t *testing.T, what string, ok func(UploadStatus) bool) UploadStatus {
	t.Helper()
	deadline := time.After(3 * time.Minute)
	for {
		l.mu.Lock()
		for _, s := range l.all {
			if ok(s) {
				l.mu.Unlock()
				return s
			}
		}
		l.mu.Unlock()
		select {
		case <-l.changed:
		case <-deadline:
			t.Fatalf("no %s status; got %+v", what, l.all)
		}
	}
}

func TestUploaderRetriesWhileStoreDown(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	counter := newCountingTransport()
	cfg := testConfig(srv, "uploader")
	cfg.HTTPClient = &http.Client{Transport: counter}
	store := openStore(t, cfg)
	src := filepath.Join(t.TempDir(), "snap")
	buildTree(t, src, true)

	log := newStatusLog()
	up := NewUploader(store, UploaderOptions{MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, OnState: log.record})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	go func() {
		up.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()

	// Stop the store as soon as the upload has sent its first part.
	firstPart := counter.next("PUT " + dataName + " part")
	if err := up.Enqueue("snapshots/s1", src); err != nil {
		t.Fatal(err)
	}
	select {
	case <-firstPart:
	case <-time.After(2 * time.Minute):
		t.Fatal("upload never started")
	}
	srv.Stop()
	failed := log.waitFor(t, "failed", func(s UploadStatus) bool { return s.State == UploadFailed })
	if failed.Err == nil || failed.Retry.IsZero() {
		t.Fatalf("failed status without error or retry time: %+v", failed)
	}
	if up.Idle() {
		t.Fatal("uploader idle while an upload awaits retry")
	}
	// The local copy is untouched; the store comes back and the retry
	// completes.
	srv.Start()
	done1 := log.waitFor(t, "uploaded", func(s UploadStatus) bool { return s.State == UploadUploaded })
	if done1.Attempt < 2 || done1.Manifest.Key != "snapshots/s1" {
		t.Fatalf("uploaded status %+v: want a later attempt with the manifest", done1)
	}
	if !up.Idle() {
		t.Fatal("uploader not idle after the upload")
	}
	dst := filepath.Join(t.TempDir(), "restored")
	if _, err := store.Get(testCtx(t), "snapshots/s1", done1.Manifest.Digest, dst); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, snapshotTree(t, src), snapshotTree(t, dst))

	// States came in order for the key: pending, uploading, failed, ...,
	// uploaded last.
	log.mu.Lock()
	defer log.mu.Unlock()
	if first := log.all[0]; first.State != UploadPending {
		t.Errorf("first state %s, want pending", first.State)
	}
	if last := log.all[len(log.all)-1]; last.State != UploadUploaded {
		t.Errorf("last state %s, want uploaded", last.State)
	}
}

func TestUploaderGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	store := openStore(t, testConfig(srv, "uploader-max"))
	log := newStatusLog()
	up := NewUploader(store, UploaderOptions{MinBackoff: 10 * time.Millisecond, MaxAttempts: 2, OnState: log.record})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	go func() {
		up.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()
	// A directory that does not exist fails every attempt.
	if err := up.Enqueue("snapshots/missing", filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Fatal(err)
	}
	last := log.waitFor(t, "final failure", func(s UploadStatus) bool { return s.State == UploadFailed && s.Retry.IsZero() })
	if last.Attempt != 2 || last.Err == nil || !errors.Is(last.Err, fs.ErrNotExist) {
		t.Fatalf("final status %+v", last)
	}
	if !up.Idle() {
		t.Fatal("uploader keeps a key it gave up on")
	}
}
