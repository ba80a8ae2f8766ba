package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// densityLimits are when the density loop stops adding sandboxes.
type densityLimits struct {
	max        int    // sandboxes
	ceilingKiB uint64 // host memory given to them
	minFreeKiB uint64 // MemAvailable never to go below
}

// densityFigures are the figures the density group fills.
type densityFigures struct {
	count, metrics, host, available, create *Figure
}

// runDensity creates idle sandboxes, each proven to answer a command,
// until DensityMax, the memory ceiling or the server's refusal, and reads
// the resident memory of each. The raw runtimes then hold as many idle
// containers as aenv did, for the per-sandbox memory ratio.
func (b *bench) runDensity(ctx context.Context) error {
	figs := densityFigures{
		count:     b.rec.figure("density_count", "Density: idle sandboxes held", GroupDensity, UnitCount),
		metrics:   b.rec.figure("density_mem_metrics", "Density: memory per idle sandbox (metrics)", GroupDensity, UnitMiB),
		host:      b.rec.figure("density_mem_host", "Density: memory per idle sandbox (host PSS)", GroupDensity, UnitMiB),
		available: b.rec.figure("density_mem_available", "Density: host MemAvailable drop per sandbox", GroupDensity, UnitMiB),
		create:    b.rec.figure("density_create", "Density: create as the machine fills", GroupDensity, UnitMs),
	}
	b.rec.describe(figs.metrics, "memUsed of GET /sandboxes/{id}/metrics (the sandbox's cgroup), one sample per sandbox")
	b.rec.describe(figs.host, "PSS of the sandbox's or container's host processes, each address space once (systrap's sysmsg threads share their stub's), one sample per sandbox")
	b.rec.describe(figs.available, "drop of the host's MemAvailable while they ran, divided by the count (includes the server's own share; noisy)")

	_, okA := memKiB("MemAvailable")
	total, okT := memKiB("MemTotal")
	if !okA || !okT {
		return errors.New("cannot read /proc/meminfo")
	}
	limits := densityLimits{max: b.cfg.DensityMax, ceilingKiB: uint64(b.cfg.DensityCeilingMiB) << 10,
		minFreeKiB: uint64(float64(total) * b.cfg.DensityMinFreePct / 100)}
	n, err := b.densityOn(ctx, b.aenv, limits, figs)
	if err != nil {
		return fmt.Errorf("aenv: %w", err)
	}
	var errs []error
	for _, raw := range b.raw {
		limits.max = max(1, n)
		if _, err := b.densityOn(ctx, raw, limits, figs); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", raw.kind, err))
		}
	}
	return errors.Join(errs...)
}

// densityOn fills sys, measures and empties it; it returns how many
// sandboxes it held.
func (b *bench) densityOn(ctx context.Context, sys system, limits densityLimits, figs densityFigures) (int, error) {
	availStart, _ := memKiB("MemAvailable")
	var boxes []*box
	defer func() { removeAll(context.WithoutCancel(ctx), sys, boxes, 8) }()
	reason := ""
	for ctx.Err() == nil {
		if reason = limits.reached(len(boxes), availStart); reason != "" {
			break
		}
		var bx *box
		err := b.timed(figs.create, sys.name(), func() (err error) {
			if bx, err = sys.boot(ctx); err != nil {
				return err
			}
			return sys.exec(ctx, bx)
		})
		if bx != nil {
			boxes = append(boxes, bx)
		}
		if err != nil {
			if !refusal(err) {
				return len(boxes), fmt.Errorf("after %d sandboxes: %w", len(boxes), err)
			}
			reason = "the server refused more: " + err.Error()
			break
		}
	}
	if ctx.Err() != nil {
		return len(boxes), ctx.Err()
	}
	b.logger.Info("density reached", "system", sys.name(), "sandboxes", len(boxes), "why", reason)
	if sys.name() == SystemAenv {
		b.rec.describe(figs.count, "stopped at "+reason)
		b.rec.add(figs.count, SystemAenv, float64(len(boxes)))
	}
	// Let lazily started work in the guests settle before reading memory.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return len(boxes), ctx.Err()
	}
	b.measureIdle(ctx, sys, boxes, figs)
	if availNow, ok := memKiB("MemAvailable"); ok && len(boxes) > 0 && availNow < availStart {
		b.rec.add(figs.available, sys.name(), float64(availStart-availNow)/1024/float64(len(boxes)))
	}
	return len(boxes), nil
}

// measureIdle records each box's host memory and, on aenv, its metrics.
func (b *bench) measureIdle(ctx context.Context, sys system, boxes []*box, figs densityFigures) {
	const mib = 1 << 20
	procs := indexProcesses()
	for _, bx := range boxes {
		if ctx.Err() != nil {
			return // interrupted: the caller removes the boxes
		}
		if used, err := sys.hostMemory(ctx, bx, procs); err != nil {
			b.rec.fail(figs.host, sys.name(), err)
		} else {
			b.rec.add(figs.host, sys.name(), float64(used)/mib)
		}
		if sys.name() != SystemAenv {
			continue
		}
		if used, err := memUsed(ctx, b.c, bx.id); err != nil {
			b.rec.fail(figs.metrics, SystemAenv, err)
		} else {
			b.rec.add(figs.metrics, SystemAenv, float64(used)/mib)
		}
	}
}

// refusal tells a server saying "no more" from a failure.
func refusal(err error) bool {
	switch client.StatusOf(err) {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return true
	}
	return false
}

// reached says why no more sandboxes should be made, or "".
func (l densityLimits) reached(n int, availStart uint64) string {
	if n >= l.max {
		return fmt.Sprintf("the count cap (%d)", l.max)
	}
	avail, ok := memKiB("MemAvailable")
	if !ok {
		return "cannot read MemAvailable"
	}
	if avail < availStart && availStart-avail >= l.ceilingKiB {
		return fmt.Sprintf("the memory ceiling (%d MiB)", l.ceilingKiB>>10)
	}
	if avail < l.minFreeKiB {
		return fmt.Sprintf("the host's free-memory floor (%d MiB available)", avail>>10)
	}
	return ""
}

// memUsed is the sandbox's current memory use from its metrics.
func memUsed(ctx context.Context, c *client.Client, id string) (int64, error) {
	samples, err := c.Metrics(ctx, id)
	if err != nil {
		return 0, err
	}
	if len(samples) == 0 {
		return 0, fmt.Errorf("metrics of %s: no sample (not running?)", id)
	}
	return samples[len(samples)-1].MemUsed, nil
}
