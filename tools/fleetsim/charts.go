package fleetsim

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// maxPoints bounds the points of one chart line (series are thinned).
const maxPoints = 400

// writeCharts draws a scenario's charts, each as PNG and SVG, into dir:
// ttft_cdf (every policy's TTFT distribution), p99_over_time (p99 TTFT per
// 10 s window), weights_inferlb and weights_old_controller (the first
// frontend's first class's published shares per engine over time: the old
// controller's oscillation shows there) and utilization (each policy's
// in-flight requests per engine over time).
func writeCharts(dir string, r *ScenarioResult) error {
	charts := []struct {
		name string
		draw func(*ScenarioResult) ([]*plot.Plot, int)
	}{
		{"ttft_cdf", ttftCDF},
		{"p99_over_time", p99OverTime},
		{"weights_inferlb", func(r *ScenarioResult) ([]*plot.Plot, int) { return weightsChart(r, PolicyInferlb) }},
		{"weights_old_controller", func(r *ScenarioResult) ([]*plot.Plot, int) { return weightsChart(r, PolicyOld) }},
		{"utilization", utilization},
	}
	for _, c := range charts {
		ps, cols := c.draw(r)
		if len(ps) == 0 {
			continue
		}
		for _, ext := range []string{"png", "svg"} {
			if err := saveTiles(filepath.Join(dir, c.name+"."+ext), ps, cols); err != nil {
				return fmt.Errorf("chart %s: %w", c.name, err)
			}
		}
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, name string, pts plotter.XYs, i int) {
	if len(pts) == 0 {
		return
	}
	l, err := plotter.NewLine(thin(pts))
	if err != nil {
		return
	}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
	l.Width = vg.Points(1.2)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
}

// thin keeps at most maxPoints points, evenly spaced, always the last.
func thin(pts plotter.XYs) plotter.XYs {
	if len(pts) <= maxPoints {
		return pts
	}
	out := make(plotter.XYs, 0, maxPoints+1)
	step := float64(len(pts)) / maxPoints
	for f := 0.0; int(f) < len(pts); f += step {
		out = append(out, pts[int(f)])
	}
	if out[len(out)-1] != pts[len(pts)-1] {
		out = append(out, pts[len(pts)-1])
	}
	return out
}

func ttftCDF(r *ScenarioResult) ([]*plot.Plot, int) {
	p := newPlot(r.Scenario+": TTFT distribution", "TTFT (ms, log)", "share of served requests")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Left = false
	p.Legend.Top = false
	lo := math.Inf(1)
	for i, pr := range r.Policies {
		sr := pr.series
		if sr == nil || len(sr.ttft) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, len(sr.ttft))
		for k, v := range sr.ttft {
			ms := math.Max(v*1000, 1)
			lo = math.Min(lo, ms)
			pts = append(pts, plotter.XY{X: ms, Y: float64(k+1) / float64(len(sr.ttft))})
		}
		addLine(p, pr.Policy, pts, i)
	}
	if !math.IsInf(lo, 0) {
		p.X.Min = math.Max(1, lo)
	}
	return []*plot.Plot{p}, 1
}

func p99OverTime(r *ScenarioResult) ([]*plot.Plot, int) {
	p := newPlot(r.Scenario+": p99 TTFT per 10 s window", "time since traffic start (s)", "p99 TTFT (ms, log)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	for i, pr := range r.Policies {
		sr := pr.series
		if sr == nil {
			continue
		}
		var pts plotter.XYs
		for k, t := range sr.p99T {
			pts = append(pts, plotter.XY{X: t, Y: math.Max(sr.p99[k]*1000, 1)})
		}
		addLine(p, pr.Policy, pts, i)
	}
	markEvents(p, r)
	return []*plot.Plot{p}, 1
}

// markEvents draws the faults' starts as vertical lines. Every policy runs
// the same timeline, so the first policy's events stand for all.
func markEvents(p *plot.Plot, r *ScenarioResult) {
	if len(r.Policies) == 0 {
		return
	}
	for _, m := range r.Policies[0].Events {
		l, err := plotter.NewLine(plotter.XYs{{X: m.At, Y: p.Y.Min + 1e-9}, {X: m.At, Y: math.Max(p.Y.Max, 1)}})
		if err == nil {
			l.Color = color.Gray{Y: 150}
			l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
			p.Add(l)
		}
	}
}

func weightsChart(r *ScenarioResult, policy string) ([]*plot.Plot, int) {
	var pr *PolicyResult
	for _, x := range r.Policies {
		if x.Policy == policy {
			pr = x
		}
	}
	if pr == nil || pr.series == nil || len(pr.series.weights) == 0 {
		return nil, 0
	}
	sr := pr.series
	p := newPlot(fmt.Sprintf("%s: %s's published shares (first frontend, first class)", r.Scenario, policy),
		"time since traffic start (s)", "share")
	ids := map[string]bool{}
	for _, w := range sr.weights {
		for id := range w {
			ids[id] = true
		}
	}
	keys := slices.Sorted(mapKeys(ids))
	for i, id := range keys {
		var pts plotter.XYs
		for k, t := range sr.weightsT {
			if t < -1 {
				continue
			}
			w := sr.weights[k]
			sum := 0.0
			for _, v := range w {
				sum += v
			}
			if sum > 0 {
				pts = append(pts, plotter.XY{X: t, Y: w[id] / sum})
			}
		}
		addLine(p, id, pts, i)
	}
	p.Y.Min = 0
	return []*plot.Plot{p}, 1
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func utilization(r *ScenarioResult) ([]*plot.Plot, int) {
	var ps []*plot.Plot
	ymax := 0.0
	for _, pr := range r.Policies {
		sr := pr.series
		if sr == nil || len(sr.load) == 0 {
			continue
		}
		p := newPlot(pr.Policy, "time (s)", "in flight per engine")
		p.Title.TextStyle.Font.Size = vg.Points(10)
		// The busiest engines first, at most 12 lines per panel.
		type eng struct {
			j   int
			sum float64
		}
		var es []eng
		for j := range sr.engineIDs {
			s := 0.0
			for _, row := range sr.load {
				s += float64(row[j])
			}
			es = append(es, eng{j, s})
		}
		sort.SliceStable(es, func(a, b int) bool { return es[a].sum > es[b].sum })
		for i, e := range es[:min(len(es), 12)] {
			var pts plotter.XYs
			for k, t := range sr.samples {
				v := float64(sr.load[k][e.j])
				ymax = math.Max(ymax, v)
				pts = append(pts, plotter.XY{X: t, Y: v})
			}
			addLine(p, "", pts, i)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		p.Y.Min, p.Y.Max = 0, math.Max(ymax, 1)
	}
	return ps, 3
}

// saveTiles draws plots in a grid of cols columns into a PNG or SVG file.
func saveTiles(path string, ps []*plot.Plot, cols int) error {
	cols = max(min(cols, len(ps)), 1)
	rows := (len(ps) + cols - 1) / cols
	w, h := vg.Points(720), vg.Points(400)
	if len(ps) > 1 {
		w, h = vg.Points(300*float64(cols)), vg.Points(220*float64(rows))
	}
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
		for j := range grid[i] {
			if k := i*cols + j; k < len(ps) {
				grid[i][j] = ps[k]
			}
		}
	}
	var c vg.CanvasSizer
	var out io.WriterTo
	switch filepath.Ext(path) {
	case ".png":
		img := vgimg.New(w, h)
		c = img
		out = vgimg.PngCanvas{Canvas: img}
	case ".svg":
		svg := vgsvg.New(w, h)
		c = svg
		out = svg
	default:
		return fmt.Errorf("unknown chart format %q", filepath.Ext(path))
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(6), PadY: vg.Points(6), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(4)}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := out.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
