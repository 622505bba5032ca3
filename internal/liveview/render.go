package liveview

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

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
	// Per frontend name: share of that frontend's weight (in the clusters
	// where the engine is at priority 0) and of its requests in the interval.
	WeightShare  map[string]float64
	TrafficShare map[string]float64
}

// View is one screen.
type View struct {
	At        time.Time
	Interval  time.Duration
	Frontends []string // names, in fleet order
	FrontUp   map[string]bool
	FrontRPS  map[string]float64
	Engines   []EngineRow
}

// Build computes a View from the current sample and the previous one (prev
// may be the zero Sample for the first screen).
func (c *Collector) Build(prev, cur Sample) View {
	v := View{At: cur.At, FrontUp: map[string]bool{}, FrontRPS: map[string]float64{}}
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
		}
	}
	// Per frontend: weight per engine summed over priority-0 hosts of each
	// cluster, normalized per cluster and averaged over clusters; requests
	// per engine in the interval.
	weightShare := map[string]map[string]float64{}
	trafficShare := map[string]map[string]float64{}
	for _, fn := range v.Frontends {
		fs := cur.Frontends[fn]
		v.FrontUp[fn] = fs.Up
		// Only clusters of engines count: Envoy's own clusters (the xDS
		// server, the ext_proc service) would dilute the average.
		clusterTotal := map[string]float64{}
		for addr, hs := range fs.Hosts {
			if addrToID[addr] == "" {
				continue
			}
			for _, h := range hs {
				if h.Priority == 0 && h.Healthy {
					clusterTotal[h.Cluster] += float64(h.Weight)
				}
			}
		}
		ws, ts := map[string]float64{}, map[string]float64{}
		var totalRq float64
		for addr, hs := range fs.Hosts {
			id := addrToID[addr]
			if id == "" {
				continue
			}
			for _, h := range hs {
				if h.Priority == 0 && h.Healthy && clusterTotal[h.Cluster] > 0 {
					ws[id] += float64(h.Weight) / clusterTotal[h.Cluster]
				}
				if p, ok := findHost(prev.Frontends[fn], addr, h.Cluster); ok && h.RqTotal >= p.RqTotal {
					ts[id] += h.RqTotal - p.RqTotal
					totalRq += h.RqTotal - p.RqTotal
				}
			}
		}
		// Average the per-cluster shares over the clusters present.
		nc := float64(len(clusterTotal))
		for id := range ws {
			if nc > 0 {
				ws[id] /= nc
			}
		}
		for id := range ts {
			if totalRq > 0 {
				ts[id] /= totalRq
			} else {
				ts[id] = math.NaN()
			}
		}
		if v.Interval > 0 {
			v.FrontRPS[fn] = totalRq / v.Interval.Seconds()
		} else {
			v.FrontRPS[fn] = math.NaN()
		}
		weightShare[fn], trafficShare[fn] = ws, ts
	}
	for _, e := range c.Fleet.Engines {
		s := cur.Engines[e.ID]
		row := EngineRow{ID: e.ID, Region: e.Region, GPU: e.GPU, Up: s.Up,
			Running: s.Running, Waiting: s.Waiting, KVUsage: s.KVUsage,
			TTFTMs: math.NaN(), PrefixHitRate: math.NaN(), TokensPerS: math.NaN(),
			WeightShare: map[string]float64{}, TrafficShare: map[string]float64{}}
		if p, ok := prev.Engines[e.ID]; ok && p.Up && s.Up {
			if dc := s.TTFTCount - p.TTFTCount; dc > 0 {
				row.TTFTMs = (s.TTFTSum - p.TTFTSum) / dc * 1000
			}
			if dq := s.PrefixQueries - p.PrefixQueries; dq > 0 {
				row.PrefixHitRate = (s.PrefixHits - p.PrefixHits) / dq
			}
			row.TokensPerS = rate(p.GenerationToks, s.GenerationToks, v.Interval)
		}
		for _, fn := range v.Frontends {
			row.WeightShare[fn] = weightShare[fn][e.ID]
			if t, ok := trafficShare[fn][e.ID]; ok {
				row.TrafficShare[fn] = t
			} else {
				row.TrafficShare[fn] = math.NaN()
			}
		}
		v.Engines = append(v.Engines, row)
	}
	sort.SliceStable(v.Engines, func(i, j int) bool { return v.Engines[i].Region < v.Engines[j].Region })
	return v
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

// bar draws f (0..1) as a bar of width cells.
func bar(f float64, width int) string {
	if math.IsNaN(f) || f < 0 {
		f = 0
	}
	if f > 1 {
		f = 1
	}
	n := int(math.Round(f * float64(width)))
	return strings.Repeat("█", n) + strings.Repeat("·", width-n)
}

// Render writes the view as plain text (no terminal control codes).
func Render(w io.Writer, v View) {
	fmt.Fprintf(w, "inferlb live view  %s  (interval %s)\n\n", v.At.Format("15:04:05"), v.Interval.Round(time.Millisecond))
	fmt.Fprintf(w, "%-18s %-8s %-5s %4s %4s %-12s %8s %5s %7s", "engine", "region", "gpu", "run", "wait", "kv", "ttft ms", "hit", "tok/s")
	for _, fn := range v.Frontends {
		fmt.Fprintf(w, " │ %-17s", trunc(fn, 17))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-18s %-8s %-5s %4s %4s %-12s %8s %5s %7s", "", "", "", "", "", "", "", "", "")
	for range v.Frontends {
		fmt.Fprintf(w, " │ %-17s", "weight  traffic")
	}
	fmt.Fprintln(w)
	for _, r := range v.Engines {
		up := ""
		if !r.Up {
			up = " DOWN"
		}
		fmt.Fprintf(w, "%-18s %-8s %-5s %4.0f %4.0f %s%s %8s %s %7s",
			trunc(r.ID+up, 18), trunc(r.Region, 8), trunc(r.GPU, 5), r.Running, r.Waiting,
			bar(r.KVUsage, 8), pct(r.KVUsage), num(r.TTFTMs, "%8.0f", 8), pct(r.PrefixHitRate), num(r.TokensPerS, "%7.0f", 7))
		for _, fn := range v.Frontends {
			fmt.Fprintf(w, " │ %s  %s  ", pct(r.WeightShare[fn]), pct(r.TrafficShare[fn]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	for _, fn := range v.Frontends {
		state := "up"
		if !v.FrontUp[fn] {
			state = "ENVOY DOWN"
		}
		fmt.Fprintf(w, "%s: %s, %s req/s   ", fn, state, num(v.FrontRPS[fn], "%.1f", 1))
	}
	fmt.Fprintln(w)
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
