package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
)

// aenvSystem runs sandboxes through the aenv server's API.
type aenvSystem struct {
	c            *client
	cleanups     *cleanups
	bootTemplate string // what boot creates from
	memoryMB     int
	// lifetimeSecs is every sandbox's server-side timeout: a sandbox that
	// somehow escaped cleanup still ends by itself.
	lifetimeSecs int
	prefix       string // names of snapshots and templates
	seq          atomic.Int64
}

func (s *aenvSystem) name() string { return SystemAenv }

func (s *aenvSystem) boot(ctx context.Context) (*box, error) {
	return s.createFrom(ctx, s.bootTemplate)
}

// createFrom creates a sandbox; create answers once envd in it answers.
func (s *aenvSystem) createFrom(ctx context.Context, templateID string) (*box, error) {
	sb, err := s.c.create(ctx, createRequest{TemplateID: templateID, MemoryMB: s.memoryMB, Timeout: s.lifetimeSecs})
	if err != nil {
		return nil, err
	}
	return s.track(sb), nil
}

// track registers a sandbox the server made for deletion at the end.
func (s *aenvSystem) track(sb sandbox) *box {
	id := sb.SandboxID
	h := s.cleanups.push("sandbox "+id, func(ctx context.Context) error { return s.deleteSandbox(ctx, id) })
	return &box{id: id, sb: sb, cleanup: h}
}

// deleteSandbox deletes; one already gone is fine.
func (s *aenvSystem) deleteSandbox(ctx context.Context, id string) error {
	err := s.c.deleteSandbox(ctx, id)
	if isStatus(err, http.StatusNotFound) {
		return nil
	}
	return err
}

func (s *aenvSystem) remove(ctx context.Context, b *box) error {
	if err := s.deleteSandbox(ctx, b.id); err != nil {
		return err
	}
	s.cleanups.done(b.cleanup)
	return nil
}

func (s *aenvSystem) exec(ctx context.Context, b *box) error {
	_, err := s.c.execute(ctx, b.id, "true")
	return err
}

func (s *aenvSystem) stream(ctx context.Context, b *box) (streamTiming, error) {
	return s.c.stream(ctx, b.sb, "echo x")
}

func (s *aenvSystem) writeRead(ctx context.Context, b *box, data []byte) error {
	path := fmt.Sprintf("/tmp/bench-%d.bin", len(data))
	if err := s.c.putFile(ctx, b.id, path, data); err != nil {
		return err
	}
	got, err := s.c.getFile(ctx, b.id, path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("read back %d bytes of %s, wrote %d", len(got), path, len(data))
	}
	return nil
}

func (s *aenvSystem) pause(ctx context.Context, b *box) error  { return s.c.pause(ctx, b.id) }
func (s *aenvSystem) resume(ctx context.Context, b *box) error { return s.c.resume(ctx, b.id) }

func (s *aenvSystem) snapshot(ctx context.Context, b *box) (*image, error) {
	id, err := s.c.snapshot(ctx, b.id, fmt.Sprintf("%s-snap-%d", s.prefix, s.seq.Add(1)))
	if err != nil {
		return nil, err
	}
	return s.trackImage("snapshot", id), nil
}

func (s *aenvSystem) template(ctx context.Context, b *box) (*image, error) {
	id, err := s.c.createTemplate(ctx, b.id, fmt.Sprintf("%s-tpl-%d", s.prefix, s.seq.Add(1)))
	if err != nil {
		return nil, err
	}
	return s.trackImage("template", id), nil
}

func (s *aenvSystem) trackImage(kind, id string) *image {
	h := s.cleanups.push(kind+" "+id, func(ctx context.Context) error {
		err := s.c.deleteTemplate(ctx, id)
		if isStatus(err, http.StatusNotFound) {
			return nil
		}
		return err
	})
	return &image{id: id, cleanup: h}
}

func (s *aenvSystem) removeImage(ctx context.Context, img *image) error {
	if err := s.c.deleteTemplate(ctx, img.id); err != nil && !isStatus(err, http.StatusNotFound) {
		return err
	}
	s.cleanups.done(img.cleanup)
	return nil
}

func (s *aenvSystem) bootImage(ctx context.Context, img *image) (*box, error) {
	return s.createFrom(ctx, img.id)
}

func (s *aenvSystem) fork(ctx context.Context, b *box, n int) ([]*box, []error) {
	children, errs, err := s.c.fork(ctx, b.id, n)
	if err != nil {
		return nil, []error{err}
	}
	boxes := make([]*box, 0, len(children))
	for _, sb := range children {
		boxes = append(boxes, s.track(sb))
	}
	return boxes, errs
}

// hostMemory sums the sandbox's runsc processes, found by its ID (the
// server runs on this machine).
func (s *aenvSystem) hostMemory(_ context.Context, b *box) (int64, error) {
	return pssBytes(pidsWithArg(b.id))
}

// removeAll deletes boxes in parallel (at most par at once) and returns
// the errors.
func removeAll(ctx context.Context, sys system, boxes []*box, par int) []error {
	var mu sync.Mutex
	var errs []error
	forEach(ctx, len(boxes), par, func(ctx context.Context, i int) {
		if err := sys.remove(ctx, boxes[i]); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	return errs
}

// forEach calls fn(i) for i in [0,n) with at most par calls at once and
// returns when all have returned. It stops starting new calls once ctx
// ends.
func forEach(ctx context.Context, n, par int, fn func(ctx context.Context, i int)) {
	sem := make(chan struct{}, max(1, par))
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(ctx, i)
		}()
	}
	wg.Wait()
}
