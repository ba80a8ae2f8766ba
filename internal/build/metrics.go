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

// BuildStatus reports the status of the newest build of the template
// named name this server knows of ("" when none): waiting, building,
// ready or error.
func (s *Service) BuildStatus(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.order) - 1; i >= 0; i-- {
		b := s.builds[s.order[i]]
		if b == nil || b.templateID != name {
			continue
		}
		b.mu.Lock()
		status := b.status
		b.mu.Unlock()
		return status
	}
	return ""
}
