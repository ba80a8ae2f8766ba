package build

import (
	"github.com/prometheus/client_golang/prometheus"
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
