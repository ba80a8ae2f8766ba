package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
)

// fakeShared is an object store the manager talks to (SharedImages): it
// records what it is asked, and takes sandboxes over with takeOver.
type fakeShared struct {
	mu        sync.Mutex
	shared    []string // templates shared
	uploads   []string // sandbox images queued
	forgotten []string
	takeOver  func(ctx context.Context, id, dir string) (*store.Sandbox, error)
}

func (f *fakeShared) Remote(*store.Template) bool { return false }

func (f *fakeShared) Share(t *store.Template) error {
	t.RootfsID, t.Upload = "rootfs-test", store.UploadPending
	return nil
}

func (f *fakeShared) Upload(t *store.Template, origin string, replaces *store.Template) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shared = append(f.shared, t.ID)
}

func (f *fakeShared) Find(ctx context.Context, idOrName string) (*store.Template, error) {
	return nil, store.ErrNotFound
}

func (f *fakeShared) Image(ctx context.Context, t *store.Template) (string, func(), error) {
	return "", nil, errors.New("no remote templates here")
}

func (f *fakeShared) Delete(ctx context.Context, t *store.Template) {}

func (f *fakeShared) UploadSandbox(sb *store.Sandbox, rootfsPath, rootfsID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uploads = append(f.uploads, sb.ID)
}

func (f *fakeShared) ForgetSandbox(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, id)
}

func (f *fakeShared) TakeOver(ctx context.Context, id, dir string) (*store.Sandbox, error) {
	if f.takeOver == nil {
		return nil, store.ErrNotFound
	}
	return f.takeOver(ctx, id, dir)
}

func (f *fakeShared) seen() (shared, uploads, forgotten []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.shared), slices.Clone(f.uploads), slices.Clone(f.forgotten)
}

// A sandbox paused to disk is uploaded with its template shared; its
// resume drops the stored image; an upload a restart cut short is queued
// again, one done is not.
func TestSharedPausedSandbox(t *testing.T) {
	f := &fakeShared{}
	w := newWorld(t, func(c *Config) { c.Shared = f })
	ctx := context.Background()
	sb := w.create()
	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{ToDisk: true}); err != nil {
		t.Fatal(err)
	}
	shared, uploads, _ := f.seen()
	if !slices.Equal(uploads, []string{sb.ID}) || !slices.Equal(shared, []string{w.base.ID}) {
		t.Fatalf("after the spill: uploads %v, templates shared %v", uploads, shared)
	}
	if base, _ := w.store.Store.GetTemplate(ctx, w.base.ID); base.Upload != store.UploadPending || base.RootfsID == "" {
		t.Fatalf("base template not recorded as shared: %+v", base)
	}
	if _, _, err := w.m.Resume(ctx, sb.ID, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, _, forgotten := f.seen(); !slices.Equal(forgotten, []string{sb.ID}) {
		t.Fatalf("after the resume: forgotten %v", forgotten)
	}

	if err := w.m.Pause(ctx, sb.ID, node.PauseOptions{ToDisk: true}); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.start()
	if _, uploads, _ := f.seen(); len(uploads) != 3 || uploads[2] != sb.ID {
		t.Fatalf("an upload cut by a restart is not queued again: %v", uploads)
	}
	if err := w.store.Store.SetSandboxUpload(ctx, sb.ID, store.UploadUploaded, "sha256:0"); err != nil {
		t.Fatal(err)
	}
	w.stop()
	w.start()
	if _, uploads, _ := f.seen(); len(uploads) != 3 {
		t.Fatalf("an uploaded image was queued again: %v", uploads)
	}
	if err := w.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, forgotten := f.seen(); len(forgotten) != 2 {
		t.Fatalf("kill of a sandbox on disk kept its stored image: %v", forgotten)
	}
	w.empty()
}

// A resume of a sandbox this node does not hold takes it over (another
// node's, that node gone) and resumes it from the fetched image; one no
// node may give up stays not found.
func TestResumeTakesOver(t *testing.T) {
	f := &fakeShared{}
	w := newWorld(t, func(c *Config) { c.Shared = f })
	ctx := context.Background()
	const id = "movedsandbox00000000"
	f.takeOver = func(ctx context.Context, sid, dir string) (*store.Sandbox, error) {
		if sid != id {
			return nil, store.ErrNotFound
		}
		// The fetched image, then the claimed record.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		os.WriteFile(filepath.Join(dir, "pages.img"), []byte("tok-moved"), 0o600)
		os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600)
		now := time.Now().UTC()
		sb := &store.Sandbox{ID: id, TemplateID: w.base.ID, Alias: "base", State: store.StatePaused,
			VCPU: 1, MemoryMB: 512, AccessToken: "tok-moved", SlotIndex: -1, StartedAt: now,
			EndAt: now.Add(time.Minute), UpdatedAt: now, ImageDir: dir, TimeoutSecs: 60}
		return sb, w.store.Store.CreateSandbox(ctx, sb)
	}
	if _, _, err := w.m.Resume(ctx, "nosuchsandbox0000000", 0, false); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("resume of an unknown sandbox: %v", err)
	}
	got, was, err := w.m.Resume(ctx, id, 0, false)
	if err != nil || !was || got.State != store.StateRunning {
		t.Fatalf("resume taken over: %+v %v %v", got, was, err)
	}
	if rec := w.record(id); rec.State != store.StateRunning || rec.ImageDir != "" {
		t.Fatalf("record after the resume: %+v", rec)
	}
	if _, _, forgotten := f.seen(); !slices.Equal(forgotten, []string{id}) {
		t.Fatalf("stored image not dropped after the resume: %v", forgotten)
	}
	if err := w.m.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	w.empty()
}
