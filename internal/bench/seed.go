package bench

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The seed's set: cold boot, snapshot boot, pause, resume, snapshot
// create and fork, on each system that has them.
func (b *bench) runSeed(ctx context.Context) error {
	var errs []error
	for _, sys := range b.systems() {
		b.logger.Info("seed figures", "system", sys.name())
		if err := b.coldBoot(ctx, sys); err != nil {
			errs = append(errs, fmt.Errorf("%s cold boot: %w", sys.name(), err))
		}
		if sys.name() == SystemAenv {
			if err := b.defaultCreate(ctx); err != nil {
				errs = append(errs, fmt.Errorf("aenv default create: %w", err))
			}
		}
		if err := b.snapshotCycle(ctx, sys); err != nil {
			errs = append(errs, fmt.Errorf("%s snapshot boot: %w", sys.name(), err))
		}
		if err := b.forkFigure(ctx, sys); err != nil && !errors.Is(err, errUnsupported) {
			errs = append(errs, fmt.Errorf("%s fork: %w", sys.name(), err))
		}
	}
	return errors.Join(errs...)
}

// timed runs fn and records its duration in f, or its error.
func (b *bench) timed(f *Figure, system string, fn func() error) error {
	start := time.Now()
	err := fn()
	if err != nil {
		b.rec.fail(f, system, err)
		return err
	}
	b.rec.addDuration(f, system, time.Since(start))
	return nil
}

// coldBoot: start a sandbox from the rootfs template, then delete it.
func (b *bench) coldBoot(ctx context.Context, sys system) error {
	boot := b.rec.figure("cold_boot", "Cold boot (create from "+b.cfg.Template+")", GroupSeed, UnitMs)
	del := b.rec.figure("delete", "Delete a running sandbox", GroupSeed, UnitMs)
	b.rec.describe(boot, fmt.Sprintf("aenv: POST /sandboxes with memoryMB %d (no warm-pool sandbox fits it, so it boots) until it answers (envd is up by then); raw: run --detach, then exec true (runsc-envd: exec until its envd listens)", b.cfg.MemoryMB))
	b.rec.describe(del, "aenv: DELETE /sandboxes/{id}; raw: delete --force")
	for i := 0; i < b.cfg.Iterations && ctx.Err() == nil; i++ {
		var bx *box
		if b.timed(boot, sys.name(), func() (err error) { bx, err = sys.boot(ctx); return err }) != nil {
			continue
		}
		_ = b.timed(del, sys.name(), func() error { return sys.remove(ctx, bx) })
	}
	return ctx.Err()
}

// defaultCreate times creates of the server's default shape, which its
// warm pool of booted base sandboxes (if on) may serve. Cold boot asks for
// its own memory size, which no pooled sandbox fits, so it always boots.
// A pause between creates lets the pool refill, as it would between a
// user's creates.
func (b *bench) defaultCreate(ctx context.Context) error {
	f := b.rec.figure("default_create", "Create with server defaults (warm pool may serve it)", GroupSeed, UnitMs)
	first := b.rec.figure("default_create_first_exec", "First command after a create with server defaults", GroupSeed, UnitMs)
	next := b.rec.figure("default_create_next_exec", "Next command on that sandbox", GroupSeed, UnitMs)
	b.rec.describe(f, "POST /sandboxes with only templateID, then /execute true; one create per second")
	b.rec.describe(first, "the /execute true of default_create alone; it should cost about what the next one does")
	b.rec.describe(next, "a second /execute true right after the first, on the same sandbox")
	for i := 0; i < b.cfg.Iterations && ctx.Err() == nil; i++ {
		var bx *box
		err := b.timed(f, SystemAenv, func() error {
			var err error
			if bx, err = b.aenv.create(ctx); err != nil {
				return err
			}
			return b.timed(first, SystemAenv, func() error { return b.aenv.exec(ctx, bx) })
		})
		if err == nil {
			_ = b.timed(next, SystemAenv, func() error { return b.aenv.exec(ctx, bx) })
		}
		if bx != nil {
			if err := b.aenv.remove(ctx, bx); err != nil {
				b.logger.Warn("delete", "system", SystemAenv, "err", err)
			}
		}
		if err != nil {
			continue
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	return ctx.Err()
}

// snapshotCycle follows the seed: make a template of a sandbox, then per
// iteration boot from it, pause, resume, snapshot and delete. A system
// without snapshots (runc) boots cold and does pause and resume only.
func (b *bench) snapshotCycle(ctx context.Context, sys system) error {
	bootFig := b.rec.figure("snapshot_boot", "Snapshot boot (create from a template)", GroupSeed, UnitMs)
	pauseFig := b.rec.figure("pause", "Pause", GroupSeed, UnitMs)
	resumeFig := b.rec.figure("resume", "Resume", GroupSeed, UnitMs)
	snapFig := b.rec.figure("snapshot_create", "Snapshot create (sandbox keeps running)", GroupSeed, UnitMs)
	b.rec.describe(bootFig, "aenv: POST /sandboxes from a POST /templates template; runsc: create + restore of a checkpoint, then exec true (runsc-envd: exec until its envd listens)")
	b.rec.describe(pauseFig, "aenv: POST /pause (memory kept); raw: pause")
	b.rec.describe(snapFig, "aenv: POST /sandboxes/{id}/snapshots; runsc: checkpoint --leave-running")

	tpl, err := b.makeTemplate(ctx, sys)
	if err != nil && !errors.Is(err, errUnsupported) {
		return err
	}
	if tpl != nil {
		defer sys.removeImage(context.WithoutCancel(ctx), tpl)
	}
	for i := 0; i < b.cfg.Iterations && ctx.Err() == nil; i++ {
		var bx *box
		if tpl != nil {
			if b.timed(bootFig, sys.name(), func() (err error) { bx, err = sys.bootImage(ctx, tpl); return err }) != nil {
				continue
			}
		} else if bx, err = sys.boot(ctx); err != nil {
			b.rec.fail(pauseFig, sys.name(), err)
			continue
		}
		b.pauseResumeSnapshot(ctx, sys, bx, pauseFig, resumeFig, snapFig)
		if err := sys.remove(ctx, bx); err != nil {
			b.logger.Warn("delete", "system", sys.name(), "err", err)
		}
	}
	return ctx.Err()
}

func (b *bench) pauseResumeSnapshot(ctx context.Context, sys system, bx *box, pauseFig, resumeFig, snapFig *Figure) {
	if b.timed(pauseFig, sys.name(), func() error { return sys.pause(ctx, bx) }) != nil {
		return
	}
	if b.timed(resumeFig, sys.name(), func() error { return sys.resume(ctx, bx) }) != nil {
		return
	}
	var img *image
	start := time.Now()
	img, err := sys.snapshot(ctx, bx)
	switch {
	case errors.Is(err, errUnsupported):
	case err != nil:
		b.rec.fail(snapFig, sys.name(), err)
	default:
		b.rec.addDuration(snapFig, sys.name(), time.Since(start))
		if err := sys.removeImage(ctx, img); err != nil {
			b.logger.Warn("remove snapshot", "system", sys.name(), "err", err)
		}
	}
}

// makeTemplate boots a builder, leaves a mark in it, saves it as a
// template and deletes the builder, as the seed does (without its network
// install).
func (b *bench) makeTemplate(ctx context.Context, sys system) (*image, error) {
	builder, err := sys.boot(ctx)
	if err != nil {
		return nil, fmt.Errorf("builder: %w", err)
	}
	defer sys.remove(context.WithoutCancel(ctx), builder)
	if err := sys.writeRead(ctx, builder, []byte("built by aenv bench\n")); err != nil {
		return nil, fmt.Errorf("builder: %w", err)
	}
	return sys.template(ctx, builder)
}

// forkFigure forks a running sandbox ForkCount times per iteration and
// waits until every child answers a command.
func (b *bench) forkFigure(ctx context.Context, sys system) error {
	n := b.cfg.ForkCount
	wall := b.rec.figure("fork_wall", fmt.Sprintf("Fork of %d: until every child answers", n), GroupSeed, UnitMs)
	perChild := b.rec.figure("fork_per_child", fmt.Sprintf("Fork of %d: per child", n), GroupSeed, UnitMs)
	b.rec.describe(wall, "aenv: POST /fork, then /execute true in every child; runsc: checkpoint, restore each (4 at a time), exec true in each (runsc-envd: until its envd listens)")
	b.rec.describe(perChild, "the wall time divided by the number of children")
	parent, err := sys.boot(ctx)
	if err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	defer sys.remove(context.WithoutCancel(ctx), parent)
	for i := 0; i < b.cfg.ForkIterations && ctx.Err() == nil; i++ {
		start := time.Now()
		children, errs := sys.fork(ctx, parent, n)
		if len(errs) == 1 && errors.Is(errs[0], errUnsupported) {
			return errUnsupported
		}
		errs = append(errs, execAll(ctx, sys, children)...)
		elapsed := time.Since(start)
		switch {
		case ctx.Err() != nil: // some children may not have been asked
		case len(errs) > 0:
			b.rec.fail(wall, sys.name(), fmt.Errorf("%d of %d children failed: %w", len(errs), n, errs[0]))
		default:
			b.rec.addDuration(wall, sys.name(), elapsed)
			b.rec.addDuration(perChild, sys.name(), elapsed/time.Duration(n))
		}
		for _, err := range removeAll(ctx, sys, children, 4) {
			b.logger.Warn("delete fork child", "system", sys.name(), "err", err)
		}
	}
	return ctx.Err()
}

// execAll runs `true` in every box at once and returns the failures.
func execAll(ctx context.Context, sys system, boxes []*box) []error {
	errs := make([]error, len(boxes))
	forEach(ctx, len(boxes), len(boxes), func(ctx context.Context, i int) {
		errs[i] = sys.exec(ctx, boxes[i])
	})
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed
}
