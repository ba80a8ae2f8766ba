// Package chart draws a bench report's latency distributions as a PNG. It
// is its own package, linked only into the aenv-chart binary: the plotting
// library and its fonts stay out of aenv, the server.
package chart

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/aenv-dev/aenv/internal/bench"
)

// systemColors tell the systems apart in the chart.
var systemColors = map[string]color.RGBA{
	bench.SystemAenv:      {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	bench.SystemRunsc:     {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	bench.SystemRunscEnvd: {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	bench.SystemRunc:      {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// chartFloorMs keeps zero samples drawable on the log axis.
const chartFloorMs = 0.01

// Write renders the latency distribution of every duration figure, one
// horizontal box per figure and system on a log axis, as a PNG to w.
func Write(w io.Writer, r *bench.Report) error {
	systems := bench.Systems()
	p := plot.New()
	p.Title.Text = fmt.Sprintf("aenv bench: latency per operation (%d CPUs, %d MiB, Linux %s)", r.Machine.CPUs, r.Machine.MemoryMiB, r.Machine.Kernel)
	p.X.Label.Text = "milliseconds (log scale; box: quartiles and median, whiskers: 1.5 IQR, rings: outliers, dots: runs of 3 or fewer)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true

	var names []string
	row := 0
	for i := len(r.Figures) - 1; i >= 0; i-- { // the first figure on top
		f := r.Figures[i]
		if !f.IsLatency() {
			continue
		}
		for j := len(systems) - 1; j >= 0; j-- {
			sys := systems[j]
			res, ok := f.Results[sys]
			if !ok || len(res.Samples) == 0 {
				continue
			}
			box, err := plotter.NewBoxPlot(vg.Points(9), float64(row), chartValues(res.Samples))
			if err != nil {
				return fmt.Errorf("chart %s: %w", f.Name, err)
			}
			box.Horizontal = true
			box.FillColor = systemColors[sys]
			p.Add(box)
			if len(res.Samples) <= 3 { // too few for a box to show
				dots, err := sampleDots(res.Samples, float64(row), systemColors[sys])
				if err != nil {
					return fmt.Errorf("chart %s: %w", f.Name, err)
				}
				p.Add(dots)
			}
			names = append(names, f.Name+" "+sys)
			row++
		}
	}
	if row == 0 {
		return errors.New("chart: no latency figure has samples")
	}
	p.NominalY(names...)
	for _, sys := range systems {
		p.Legend.Add(sys, swatch{systemColors[sys]})
	}
	img := vgimg.New(11*vg.Inch, vg.Length(row)*0.22*vg.Inch+1.5*vg.Inch)
	p.Draw(draw.New(img))
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("chart: write PNG: %w", err)
	}
	return nil
}

func chartValues(samples []float64) plotter.Values {
	out := make(plotter.Values, len(samples))
	for i, v := range samples {
		out[i] = math.Max(v, chartFloorMs)
	}
	return out
}

// sampleDots marks each sample at height y.
func sampleDots(samples []float64, y float64, c color.Color) (*plotter.Scatter, error) {
	pts := make(plotter.XYs, len(samples))
	for i, v := range samples {
		pts[i] = plotter.XY{X: math.Max(v, chartFloorMs), Y: y}
	}
	dots, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	dots.GlyphStyle.Color = c
	dots.GlyphStyle.Shape = draw.CircleGlyph{}
	dots.GlyphStyle.Radius = vg.Points(3.5)
	return dots, nil
}

// swatch is a legend entry: a filled square of the system's colour.
type swatch struct{ c color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.c, c.ClipPolygonY([]vg.Point{
		{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y},
	}))
}
