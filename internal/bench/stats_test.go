package bench

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		samples []float64
		want    Stats
	}{
		{"none", nil, Stats{}},
		{"one", []float64{7}, Stats{N: 1, Avg: 7, P50: 7, P99: 7, Min: 7, Max: 7}},
		{"even count: median of the middle two", []float64{4, 1, 3, 2}, Stats{N: 4, Avg: 2.5, P50: 2.5, P99: 3.97, Min: 1, Max: 4}},
		{"odd count, unsorted", []float64{5, 1, 9}, Stats{N: 3, Avg: 5, P50: 5, P99: 8.92, Min: 1, Max: 9}},
		{"p99 of 101 samples is the 100th", seq(0, 100), Stats{N: 101, Avg: 50, P50: 50, P99: 99, Min: 0, Max: 100}},
		{"equal samples", []float64{2, 2, 2}, Stats{N: 3, Avg: 2, P50: 2, P99: 2, Min: 2, Max: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Summarize(tt.samples)
			if got.N != tt.want.N || !near(got.Avg, tt.want.Avg) || !near(got.P50, tt.want.P50) ||
				!near(got.P99, tt.want.P99) || !near(got.Min, tt.want.Min) || !near(got.Max, tt.want.Max) {
				t.Errorf("Summarize(%v) = %+v, want %+v", tt.samples, got, tt.want)
			}
		})
	}
}

func TestSummarizeLeavesSamplesAlone(t *testing.T) {
	samples := []float64{3, 1, 2}
	Summarize(samples)
	if samples[0] != 3 || samples[1] != 1 || samples[2] != 2 {
		t.Errorf("samples reordered: %v", samples)
	}
}

func TestRecorderRatiosDivideP50s(t *testing.T) {
	rec := newRecorder()
	f := rec.figure("x", "X", GroupSeed, UnitMs)
	for _, v := range []float64{10, 20, 30} {
		rec.add(f, SystemAenv, v)
	}
	rec.add(f, SystemRunsc, 10)
	rec.add(f, SystemRunc, 40)
	g := rec.figure("aenv only", "Y", GroupSeed, UnitMs)
	rec.add(g, SystemAenv, 1)
	h := rec.figure("raw failed", "Z", GroupSeed, UnitMs)
	rec.add(h, SystemAenv, 1)
	rec.fail(h, SystemRunsc, errTest("boom"))
	rec.fail(h, SystemRunsc, errTest("second"))

	if again := rec.figure("x", "other title", GroupExec, UnitCount); again != f {
		t.Error("declaring a figure twice made a second one")
	}
	figs := rec.finish()
	if len(figs) != 3 {
		t.Fatalf("%d figures, want 3", len(figs))
	}
	if !near(f.Ratios[SystemRunsc], 2) || !near(f.Ratios[SystemRunc], 0.5) {
		t.Errorf("ratios %v, want runsc 2 and runc 0.5", f.Ratios)
	}
	if g.Ratios != nil {
		t.Errorf("a figure without raw results has ratios %v", g.Ratios)
	}
	if _, ok := h.Ratios[SystemRunsc]; ok {
		t.Errorf("a raw side without samples got a ratio: %v", h.Ratios)
	}
	if res := h.Results[SystemRunsc]; res.Errors != 2 || res.FirstError != "boom" || res.N != 0 {
		t.Errorf("failed side: %+v", res)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

func seq(from, to int) []float64 {
	var out []float64
	for i := from; i <= to; i++ {
		out = append(out, float64(i))
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
