package usage

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// TeamDay is what one team's sandboxes were given and used on one day
// (UTC), summed over the nodes that ran them.
type TeamDay struct {
	TeamID string `json:"teamID"`
	Day    string `json:"day"` // YYYY-MM-DD, UTC
	// SandboxSeconds is the time its sandboxes ran (paused ones do not
	// run); MemoryMBSeconds and VCPUSeconds weigh it by the memory and
	// vCPUs each was given; CPUSeconds is the CPU time they used.
	SandboxSeconds  float64 `json:"sandboxSeconds"`
	MemoryMBSeconds float64 `json:"memoryMBSeconds"`
	VCPUSeconds     float64 `json:"vcpuSeconds"`
	CPUSeconds      float64 `json:"cpuSeconds"`
	// StoredMBSeconds is what the team kept stored (its snapshots' images
	// and its volumes' files, in MiB) weighed by the time kept: divided
	// by the day's 86,400 seconds, the MiB it kept on average.
	StoredMBSeconds float64 `json:"storedMBSeconds"`
}

// DayLayout is how TeamDay.Day is written.
const DayLayout = time.DateOnly

// LedgerFilter selects days: of TeamID ("" every team), From to To
// inclusive ("" unbounded), at most Limit rows (0: all).
type LedgerFilter struct {
	TeamID, From, To string
	Limit            int
}

// MaxRows bounds the rows one read of the ledger answers with.
const MaxRows = 10_000

// Ledger keeps the teams' usage by day.
type Ledger interface {
	// AddTeamUsage adds days, sorted by team then day, to what is kept
	// (the same team and day from two nodes, or two flushes, add up).
	AddTeamUsage(ctx context.Context, days []TeamDay) error
	// ListTeamUsage returns the days f selects, by day then team.
	ListTeamUsage(ctx context.Context, f LedgerFilter) ([]TeamDay, error)
}

// CheckDays says why from or to is not a day (YYYY-MM-DD), or nil.
func CheckDays(from, to string) error {
	for _, d := range []struct{ name, v string }{{"from", from}, {"to", to}} {
		if d.v == "" {
			continue
		}
		if _, err := time.Parse(DayLayout, d.v); err != nil {
			return fmt.Errorf("%s %q: want a day, such as 2026-12-01", d.name, d.v)
		}
	}
	return nil
}

// teamDay keys the usage not yet written.
type teamDay struct{ team, day string }

// account adds one sample's worth of sb's use to the totals not yet
// written; h.mu held. counted is the time the sample stands for, cpu the
// CPU time used in it.
func (h *History) account(team string, memoryMB, vcpu int, at time.Time, counted, cpu time.Duration) {
	if h.cfg.Ledger == nil {
		return
	}
	d := h.pendingDay(teamDay{team, at.UTC().Format(DayLayout)})
	secs := counted.Seconds()
	d.add(TeamDay{SandboxSeconds: secs, MemoryMBSeconds: secs * float64(memoryMB),
		VCPUSeconds: secs * float64(vcpu), CPUSeconds: cpu.Seconds()})
}

// add adds o's figures to d's.
func (d *TeamDay) add(o TeamDay) {
	d.SandboxSeconds += o.SandboxSeconds
	d.MemoryMBSeconds += o.MemoryMBSeconds
	d.VCPUSeconds += o.VCPUSeconds
	d.CPUSeconds += o.CPUSeconds
	d.StoredMBSeconds += o.StoredMBSeconds
}

// StorageSource tells what a node keeps stored for each team: bytes by
// team ID, the node's own (an image cached from another node's upload is
// that node's to count).
type StorageSource interface {
	StoredBytes(ctx context.Context) (map[string]int64, error)
}

// accountStorage adds what each team keeps stored now, weighed by the
// time since the last account, to the totals not yet written. After a gap
// (a slow or failed read, a restart) it counts one FlushEvery.
func (h *History) accountStorage(ctx context.Context, now time.Time) {
	if h.cfg.Ledger == nil || h.cfg.Storage == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	stored, err := h.cfg.Storage.StoredBytes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			h.logger.WarnContext(ctx, "usage: what teams keep stored", "err", err)
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	counted := now.Sub(h.storedAt)
	if h.storedAt.IsZero() || counted <= 0 || counted > 2*h.cfg.FlushEvery {
		counted = h.cfg.FlushEvery
	}
	h.storedAt = now
	days := daysOf(now.Add(-counted), now)
	for team, bytes := range stored {
		if bytes <= 0 || team == "" {
			continue // "": the public templates', no team's
		}
		for _, part := range days {
			d := h.pendingDay(teamDay{team, part.day})
			d.StoredMBSeconds += float64(bytes) / (1 << 20) * part.length.Seconds()
		}
	}
}

// dayPart is the part of an interval that falls on one day (UTC).
type dayPart struct {
	day    string
	length time.Duration
}

// daysOf cuts the interval from start to end at each midnight (UTC), so
// that an interval across one counts to both days.
func daysOf(start, end time.Time) []dayPart {
	start, end = start.UTC(), end.UTC()
	var out []dayPart
	for start.Before(end) {
		y, m, d := start.Date()
		next := time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
		if next.After(end) {
			next = end
		}
		out = append(out, dayPart{day: start.Format(DayLayout), length: next.Sub(start)})
		start = next
	}
	return out
}

// pendingDay is the totals not yet written of k, made if need be; h.mu
// held.
func (h *History) pendingDay(k teamDay) *TeamDay {
	d := h.pending[k]
	if d == nil {
		d = &TeamDay{TeamID: k.team, Day: k.day}
		h.pending[k] = d
	}
	return d
}

// maxPending bounds the team-days kept while the ledger cannot be written.
const maxPending = 100_000

// Flush writes the usage accounted so far to the ledger. What cannot be
// written is kept for the next flush.
func (h *History) Flush(ctx context.Context) error {
	if h.cfg.Ledger == nil {
		return nil
	}
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	h.mu.Lock()
	pending := h.pending
	h.pending = map[teamDay]*TeamDay{}
	h.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	days := make([]TeamDay, 0, len(pending))
	for _, d := range pending {
		days = append(days, *d)
	}
	// In one order on every node, so that two nodes' upserts of the
	// same rows take their locks in the same order and never deadlock.
	slices.SortFunc(days, func(a, b TeamDay) int {
		return cmp.Or(strings.Compare(a.TeamID, b.TeamID), strings.Compare(a.Day, b.Day))
	})
	err := h.cfg.Ledger.AddTeamUsage(ctx, days)
	if err == nil {
		return nil
	}
	// Put it back, under what was accounted meanwhile.
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, d := range pending {
		if len(h.pending) >= maxPending {
			h.logger.WarnContext(ctx, "team usage dropped: too much kept unwritten", "kept", len(h.pending))
			break
		}
		if now := h.pending[k]; now != nil {
			now.add(*d)
			continue
		}
		h.pending[k] = d
	}
	return fmt.Errorf("write team usage: %w", err)
}
