package rivalbench

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// maxCDFPoints bounds one line of a CDF chart (the samples are thinned).
const maxCDFPoints = 300

// ttftCDFChart draws every router's TTFT distribution (all runs pooled) as
// a CDF on a log time axis, into a PNG at path.
func ttftCDFChart(path string, wl WorkloadResult, routers []string) error {
	p := plot.New()
	p.Title.Text = "TTFT, " + wl.Name
	p.X.Label.Text = "time to first token (ms, log scale)"
	p.Y.Label.Text = "share of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	p.Add(plotter.NewGrid())
	for i, id := range routers {
		m, ok := wl.Median[id]
		if !ok || len(m.ttfts) == 0 {
			continue
		}
		xs := m.ttfts
		n := len(xs)
		step := int(math.Max(1, math.Ceil(float64(n)/maxCDFPoints)))
		var pts plotter.XYs
		for k := 0; k < n; k += step {
			pts = append(pts, plotter.XY{X: math.Max(xs[k], 0.1), Y: float64(k+1) / float64(n)})
		}
		pts = append(pts, plotter.XY{X: math.Max(xs[n-1], 0.1), Y: 1})
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / 7)
		line.Width = vg.Points(1.5)
		if id == Inferlb.ID {
			line.Color, line.Width = color.Black, vg.Points(2.5)
		}
		p.Add(line)
		p.Legend.Add(id, line)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
