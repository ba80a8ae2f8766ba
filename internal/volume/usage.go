package volume

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// UsageInterval is how often the disk each volume takes is measured: a
// walk of its files, too dear to make on every read (in a volume pool, a
// look-up of its quota group, whose figures btrfs updates as it commits).
const UsageInterval = time.Minute

// Usage is what a volume's own files take on disk, as last measured. A
// copy-on-write copy's own files are those written since the copy; the
// layers it shares are counted apart.
type Usage struct {
	Bytes int64 // allocated blocks
	Files int64 // not counted in a volume pool
	At    time.Time
}

// measure walks the files of volume id's own directory; in a volume
// pool, it reads what the volume's quota group counts instead (what its
// size bounds: every block its files refer to, shared or not).
func (s *Service) measure(id string) (Usage, error) {
	if s.pool != nil {
		n, err := referencedBytes(s.dataDir(id))
		return Usage{Bytes: n, At: time.Now()}, err
	}
	d, err := Open(s.dataDir(id))
	if err != nil {
		return Usage{}, err
	}
	defer d.Close()
	bytes, files, err := d.Usage()
	return Usage{Bytes: bytes, Files: files, At: time.Now()}, err
}

// sampleUsage measures every local volume, then does so again every
// interval until ctx ends.
// The wait is at least ten times the last walk, so that large volumes
// are not walked without end.
func (s *Service) sampleUsage(ctx context.Context, interval time.Duration) {
	defer s.sweeps.Done()
	for {
		start := time.Now()
		s.measureAll(ctx)
		wait := max(interval, 10*time.Since(start))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// measureAll measures every local volume. Measures run one at a time, so
// that the last published is the last made.
func (s *Service) measureAll(ctx context.Context) {
	s.measureMu.Lock()
	defer s.measureMu.Unlock()
	all, err := s.records.ListNodeVolumes(ctx, s.nodeID)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.WarnContext(ctx, "measure volumes", "err", err)
		}
		return
	}
	if s.pool != nil {
		// Limits hold only while btrfs counts exactly (see keepQuotaExact).
		if dev, ok, _ := mountedSource(s.dir); ok && quotaInconsistent(dev) {
			s.logger.WarnContext(ctx, "volume pool: quota counts are inconsistent, and sizes unenforced until a rescan ends: rescanning")
			if err := rescanQuota(s.dir); err != nil {
				s.logger.WarnContext(ctx, "volume pool: rescan quotas", "err", err)
			}
		}
	}
	seen := map[string]measured{}
	for _, v := range all {
		if ctx.Err() != nil {
			return
		}
		if !s.Local(v) {
			continue
		}
		u, err := s.measure(v.ID)
		if err != nil {
			continue // deleted meanwhile, or unreadable: no figure
		}
		seen[v.ID] = measured{u, v.Name, v.TeamID}
	}
	// Each layer once, counted to the team of the volumes that hold it
	// (a volume and its copies are one team's). A pool's layers are a
	// fork's passing snapshots: not walked.
	var layers int64
	layerTeams := map[string]int64{}
	if s.pool == nil {
		held := map[string]string{}
		for _, v := range all {
			if s.Local(v) {
				for _, l := range v.Layers {
					held[l] = v.TeamID
				}
			}
		}
		for l, team := range held {
			d, err := Open(s.layerDir(l))
			if err != nil {
				continue // removed meanwhile
			}
			n, _, _ := d.Usage()
			d.Close()
			layers += n
			layerTeams[team] += n
		}
	}
	s.usageMu.Lock()
	s.usage, s.layerBytes, s.layerTeamBytes = seen, layers, layerTeams
	s.usageMu.Unlock()
}

// forgetUsage drops deleted volume id's usage.
func (s *Service) forgetUsage(id string) {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	if _, ok := s.usage[id]; ok {
		next := make(map[string]measured, len(s.usage))
		for k, v := range s.usage {
			if k != id {
				next[k] = v
			}
		}
		s.usage = next
	}
}

// UsageOf is volume id's usage as last measured; false before the first
// measure.
func (s *Service) UsageOf(id string) (Usage, bool) {
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	m, ok := s.usage[id]
	return m.Usage, ok
}

// TeamBytes sums, by team, the bytes of this node's volumes as last
// measured (a volume not measured yet counts nothing), with the layers
// their copies share, each once: what the teams' storage use counts of
// them. In a volume pool a copy counts every block it refers to, shared
// with its source or not (what its size bounds).
func (s *Service) TeamBytes() map[string]int64 {
	s.usageMu.Lock()
	usage, layers := s.usage, s.layerTeamBytes
	s.usageMu.Unlock()
	out := map[string]int64{}
	for _, m := range usage {
		out[m.team] += m.Bytes
	}
	for team, n := range layers {
		out[team] += n
	}
	return out
}

// measured is a volume's usage and what names it in metrics.
type measured struct {
	Usage
	name, team string
}

// Collector reports the node's volumes to Prometheus: how many, what each
// takes, and what their shared layers take.
func (s *Service) Collector() prometheus.Collector {
	return &usageCollector{s: s}
}

type usageCollector struct{ s *Service }

var (
	volumesDesc = prometheus.NewDesc("aenv_volumes", "Volumes this node keeps (as last measured).", nil, nil)
	volumeBytes = prometheus.NewDesc("aenv_volume_used_bytes",
		"Disk a volume's own files take, as last measured (a copy's: what was written since the copy; in a volume pool, every block its files refer to, shared with copies or not).",
		[]string{"volume", "name", "team"}, nil)
	layerBytesDesc = prometheus.NewDesc("aenv_volume_layers_bytes",
		"Disk the frozen layers of copy-on-write volumes take, shared by their copies.", nil, nil)
)

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- volumesDesc
	ch <- volumeBytes
	ch <- layerBytesDesc
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.usageMu.Lock()
	usage, layers := c.s.usage, c.s.layerBytes
	c.s.usageMu.Unlock()
	ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(len(usage)))
	ch <- prometheus.MustNewConstMetric(layerBytesDesc, prometheus.GaugeValue, float64(layers))
	for id, m := range usage {
		ch <- prometheus.MustNewConstMetric(volumeBytes, prometheus.GaugeValue, float64(m.Bytes), id, m.name, m.team)
	}
}
