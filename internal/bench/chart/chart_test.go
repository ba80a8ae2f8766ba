package chart_test

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/internal/bench"
	"github.com/aenv-dev/aenv/internal/bench/chart"
)

// committedReport is a full run's report, the one docs/bench.png shows.
func committedReport(t *testing.T) *bench.Report {
	t.Helper()
	data, err := os.ReadFile("../../../docs/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	var r bench.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func figure(name, unit string, samples map[string][]float64) *bench.Figure {
	f := &bench.Figure{Name: name, Title: name, Unit: unit, Results: map[string]*bench.Result{}}
	for sys, s := range samples {
		f.Results[sys] = &bench.Result{Samples: s}
	}
	return f
}

func TestWrite(t *testing.T) {
	tests := []struct {
		name      string
		report    *bench.Report
		minHeight int
		wantErr   string
	}{
		{name: "a full run", report: committedReport(t), minHeight: 500},
		{name: "few samples and zeros", report: &bench.Report{Figures: []*bench.Figure{
			figure("create", bench.UnitMs, map[string][]float64{bench.SystemAenv: {0, 1.5, 2}, bench.SystemRunsc: {3, 4, 5, 6, 7}}),
			figure("density", bench.UnitCount, map[string][]float64{bench.SystemAenv: {250}}),
		}}, minHeight: 100},
		{name: "no latency figure", report: &bench.Report{Figures: []*bench.Figure{
			figure("density", bench.UnitCount, map[string][]float64{bench.SystemAenv: {250}}),
		}}, wantErr: "no latency figure"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := chart.Write(&out, tt.report)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(&out)
			if err != nil {
				t.Fatalf("not a PNG: %v", err)
			}
			if b := img.Bounds(); b.Dx() < 500 || b.Dy() < tt.minHeight {
				t.Errorf("chart is %v", b)
			}
		})
	}
}

// The plotting library and its fonts stay out of aenv, which is also the
// server: only aenv-chart links them.
func TestOnlyTheChartToolLinksPlotting(t *testing.T) {
	// go test puts its own go first on the PATH of the tests it runs.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go tool to list dependencies with: %v", err)
	}
	tests := []struct {
		pkg       string
		wantLinks bool
	}{
		{"github.com/aenv-dev/aenv/cmd/aenv", false},
		{"github.com/aenv-dev/aenv/cmd/envd", false},
		{"github.com/aenv-dev/aenv/cmd/aenv-chart", true}, // shows the check sees it where it is
	}
	for _, tt := range tests {
		t.Run(path.Base(tt.pkg), func(t *testing.T) {
			out, err := exec.Command(goTool, "list", "-deps", tt.pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			links := strings.Contains(string(out), "gonum.org/v1/plot\n") || strings.Contains(string(out), "/internal/bench/chart\n")
			if links != tt.wantLinks {
				t.Errorf("%s links the plotting library: %v, want %v", tt.pkg, links, tt.wantLinks)
			}
		})
	}
}
