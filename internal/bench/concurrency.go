package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// runConcurrency: many creates at once, a sustained create/delete rate,
// many exec streams at once.
func (b *bench) runConcurrency(ctx context.Context) error {
	var errs []error
	for _, sys := range b.systems() {
		b.logger.Info("concurrency figures", "system", sys.name())
		if err := b.concurrentCreates(ctx, sys); err != nil {
			errs = append(errs, fmt.Errorf("%s concurrent creates: %w", sys.name(), err))
		}
		if err := b.sustainedCreates(ctx, sys); err != nil {
			errs = append(errs, fmt.Errorf("%s sustained creates: %w", sys.name(), err))
		}
		if err := b.concurrentStreams(ctx, sys); err != nil {
			errs = append(errs, fmt.Errorf("%s concurrent streams: %w", sys.name(), err))
		}
	}
	return errors.Join(errs...)
}

// concurrentCreates starts ConcurrentCreates creates at the same instant,
// twice: the first burst, then, once the system has settled (aenv's warm
// pool, grown by the first burst, refilled), the next. Each create's
// latency is a sample, each failure an error.
func (b *bench) concurrentCreates(ctx context.Context, sys system) error {
	n := b.cfg.ConcurrentCreates
	first := b.createBurst(ctx, sys, "concurrent_create", fmt.Sprintf("%d concurrent creates", n),
		"POST /sandboxes with server defaults (the warm pool may serve some); raw: run + exec true; the errors column counts failed creates")
	sys.settle(ctx)
	next := b.createBurst(ctx, sys, "concurrent_create_next", fmt.Sprintf("%d concurrent creates, next burst", n),
		"the same burst again once the warm pool, grown to the first burst's size, has refilled")
	return errors.Join(first, next)
}

// createBurst makes ConcurrentCreates sandboxes at once, records each
// one's latency and the wall time under figures id and id_wall, and
// deletes them.
func (b *bench) createBurst(ctx context.Context, sys system, id, title, note string) error {
	n := b.cfg.ConcurrentCreates
	f := b.rec.figure(id, title+": each", GroupConcurrency, UnitMs)
	wall := b.rec.figure(id+"_wall", title+": until all answer", GroupConcurrency, UnitMs)
	b.rec.describe(f, note)
	boxes := make([]*box, n)
	start := time.Now()
	forEach(ctx, n, n, func(ctx context.Context, i int) {
		_ = b.timed(f, sys.name(), func() (err error) { boxes[i], err = sys.create(ctx); return err })
	})
	b.rec.addDuration(wall, sys.name(), time.Since(start))
	var made []*box
	for _, bx := range boxes {
		if bx != nil {
			made = append(made, bx)
		}
	}
	return errors.Join(removeAll(ctx, sys, made, 8)...)
}

// sustainedCreates keeps SustainedLevel sandboxes alive while
// SustainedWorkers loops each create one and delete the oldest, for
// SustainedSecs. The rate figure has one sample per whole second: the
// creates that completed in it.
func (b *bench) sustainedCreates(ctx context.Context, sys system) error {
	secs := b.cfg.SustainedSecs
	rate := b.rec.figure("sustained_creates_per_s", fmt.Sprintf("Sustained creates per second (%d s, %d alive)", secs, b.cfg.SustainedLevel), GroupConcurrency, UnitPerSecond)
	lat := b.rec.figure("sustained_create", "Sustained creates: each", GroupConcurrency, UnitMs)
	b.rec.describe(rate, fmt.Sprintf("%d loops of create (server defaults) + delete the oldest; one sample per second", b.cfg.SustainedWorkers))

	var mu sync.Mutex
	var live []*box
	defer func() { removeAll(context.WithoutCancel(ctx), sys, live, 8) }()
	for len(live) < b.cfg.SustainedLevel {
		bx, err := sys.boot(ctx)
		if err != nil {
			return fmt.Errorf("fill to %d: %w", b.cfg.SustainedLevel, err)
		}
		live = append(live, bx)
	}
	perSecond := make([]float64, secs)
	start := time.Now()
	end := start.Add(time.Duration(secs) * time.Second)
	forEach(ctx, b.cfg.SustainedWorkers, b.cfg.SustainedWorkers, func(ctx context.Context, _ int) {
		for time.Now().Before(end) && ctx.Err() == nil {
			var bx *box
			if b.timed(lat, sys.name(), func() (err error) { bx, err = sys.create(ctx); return err }) != nil {
				time.Sleep(100 * time.Millisecond) // do not spin on a refusing server
				continue
			}
			mu.Lock()
			if sec := int(time.Since(start) / time.Second); sec < secs {
				perSecond[sec]++
			}
			live = append(live, bx)
			oldest := live[0]
			live = live[1:]
			mu.Unlock()
			if err := sys.remove(ctx, oldest); err != nil {
				b.logger.Warn("sustained delete", "system", sys.name(), "err", err)
			}
		}
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, n := range perSecond {
		b.rec.add(rate, sys.name(), n)
	}
	return nil
}

// concurrentStreams runs ExecStreams streamed commands at once in one
// sandbox; each one's time to its end is a sample.
func (b *bench) concurrentStreams(ctx context.Context, sys system) error {
	n := b.cfg.ExecStreams
	f := b.rec.figure("concurrent_exec_streams", fmt.Sprintf("%d concurrent exec streams: each", n), GroupConcurrency, UnitMs)
	b.rec.describe(f, "one sandbox; aenv: envd process.Start streams; raw: concurrent exec echo")
	return withBox(ctx, sys, func(bx *box) error {
		forEach(ctx, n, n, func(ctx context.Context, _ int) {
			t, err := sys.stream(ctx, bx)
			if err != nil {
				b.rec.fail(f, sys.name(), err)
				return
			}
			b.rec.addDuration(f, sys.name(), t.total)
		})
		return ctx.Err()
	})
}
