package api

import (
	"net/http"
	"net/url"
	"time"

	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/usage"
	"github.com/aenv-dev/aenv/internal/wire"
)

// toMetric is E2B's SandboxMetric of a sample. Disk figures are not
// measured (the root filesystem is an in-memory overlay counted in
// memUsed). The timestamp is whole seconds, as timestampUnix.
func toMetric(s usage.Sample) wire.SandboxMetric {
	at := s.At.UTC().Truncate(time.Second)
	return wire.SandboxMetric{Timestamp: at, TimestampUnix: at.Unix(), CPUUsedPct: s.CPUUsedPct,
		CpuCount: s.CPUCount, MemUsed: int64(s.MemUsed), MemTotal: int64(s.MemTotal)}
}

// metricsRange reads E2B's start and end (Unix seconds, as the SDK sends
// them) into inclusive bounds; zero bounds are open. end covers its whole
// second, since the SDK rounds it.
func metricsRange(q url.Values) (start, end time.Time, err error) {
	if start, err = parseTimeQuery(q, "start"); err != nil {
		return start, end, err
	}
	if end, err = parseTimeQuery(q, "end"); err != nil {
		return start, end, err
	}
	if !end.IsZero() {
		end = end.Truncate(time.Second).Add(time.Second - time.Nanosecond)
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return start, end, badRequest("end must not be before start")
	}
	return start, end, nil
}

// sandboxMetrics serves E2B's metrics of a sandbox: the samples taken in
// the requested range (by default since the sandbox started; for a sandbox
// with none yet, one taken now).
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) error {
	start, end, err := metricsRange(r.URL.Query())
	if err != nil {
		return err
	}
	sb, err := s.sandboxes.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := []wire.SandboxMetric{}
	if s.cfg.Usage != nil {
		for _, sample := range s.cfg.Usage.Range(sb.ID, start, end) {
			out = append(out, toMetric(sample))
		}
	}
	// Without history yet (a sandbox younger than one sampling period, or
	// no sampler) and without a range, the answer is a sample taken now.
	if len(out) == 0 && start.IsZero() && end.IsZero() && sb.State == store.StateRunning {
		sample, err := s.currentSample(r, sb)
		if err != nil {
			return err
		}
		out = append(out, toMetric(sample))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// currentSample measures sb now, with its CPU use averaged since it
// started.
func (s *Server) currentSample(r *http.Request, sb *store.Sandbox) (usage.Sample, error) {
	st, err := s.sandboxes.Stats(r.Context(), sb.ID)
	if err != nil {
		return usage.Sample{}, err
	}
	now := time.Now().UTC()
	elapsed := now.Sub(sb.StartedAt).Seconds()
	cpuPct := 0.0
	if elapsed > 0 && sb.VCPU > 0 {
		cpuPct = float64(st.CPUUsageNanos) / 1e9 / elapsed / float64(sb.VCPU) * 100
	}
	return usage.Sample{At: now, CPUUsedPct: cpuPct, CPUCount: sb.VCPU, MemUsed: st.MemoryBytes,
		MemTotal: uint64(sb.MemoryMB) << 20}, nil
}
