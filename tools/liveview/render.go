package liveview

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
)

var nan = math.NaN()

// EngineRow is one engine's line on the screen.
type EngineRow struct {
	ID, Region, GPU string
	Up              bool
	Running         float64
	Waiting         float64
	KVUsage         float64
	// Interval figures (NaN without an earlier sample or with no traffic).
	TTFTMs        float64
	PrefixHitRate float64
	TokensPerS    float64
	// Weight[class][frontend] is the share of the weight that frontend's
	// Envoy holds for the engine in the class's cluster (priority 0,
	// healthy hosts); Traffic[class][frontend] the share of that cluster's
	// requests in the interval the engine got (NaN: no requests).
	Weight, Traffic map[string]map[string]float64
}

// Mark is an event of the run shown on the screen (the surge, a failure).
type Mark struct {
	At   time.Duration // since the start, in the engines' time
	Text string
}

// View is one screen.
type View struct {
	At        time.Time
	Interval  time.Duration
	Frontends []string // names, in fleet order
	Regions   map[string]string
	FrontUp   map[string]bool
	// FrontRPS is each frontend's requests per second to engines in the
	// interval (Envoy's counters, real time); FrontRetries its retries.
	FrontRPS, FrontRetries map[string]float64
	// Classes are the eligibility classes (Envoy clusters), in fleet order;
	// ClassRequests[class] the requests of every frontend's cluster of the
	// class in the interval.
	Classes       []string
	ClassRequests map[string]float64
	Engines       []EngineRow

	// Set by the caller (the demo): elapsed time and time scale, the run's
	// marks and the phase now, and what the clients saw per frontend.
	Elapsed    time.Duration
	TimeScale  float64
	Marks      []Mark
	Phase      string
	Priorities []string
	Clients    map[string]ClientStats
}

// Build computes a View from the current sample and the previous one (prev
// may be the zero Sample for the first screen).
func (c *Collector) Build(prev, cur Sample) View {
	v := View{At: cur.At, FrontUp: map[string]bool{}, FrontRPS: map[string]float64{}, FrontRetries: map[string]float64{},
		Regions: map[string]string{}, ClassRequests: map[string]float64{}}
	if !prev.At.IsZero() {
		v.Interval = cur.At.Sub(prev.At)
	}
	addrToID := map[string]string{}
	for _, e := range c.Fleet.Engines {
		addrToID[e.Address] = e.ID
		if u, ok := c.EngineURL[e.ID]; ok {
			addrToID[strings.TrimPrefix(u, "http://")] = e.ID
		}
	}
	for _, f := range c.Fleet.Frontends {
		if _, ok := c.EnvoyAdmin[f.Name]; ok {
			v.Frontends = append(v.Frontends, f.Name)
			v.Regions[f.Name] = f.Region
		}
	}
	// The control plane names a class's cluster inferlb_<class>; another
	// cluster of engines (a static test cluster) is a class of its own name.
	clusterClass := map[string]string{}
	for _, cl := range c.Fleet.Classes {
		clusterClass["inferlb_"+cl.Name] = cl.Name
		v.Classes = append(v.Classes, cl.Name)
	}
	classOf := func(cluster string) string {
		if cl, ok := clusterClass[cluster]; ok {
			return cl
		}
		clusterClass[cluster] = cluster
		v.Classes = append(v.Classes, cluster)
		return cluster
	}
	// weight[class][frontend][engine], traffic likewise (request counts).
	weight, traffic := shares{}, shares{}
	for _, fn := range v.Frontends {
		fs := cur.Frontends[fn]
		v.FrontUp[fn] = fs.Up
		var totalRq float64
		// Only clusters of engines count: Envoy's own clusters (the xDS
		// server, the ext_proc service) are not classes.
		for addr, hs := range fs.Hosts {
			id := addrToID[addr]
			if id == "" {
				continue
			}
			for _, h := range hs {
				cl := classOf(h.Cluster)
				if h.Priority == 0 && h.Healthy {
					weight.add(cl, fn, id, float64(h.Weight))
				}
				if p, ok := findHost(prev.Frontends[fn], addr, h.Cluster); ok && h.RqTotal >= p.RqTotal {
					traffic.add(cl, fn, id, h.RqTotal-p.RqTotal)
					totalRq += h.RqTotal - p.RqTotal
					v.ClassRequests[cl] += h.RqTotal - p.RqTotal
				}
			}
		}
		v.FrontRPS[fn], v.FrontRetries[fn] = nan, nan
		if v.Interval > 0 {
			v.FrontRPS[fn] = totalRq / v.Interval.Seconds()
			if p := prev.Frontends[fn]; p.Retries != nil && fs.Retries != nil {
				r := 0.0
				for cl, n := range fs.Retries {
					if _, ok := clusterClass[cl]; ok && n >= p.Retries[cl] {
						r += n - p.Retries[cl]
					}
				}
				v.FrontRetries[fn] = r
			}
		}
	}
	for _, e := range c.Fleet.Engines {
		v.Engines = append(v.Engines, v.engineRow(e, prev.Engines[e.ID], cur.Engines[e.ID], weight, traffic))
	}
	sort.SliceStable(v.Engines, func(i, j int) bool { return v.Engines[i].Region < v.Engines[j].Region })
	return v
}

// shares holds a figure per class, frontend and engine.
type shares map[string]map[string]map[string]float64

func (m shares) add(cl, fe, id string, x float64) {
	if m[cl] == nil {
		m[cl] = map[string]map[string]float64{}
	}
	if m[cl][fe] == nil {
		m[cl][fe] = map[string]float64{}
	}
	m[cl][fe][id] += x
}

// share is the engine's share of the frontend's total in the class (NaN
// when the total is 0).
func (m shares) share(cl, fe, id string) float64 {
	total := 0.0
	for _, x := range m[cl][fe] {
		total += x
	}
	if total == 0 {
		return nan
	}
	return m[cl][fe][id] / total
}

// engineRow is engine e's row: its gauges now, its interval figures from
// the two samples (p is the zero sample without an earlier one), and its
// shares of weight and traffic per class and frontend.
func (v *View) engineRow(e fleet.Engine, p, s EngineSample, weight, traffic shares) EngineRow {
	row := EngineRow{ID: e.ID, Region: e.Region, GPU: e.GPU, Up: s.Up,
		Running: s.Running, Waiting: s.Waiting, KVUsage: s.KVUsage,
		TTFTMs: nan, PrefixHitRate: nan, TokensPerS: nan,
		Weight: map[string]map[string]float64{}, Traffic: map[string]map[string]float64{}}
	if p.Up && s.Up {
		if dc := s.TTFTCount - p.TTFTCount; dc > 0 {
			row.TTFTMs = (s.TTFTSum - p.TTFTSum) / dc * 1000
		}
		if dq := s.PrefixQueries - p.PrefixQueries; dq > 0 {
			row.PrefixHitRate = (s.PrefixHits - p.PrefixHits) / dq
		}
		row.TokensPerS = rate(p.GenerationToks, s.GenerationToks, v.Interval)
	}
	for _, cl := range v.Classes {
		row.Weight[cl], row.Traffic[cl] = map[string]float64{}, map[string]float64{}
		for _, fn := range v.Frontends {
			w := weight.share(cl, fn, e.ID)
			if math.IsNaN(w) {
				w = 0
			}
			row.Weight[cl][fn] = w
			row.Traffic[cl][fn] = traffic.share(cl, fn, e.ID)
		}
	}
	return row
}

func findHost(fs FrontendSample, addr, cluster string) (HostSample, bool) {
	for _, h := range fs.Hosts[addr] {
		if h.Cluster == cluster {
			return h, true
		}
	}
	return HostSample{}, false
}

func pct(f float64) string {
	if math.IsNaN(f) {
		return "    -"
	}
	return fmt.Sprintf("%4.0f%%", f*100)
}

func num(f float64, format string, width int) string {
	if math.IsNaN(f) {
		return fmt.Sprintf("%*s", width, "-")
	}
	return fmt.Sprintf(format, f)
}

// bar draws f (0..1 of full) as a bar of width cells.
func bar(f, full float64, width int) string {
	if math.IsNaN(f) || f < 0 {
		f = 0
	}
	f /= full
	if f > 1 {
		f = 1
	}
	n := int(math.Round(f * float64(width)))
	return strings.Repeat("█", n) + strings.Repeat("·", width-n)
}

// kvScale is the KV bars' full scale: the smallest of 5%, 10%, 25%, 50%,
// 100% that holds every engine's KV use, so the bars move at low use too.
func kvScale(rows []EngineRow) float64 {
	top := 0.0
	for _, r := range rows {
		top = math.Max(top, r.KVUsage)
	}
	for _, s := range []float64{0.05, 0.1, 0.25, 0.5} {
		if top <= s {
			return s
		}
	}
	return 1
}

// fmtDur prints a duration as 1m05s / 42s.
func fmtDur(d time.Duration) string {
	d = d.Round(time.Second)
	if d >= time.Minute {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

// Render writes the view as plain text (no terminal control codes).
func Render(w io.Writer, v View) {
	fmt.Fprintf(w, "inferlb live view  %s", v.At.Format("15:04:05"))
	if v.Elapsed > 0 {
		fmt.Fprintf(w, "   elapsed %s", fmtDur(v.Elapsed))
	}
	scale := v.TimeScale
	if scale == 0 {
		scale = 1
	}
	fmt.Fprintf(w, "   every %s", v.Interval.Round(time.Millisecond))
	if scale != 1 {
		fmt.Fprintf(w, "   times in the engines' time (1 simulated s = %g real s)", scale)
	}
	fmt.Fprintln(w)
	if len(v.Marks) > 0 {
		var ms []string
		for _, m := range v.Marks {
			tick := "▷"
			if v.Elapsed >= m.At {
				tick = "▶"
			}
			ms = append(ms, fmt.Sprintf("%s %s %s", tick, fmtDur(m.At), m.Text))
		}
		fmt.Fprintf(w, "timeline: %s\n", strings.Join(ms, "   "))
	}
	if v.Phase != "" {
		fmt.Fprintf(w, "now: %s\n", v.Phase)
	}
	fmt.Fprintln(w)

	full := kvScale(v.Engines)
	kvHead := fmt.Sprintf("kv (bar 0–%.0f%%)", full*100)
	fmt.Fprintf(w, "%-21s %-8s %-5s %4s %4s %-16s %7s %5s %6s\n", "engine", "region", "gpu", "run", "wait", kvHead, "ttft ms", "hit", "tok/s")
	for _, r := range v.Engines {
		id := r.ID
		if !r.Up {
			id += " DOWN"
		}
		// The engines' /metrics are in real time (engine-sim's too); the
		// view is in their simulated time, as the clients' latencies.
		fmt.Fprintf(w, "%-21s %-8s %-5s %4.0f %4.0f %s %s %7s %s %6s\n",
			trunc(id, 21), trunc(r.Region, 8), trunc(r.GPU, 5), r.Running, r.Waiting,
			bar(r.KVUsage, full, 10), pct(r.KVUsage), num(r.TTFTMs/scale, "%7.0f", 7), pct(r.PrefixHitRate), num(r.TokensPerS*scale, "%6.0f", 6))
	}

	// Weights per class: only classes with traffic, else the first.
	var shown, quiet []string
	for _, cl := range v.Classes {
		if v.ClassRequests[cl] > 0 {
			shown = append(shown, cl)
		} else {
			quiet = append(quiet, cl)
		}
	}
	if len(shown) == 0 && len(v.Classes) > 0 {
		shown, quiet = v.Classes[:1], v.Classes[1:]
	}
	for _, cl := range shown {
		fmt.Fprintf(w, "\nclass %s: weight %% each frontend's Envoy holds → %% of its requests the engine got\n", cl)
		fmt.Fprintf(w, "%-16s", "")
		for _, fn := range v.Frontends {
			fmt.Fprintf(w, " %11s", trunc(v.Regions[fn], 11))
		}
		fmt.Fprintln(w)
		for _, r := range v.Engines {
			used := false
			for _, fn := range v.Frontends {
				t := r.Traffic[cl][fn]
				used = used || r.Weight[cl][fn] > 0 || (!math.IsNaN(t) && t > 0)
			}
			if !used {
				continue
			}
			fmt.Fprintf(w, "%-16s", trunc(r.ID, 16))
			for _, fn := range v.Frontends {
				fmt.Fprintf(w, " %s", wt(r.Weight[cl][fn], r.Traffic[cl][fn]))
			}
			fmt.Fprintln(w)
		}
	}
	if len(quiet) > 0 {
		fmt.Fprintf(w, "no traffic in the interval: class %s\n", strings.Join(quiet, ", "))
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-17s %-5s %6s %7s", "frontend", "envoy", "req/s", "retries")
	if v.Clients != nil {
		fmt.Fprintf(w, " %5s %5s %-20s %9s %9s", "ok", "err", "429 "+strings.Join(v.Priorities, "/"), "TTFT p50", "p90 ms")
	}
	fmt.Fprintln(w)
	for _, fn := range v.Frontends {
		state := "up"
		if !v.FrontUp[fn] {
			state = "DOWN"
		}
		fmt.Fprintf(w, "%-17s %-5s %6s %7s", trunc(fn, 17), state, num(v.FrontRPS[fn], "%6.1f", 6), num(v.FrontRetries[fn], "%7.0f", 7))
		if v.Clients != nil {
			c := v.Clients[fn]
			var rej []string
			for _, p := range v.Priorities {
				rej = append(rej, fmt.Sprint(c.Rejected[p]))
			}
			ttft50, ttft90 := c.TTFTP50, c.TTFTP90
			if c.Finished == 0 {
				ttft50, ttft90 = nan, nan
			}
			fmt.Fprintf(w, " %5d %5d %-20s %9s %9s", c.OK, c.Failed, "    "+strings.Join(rej, "/"), num(ttft50, "%9.0f", 9), num(ttft90, "%9.0f", 9))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "run/wait: requests running and queued in the engine · kv: KV-cache use · ttft: the engine's mean time to first token")
	fmt.Fprintln(w, "(vLLM metric) · hit: prefix-cache hit rate · tok/s: tokens generated · retries: Envoy's, in the interval")
	if v.Clients != nil {
		fmt.Fprintln(w, "ok/err/429/TTFT: what the clients of each frontend saw in the interval; client TTFT adds the network round trip,")
		fmt.Fprintln(w, "Envoy and ext_proc to the engine's; 429s are shed by ext_proc by priority when demand exceeds capacity")
	}
}

// wt prints weight → traffic as percentages in 11 cells, "·" for zero.
func wt(w, t float64) string {
	f := func(x float64) string {
		switch {
		case math.IsNaN(x):
			return "  -"
		case x < 0.005:
			return "  ·"
		}
		return fmt.Sprintf("%3.0f", x*100)
	}
	return fmt.Sprintf("%5s → %3s", f(w), f(t))
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
