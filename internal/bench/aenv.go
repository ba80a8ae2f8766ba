package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
)

// requestTimeout bounds one API request, however long the server takes.
const requestTimeout = 3 * time.Minute

// finishing returns a context for one operation that is NOT cancelled with
// ctx, only by its own timeout. Ctrl-C stops the bench between operations,
// never inside one: an interrupted pause, resume or checkpoint can leave a
// sandbox or container in a state that cannot be deleted, which is worse
// than waiting for the operation to end.
func finishing(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// newAPI is the bench's client of the server: every request finishes (see
// finishing), and enough idle connections are kept for the concurrency
// figures, which would otherwise measure TCP setup instead of the server.
func newAPI(cfg Config) *client.Client {
	return client.New(client.Config{URL: cfg.URL, APIKey: cfg.APIKey,
		HTTP:           client.NewHTTPClient(max(64, cfg.ExecStreams, cfg.ConcurrentCreates)),
		FinishOnCancel: true, RequestTimeout: requestTimeout})
}

// execOK runs command through the seed's /execute and fails on a
// non-zero exit.
func execOK(ctx context.Context, c *client.Client, id, command string) error {
	res, err := c.Execute(ctx, id, client.ExecuteRequest{Command: command, Timeout: 120})
	if err != nil {
		return fmt.Errorf("execute %q: %w", command, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("execute %q: exit %d: %s", command, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return nil
}

// streamTiming is what one streamed command took.
type streamTiming struct {
	firstByte time.Duration // until the first output byte arrived
	total     time.Duration // until the end event
}

// firstByteClock notes when the first output byte arrives.
type firstByteClock struct {
	start time.Time
	at    time.Duration
}

func (f *firstByteClock) Write(p []byte) (int, error) {
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return len(p), nil
}

// stream runs `sh -c command` through envd's streaming Start (through the
// server) and times the first output byte and the end. The command must
// print something and exit 0.
func stream(ctx context.Context, envd *envdclient.Client, command string) (streamTiming, error) {
	ctx, cancel := finishing(ctx, requestTimeout)
	defer cancel()
	clock := &firstByteClock{start: time.Now()}
	proc, err := envd.Start(ctx, envdclient.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", command}})
	if err != nil {
		return streamTiming{}, fmt.Errorf("envd start %q: %w", command, err)
	}
	exit, err := proc.Wait(envdclient.Output{Stdout: clock, Stderr: clock})
	t := streamTiming{firstByte: clock.at, total: time.Since(clock.start)}
	switch {
	case err != nil:
		return t, fmt.Errorf("envd stream %q: %w", command, err)
	case exit.Code != 0 || !exit.Exited:
		return t, fmt.Errorf("envd stream %q: %s", command, exit.Status)
	case t.firstByte == 0:
		return t, errors.New("envd stream: the command printed nothing")
	}
	return t, nil
}

// aenvSystem runs sandboxes through the aenv server's API.
type aenvSystem struct {
	c            *client.Client
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

// create makes a sandbox with the server's defaults: only the template.
func (s *aenvSystem) create(ctx context.Context) (*box, error) {
	return s.createWith(ctx, client.CreateSandboxRequest{TemplateID: s.bootTemplate})
}

// settleTimeout bounds the wait for the warm pool to refill.
const settleTimeout = 3 * time.Minute

// settle waits until the server's warm pool holds what it fills to
// (aenv_warm_pool_ready >= aenv_warm_pool_target in GET /metrics), at
// most settleTimeout.
func (s *aenvSystem) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		m, err := s.c.ServerMetrics(ctx)
		if err == nil && m["aenv_warm_pool_ready"] >= m["aenv_warm_pool_target"] {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// createFrom creates a sandbox; create answers once envd in it answers.
func (s *aenvSystem) createFrom(ctx context.Context, templateID string) (*box, error) {
	return s.createWith(ctx, client.CreateSandboxRequest{TemplateID: templateID, MemoryMB: s.memoryMB})
}

// createWith sends req with the bench's lifetime and tracks the sandbox.
func (s *aenvSystem) createWith(ctx context.Context, req client.CreateSandboxRequest) (*box, error) {
	req.Timeout = s.lifetimeSecs
	sb, err := s.c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return s.track(sb), nil
}

// track registers a sandbox the server made for deletion at the end.
func (s *aenvSystem) track(sb client.Sandbox) *box {
	id := sb.SandboxID
	h := s.cleanups.push("sandbox "+id, func(ctx context.Context) error { return s.deleteSandbox(ctx, id) })
	return &box{id: id, sb: sb, cleanup: h}
}

// deleteSandbox deletes; one already gone is fine.
func (s *aenvSystem) deleteSandbox(ctx context.Context, id string) error {
	err := s.c.DeleteSandbox(ctx, id)
	if client.StatusOf(err) == http.StatusNotFound {
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
	return execOK(ctx, s.c, b.id, "true")
}

func (s *aenvSystem) stream(ctx context.Context, b *box) (streamTiming, error) {
	return stream(ctx, s.c.Envd(b.id, b.sb.EnvdAccessToken), "echo x")
}

func (s *aenvSystem) writeRead(ctx context.Context, b *box, data []byte) error {
	path := fmt.Sprintf("/tmp/bench-%d.bin", len(data))
	if err := s.c.PutFile(ctx, b.id, path, bytes.NewReader(data), int64(len(data))); err != nil {
		return err
	}
	content, err := s.c.GetFile(ctx, b.id, path)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(content)
	content.Close()
	if err != nil {
		return fmt.Errorf("read back %s: %w", path, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("read back %d bytes of %s, wrote %d", len(got), path, len(data))
	}
	return nil
}

func (s *aenvSystem) pause(ctx context.Context, b *box) error {
	return s.c.Pause(ctx, b.id, client.PauseRequest{})
}

func (s *aenvSystem) resume(ctx context.Context, b *box) error { return s.c.Resume(ctx, b.id, 0) }

func (s *aenvSystem) snapshot(ctx context.Context, b *box) (*image, error) {
	snap, err := s.c.CreateSnapshot(ctx, b.id, fmt.Sprintf("%s-snap-%d", s.prefix, s.seq.Add(1)))
	if err != nil {
		return nil, err
	}
	return s.trackImage("snapshot", snap.SnapshotID), nil
}

func (s *aenvSystem) template(ctx context.Context, b *box) (*image, error) {
	id, err := s.c.CreateTemplate(ctx, b.id, fmt.Sprintf("%s-tpl-%d", s.prefix, s.seq.Add(1)))
	if err != nil {
		return nil, err
	}
	return s.trackImage("template", id), nil
}

func (s *aenvSystem) trackImage(kind, id string) *image {
	h := s.cleanups.push(kind+" "+id, func(ctx context.Context) error {
		err := s.c.DeleteTemplate(ctx, id)
		if client.StatusOf(err) == http.StatusNotFound {
			return nil
		}
		return err
	})
	return &image{id: id, cleanup: h}
}

func (s *aenvSystem) removeImage(ctx context.Context, img *image) error {
	if err := s.c.DeleteTemplate(ctx, img.id); err != nil && client.StatusOf(err) != http.StatusNotFound {
		return err
	}
	s.cleanups.done(img.cleanup)
	return nil
}

func (s *aenvSystem) bootImage(ctx context.Context, img *image) (*box, error) {
	return s.createFrom(ctx, img.id)
}

func (s *aenvSystem) fork(ctx context.Context, b *box, n int) ([]*box, []error) {
	results, err := s.c.Fork(ctx, b.id, n)
	if err != nil {
		return nil, []error{err}
	}
	children, errs := client.ForkErrors(results)
	boxes := make([]*box, 0, len(children))
	for _, sb := range children {
		boxes = append(boxes, s.track(sb))
	}
	return boxes, errs
}

// hostMemory sums the sandbox's runsc processes, found by its ID (the
// server runs on this machine).
func (s *aenvSystem) hostMemory(_ context.Context, b *box, procs processIndex) (int64, error) {
	return pssBytes(procs.withArg(b.id))
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
