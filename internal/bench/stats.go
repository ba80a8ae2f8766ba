package bench

import (
	"math"
	"slices"
)

// Stats summarises a figure's samples the way the seed's script does:
// mean, median, 99th percentile, minimum and maximum.
type Stats struct {
	N   int     `json:"n"`
	Avg float64 `json:"avg"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// Summarize computes Stats of samples; no samples give the zero Stats.
// Percentiles interpolate linearly between the two nearest ranks, so the
// p50 of an even count is the mean of the middle two (the median).
func Summarize(samples []float64) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	sum := 0.0
	for _, v := range sorted {
		sum += v
	}
	return Stats{
		N:   len(sorted),
		Avg: sum / float64(len(sorted)),
		P50: percentile(sorted, 0.50),
		P99: percentile(sorted, 0.99),
		Min: sorted[0],
		Max: sorted[len(sorted)-1],
	}
}

// percentile of sorted samples, p in [0,1].
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := p * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	frac := pos - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

// ratio is a/b, or 0 when either side has nothing to compare.
func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}
