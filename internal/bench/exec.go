package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
)

// withBox boots one sandbox on sys for fn and deletes it afterwards.
func withBox(ctx context.Context, sys system, fn func(*box) error) error {
	bx, err := sys.boot(ctx)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	defer sys.remove(context.WithoutCancel(ctx), bx)
	return fn(bx)
}

// runExec times the command round trip of `true` and the first output
// byte of a streamed command.
func (b *bench) runExec(ctx context.Context) error {
	rt := b.rec.figure("exec_true", "Exec round trip (true)", GroupExec, UnitMs)
	ttfb := b.rec.figure("exec_first_byte", "Exec time to first output byte (streamed echo)", GroupExec, UnitMs)
	b.rec.describe(rt, "aenv: POST /execute; raw: exec /bin/true")
	b.rec.describe(ttfb, "aenv: envd process.Start stream through the server; raw: exec echo, first byte on its stdout pipe")
	var errs []error
	for _, sys := range b.systems() {
		b.logger.Info("exec figures", "system", sys.name())
		err := withBox(ctx, sys, func(bx *box) error {
			for i := 0; i < b.cfg.Iterations*2 && ctx.Err() == nil; i++ {
				_ = b.timed(rt, sys.name(), func() error { return sys.exec(ctx, bx) })
			}
			for i := 0; i < b.cfg.Iterations*2 && ctx.Err() == nil; i++ {
				t, err := sys.stream(ctx, bx)
				if err != nil {
					b.rec.fail(ttfb, sys.name(), err)
					continue
				}
				b.rec.addDuration(ttfb, sys.name(), t.firstByte)
			}
			return ctx.Err()
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sys.name(), err))
		}
	}
	return errors.Join(errs...)
}

// runFiles times writing a file into a sandbox and reading it back.
func (b *bench) runFiles(ctx context.Context) error {
	sizes := []struct {
		name, title string
		bytes       int
		iterations  int
	}{
		{"file_1k", "File write+read 1 KB", 1 << 10, b.cfg.Iterations},
		{"file_10m", "File write+read 10 MB", 10 << 20, max(2, b.cfg.Iterations/3)},
	}
	var errs []error
	for _, sys := range b.systems() {
		b.logger.Info("file figures", "system", sys.name())
		err := withBox(ctx, sys, func(bx *box) error {
			for _, size := range sizes {
				f := b.rec.figure(size.name, size.title, GroupFiles, UnitMs)
				b.rec.describe(f, "aenv: PUT then GET /sandboxes/{id}/files (raw bytes); raw: exec sh -c 'cat > file' with stdin, then exec cat")
				data := make([]byte, size.bytes)
				_, _ = rand.Read(data)
				for i := 0; i < size.iterations && ctx.Err() == nil; i++ {
					_ = b.timed(f, sys.name(), func() error { return sys.writeRead(ctx, bx, data) })
				}
			}
			return ctx.Err()
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sys.name(), err))
		}
	}
	return errors.Join(errs...)
}
