package build

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenv-dev/aenv/internal/store"
)

// metrics are the build service's figures in /metrics.
type metrics struct {
	finished *prometheus.CounterVec // by result: ready or error
	duration prometheus.Histogram
	running  prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenv_builds_total", Help: "Template builds finished, by result (ready or error).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "aenv_build_duration_seconds", Help: "How long template builds ran, waits for another build of the template excluded.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aenv_builds_running", Help: "Template builds running now.",
		}),
	}
}

// Collectors are the build service's metrics, for a registry.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.finished, s.metrics.duration, s.metrics.running}
}

// maxInProgress bounds the builds InProgress reports, and
// maxInProgressPerTeam those of one team: what a heartbeat carries stays
// small whatever is queued, and one team's requests do not hide another's.
const (
	maxInProgress        = 100
	maxInProgressPerTeam = 20
)

// unstartedFor is how long a build requested but never started (its
// files not sent, or its client gone) is reported as waiting.
const unstartedFor = 30 * time.Minute

// InProgress reports the newest build of each template that is waiting
// (started, or requested less than unstartedFor ago) or building, newest
// first, at most maxInProgress, and maxInProgressPerTeam of a team.
func (s *Service) InProgress() []store.BuildProgress {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.BuildProgress
	seen := map[string]bool{}
	perTeam := map[string]int{}
	for i := len(s.order) - 1; i >= 0 && len(out) < maxInProgress; i-- {
		b := s.builds[s.order[i]]
		if b == nil || seen[b.templateID] {
			continue
		}
		seen[b.templateID] = true
		b.mu.Lock()
		stale := b.status == StatusWaiting && !b.started && time.Since(b.created) > unstartedFor
		if (b.status == StatusWaiting || b.status == StatusBuilding) && !stale && perTeam[b.team] < maxInProgressPerTeam {
			perTeam[b.team]++
			out = append(out, store.BuildProgress{Template: b.templateID, BuildID: b.id, Status: b.status,
				TeamID: b.team, VCPU: b.vcpu, MemoryMB: b.memoryMB, Created: b.created})
		}
		b.mu.Unlock()
	}
	return out
}

// BuildStatuses reports, by template name, the status of the newest build
// this server knows of: one pass over the remembered builds, for a list of
// templates.
func (s *Service) BuildStatuses() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string)
	for i := len(s.order) - 1; i >= 0; i-- {
		b := s.builds[s.order[i]]
		if b == nil {
			continue
		}
		if _, seen := out[b.templateID]; seen {
			continue
		}
		b.mu.Lock()
		out[b.templateID] = b.status
		b.mu.Unlock()
	}
	return out
}
