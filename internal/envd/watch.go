package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	fspb "github.com/aenv-dev/aenv/api/envd/filesystem"
)

// dirWatcher turns fsnotify events under root into FilesystemEvents whose
// names are relative to root.
type dirWatcher struct {
	srv          *Server
	root         string
	recursive    bool
	includeEntry bool
	fsw          *fsnotify.Watcher
}

func (s *Server) newDirWatcher(root string, recursive, includeEntry bool) (*dirWatcher, error) {
	if err := requireDir(root); err != nil {
		return nil, err
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("create watcher: %w", err))
	}
	w := &dirWatcher{srv: s, root: root, recursive: recursive, includeEntry: includeEntry, fsw: fsw}
	if err := w.add(root); err != nil {
		fsw.Close()
		return nil, fsError(err)
	}
	return w, nil
}

// add watches dir, and with recursive every directory below it.
func (w *dirWatcher) add(dir string) error {
	if !w.recursive {
		return w.fsw.Add(dir)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if err := w.fsw.Add(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("watch %s: %w", path, err)
			}
		}
		return nil
	})
}

func (w *dirWatcher) close() { w.fsw.Close() }

// translate maps one fsnotify event (which may carry several ops) to ours.
// A directory created under a recursive watch is watched from then on.
func (w *dirWatcher) translate(ev fsnotify.Event) []*fspb.FilesystemEvent {
	name, err := filepath.Rel(w.root, ev.Name)
	if err != nil {
		name = ev.Name
	}
	ops := []struct {
		op  fsnotify.Op
		typ fspb.EventType
	}{
		{fsnotify.Create, fspb.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Write, fspb.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, fspb.EventType_EVENT_TYPE_REMOVE},
		{fsnotify.Rename, fspb.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, fspb.EventType_EVENT_TYPE_CHMOD},
	}
	var out []*fspb.FilesystemEvent
	for _, o := range ops {
		if !ev.Has(o.op) {
			continue
		}
		fe := &fspb.FilesystemEvent{Name: name, Type: o.typ}
		withEntry := o.typ == fspb.EventType_EVENT_TYPE_CREATE || o.typ == fspb.EventType_EVENT_TYPE_WRITE || o.typ == fspb.EventType_EVENT_TYPE_CHMOD
		if w.includeEntry && withEntry {
			if entry, err := w.srv.entryInfo(ev.Name); err == nil {
				fe.Entry = entry
			}
		}
		out = append(out, fe)
	}
	if w.recursive && ev.Has(fsnotify.Create) {
		_ = w.add(ev.Name) // not a directory, or already gone: nothing to watch
	}
	return out
}

// WatchDir streams events under a directory until the call's deadline or
// the client goes away; both end the stream cleanly.
func (fsvc *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	path, _, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := fsvc.srv.newDirWatcher(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	start := &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}
	if err := stream.Send(start); err != nil {
		return err
	}
	ticker := time.NewTicker(keepaliveInterval(req.Header().Get("Keepalive-Ping-Interval")))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return nil
			}
			for _, fe := range w.translate(ev) {
				if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		case err, ok := <-w.fsw.Errors:
			if ok {
				fsvc.srv.log.Warn("watch error", "path", path, "err", err)
			}
		case <-ticker.C:
			keepalive := &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}
			if err := stream.Send(keepalive); err != nil {
				return err
			}
		}
	}
}

// polledWatcher buffers events for the CreateWatcher/GetWatcherEvents pair.
type polledWatcher struct {
	w      *dirWatcher
	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	done   chan struct{}
}

func (pw *polledWatcher) collect() {
	for {
		select {
		case <-pw.done:
			return
		case ev, ok := <-pw.w.fsw.Events:
			if !ok {
				return
			}
			fes := pw.w.translate(ev)
			pw.mu.Lock()
			pw.events = append(pw.events, fes...)
			pw.mu.Unlock()
		case _, ok := <-pw.w.fsw.Errors:
			if !ok {
				return
			}
		}
	}
}

func (pw *polledWatcher) take() []*fspb.FilesystemEvent {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	out := pw.events
	pw.events = nil
	return out
}

func (pw *polledWatcher) stop() {
	close(pw.done)
	pw.w.close()
}

func (fsvc *filesystemService) CreateWatcher(_ context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	path, _, err := fsvc.userPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := fsvc.srv.newDirWatcher(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	pw := &polledWatcher{w: w, done: make(chan struct{})}
	fsvc.mu.Lock()
	fsvc.watchers[id] = pw
	fsvc.mu.Unlock()
	go pw.collect()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (fsvc *filesystemService) watcher(id string) (*polledWatcher, error) {
	fsvc.mu.Lock()
	defer fsvc.mu.Unlock()
	pw, ok := fsvc.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return pw, nil
}

func (fsvc *filesystemService) GetWatcherEvents(_ context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	pw, err := fsvc.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: pw.take()}), nil
}

func (fsvc *filesystemService) RemoveWatcher(_ context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	pw, err := fsvc.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	fsvc.mu.Lock()
	delete(fsvc.watchers, req.Msg.GetWatcherId())
	fsvc.mu.Unlock()
	pw.stop()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}

// removeAll stops every polled watcher; used when envd shuts down.
func (fsvc *filesystemService) removeAll() {
	fsvc.mu.Lock()
	defer fsvc.mu.Unlock()
	for id, pw := range fsvc.watchers {
		pw.stop()
		delete(fsvc.watchers, id)
	}
}
