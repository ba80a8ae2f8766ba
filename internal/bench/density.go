package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// densityLimits are when the density loop stops adding sandboxes.
type densityLimits struct {
	max        int    // sandboxes
	ceilingKiB uint64 // host memory given to them
	minFreeKiB uint64 // MemAvailable never to go below
}

// runDensity creates idle base sandboxes, each proven to answer a
// command, until DensityMax, the memory ceiling or the server's refusal;
// then reads resident memory per sandbox from the metrics endpoint (its
// cgroup) and from the host's MemAvailable.
func (b *bench) runDensity(ctx context.Context) error {
	count := b.rec.figure("density_count", "Density: idle sandboxes held", GroupDensity, UnitCount)
	perMetrics := b.rec.figure("density_mem_metrics", "Density: memory per idle sandbox (metrics)", GroupDensity, UnitMiB)
	perHost := b.rec.figure("density_mem_host", "Density: memory per idle sandbox (host MemAvailable)", GroupDensity, UnitMiB)
	create := b.rec.figure("density_create", "Density: create as the machine fills", GroupDensity, UnitMs)
	b.rec.describe(perMetrics, "memUsed of GET /sandboxes/{id}/metrics (the sandbox's cgroup), one sample per sandbox")
	b.rec.describe(perHost, "drop of the host's MemAvailable divided by the count")

	availStart, okA := meminfo("MemAvailable")
	total, okT := meminfo("MemTotal")
	if !okA || !okT {
		return errors.New("cannot read /proc/meminfo")
	}
	limits := densityLimits{max: b.cfg.DensityMax, ceilingKiB: uint64(b.cfg.DensityCeilingMiB) << 10,
		minFreeKiB: uint64(float64(total) * b.cfg.DensityMinFreePct / 100)}
	var boxes []*box
	defer func() { removeAll(context.WithoutCancel(ctx), b.aenv, boxes, 8) }()
	reason := ""
	for reason == "" && ctx.Err() == nil {
		if reason = limits.reached(len(boxes), availStart); reason != "" {
			break
		}
		var bx *box
		err := b.timed(create, SystemAenv, func() (err error) {
			if bx, err = b.aenv.boot(ctx); err != nil {
				return err
			}
			return b.aenv.exec(ctx, bx)
		})
		if bx != nil {
			boxes = append(boxes, bx)
		}
		if err != nil {
			reason = "the server refused or failed: " + err.Error()
			if !isStatus(err, http.StatusServiceUnavailable) && !isStatus(err, http.StatusTooManyRequests) &&
				!isStatus(err, http.StatusInsufficientStorage) {
				return fmt.Errorf("after %d sandboxes: %w", len(boxes), err)
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b.logger.Info("density reached", "sandboxes", len(boxes), "why", reason)
	b.rec.describe(count, "stopped at: "+reason)
	b.rec.add(count, SystemAenv, float64(len(boxes)))
	// Let lazily started work in the guests settle before reading memory.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, bx := range boxes {
		used, err := b.aenv.c.memUsed(ctx, bx.id)
		if err != nil {
			b.rec.fail(perMetrics, SystemAenv, err)
			continue
		}
		b.rec.add(perMetrics, SystemAenv, float64(used)/(1<<20))
	}
	if availNow, ok := meminfo("MemAvailable"); ok && len(boxes) > 0 && availNow < availStart {
		b.rec.add(perHost, SystemAenv, float64(availStart-availNow)/1024/float64(len(boxes)))
	}
	return nil
}

// reached says why no more sandboxes should be made, or "".
func (l densityLimits) reached(n int, availStart uint64) string {
	if n >= l.max {
		return fmt.Sprintf("the count cap (%d)", l.max)
	}
	avail, ok := meminfo("MemAvailable")
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
