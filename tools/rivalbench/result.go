package rivalbench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is a whole bench: every workload's runs and medians.
type Result struct {
	Started          time.Time        `json:"started"`
	Regions          []string         `json:"regions"`
	EnginesPerRegion int              `json:"engines_per_region"`
	Runs             int              `json:"runs"`
	DurationS        float64          `json:"duration_s"`
	Load             float64          `json:"load"`
	Seed             uint64           `json:"seed"`
	Routers          []string         `json:"routers"`
	Workloads        []WorkloadResult `json:"workloads"`
}

// WorkloadResult is one workload's runs and, per router, each figure's
// median over them.
type WorkloadResult struct {
	Name  string `json:"name"`
	About string `json:"about"`
	// IdealHit is the median over the runs of the share of prompt tokens
	// an unbounded prefix cache would serve (Mooncake only).
	IdealHit float64                 `json:"ideal_hit,omitempty"`
	Median   map[string]RouterResult `json:"median"`
	Runs     []RunResult             `json:"runs"`
}

// RunResult is one run: every router's figures.
type RunResult struct {
	Run      int                     `json:"run"`
	IdealHit float64                 `json:"ideal_hit,omitempty"`
	Routers  map[string]RouterResult `json:"routers"`
}

// RouterResult is what one router's clients and engines saw. Latencies are
// the clients' (milliseconds); ratios are to round robin's in the same run
// (or of the medians), when round robin ran.
type RouterResult struct {
	Sent   int `json:"sent"`
	OK     int `json:"ok"`
	Shed   int `json:"shed_429"`
	Errors int `json:"errors"`
	// ErrorKinds counts the clients' error messages (up to 20 kinds).
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// HitRate is the engines' prefix-cache hits over queries (their
	// vllm:prefix_cache_* counters) during the traffic.
	HitRate float64 `json:"hit_rate"`
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP90 float64 `json:"ttft_p90_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
	// TTFT ratios to round robin's (0: no round robin in the run).
	TTFTP50Ratio float64 `json:"ttft_p50_vs_round_robin,omitempty"`
	TTFTP99Ratio float64 `json:"ttft_p99_vs_round_robin,omitempty"`
	TPOTP50      float64 `json:"tpot_p50_ms"`
	E2EP50       float64 `json:"e2e_p50_ms"`
	// RequestsPerS and OutputTokensPerS count completed requests.
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// FollowUps are the follow-up turns whose previous turn was served;
	// HistoryMisses those of them that the engine served with less of the
	// previous turn's prompt cached than that prompt (one block of slack):
	// they reached an engine without their conversation's history.
	FollowUps        int     `json:"follow_ups"`
	HistoryMisses    int     `json:"history_misses"`
	HistoryMissShare float64 `json:"history_miss_share"`
	// EngineRequests are the requests each engine completed; LoadSpread is
	// the busiest engine's over the mean (1: even).
	EngineRequests []float64 `json:"engine_requests,omitempty"`
	LoadSpread     float64   `json:"load_spread"`
	// CrossRegionShare is the share of requests an engine outside their
	// source region served (with several regions).
	CrossRegionShare float64 `json:"cross_region_share"`
	// CPUSeconds is the CPU the router's processes used during the traffic
	// (inferlb: its Envoys, ext_proc services and control plane).
	CPUSeconds float64 `json:"cpu_s"`
	// Regions break the clients' figures down by their region (with
	// several regions).
	Regions map[string]RegionResult `json:"regions,omitempty"`

	ttfts []float64 // sorted, for the charts
}

// RegionResult is what one region's clients saw.
type RegionResult struct {
	Sent             int     `json:"sent"`
	OK               int     `json:"ok"`
	Shed             int     `json:"shed_429"`
	TTFTP50          float64 `json:"ttft_p50_ms"`
	TTFTP99          float64 `json:"ttft_p99_ms"`
	HistoryMissShare float64 `json:"history_miss_share"`
}

// summarize sets the per-run ratios to round robin and the medians.
func (w *WorkloadResult) summarize(routers []Router) {
	for _, run := range w.Runs {
		rr, ok := run.Routers[RoundRobin.ID]
		if !ok {
			continue
		}
		for id, r := range run.Routers {
			r.TTFTP50Ratio, r.TTFTP99Ratio = ratio(r.TTFTP50, rr.TTFTP50), ratio(r.TTFTP99, rr.TTFTP99)
			run.Routers[id] = r
		}
	}
	var ideals []float64
	for _, run := range w.Runs {
		ideals = append(ideals, run.IdealHit)
	}
	w.IdealHit = median(ideals)
	w.Median = map[string]RouterResult{}
	for _, r := range routers {
		var rs []RouterResult
		for _, run := range w.Runs {
			if x, ok := run.Routers[r.ID]; ok {
				rs = append(rs, x)
			}
		}
		if len(rs) == 0 {
			continue
		}
		med := func(f func(RouterResult) float64) float64 {
			xs := make([]float64, len(rs))
			for i, x := range rs {
				xs[i] = f(x)
			}
			return median(xs)
		}
		medInt := func(f func(RouterResult) int) int {
			return int(math.Round(med(func(x RouterResult) float64 { return float64(f(x)) })))
		}
		m := RouterResult{
			Sent: medInt(func(x RouterResult) int { return x.Sent }), OK: medInt(func(x RouterResult) int { return x.OK }),
			Shed: medInt(func(x RouterResult) int { return x.Shed }), Errors: medInt(func(x RouterResult) int { return x.Errors }),
			HitRate:          med(func(x RouterResult) float64 { return x.HitRate }),
			TTFTP50:          med(func(x RouterResult) float64 { return x.TTFTP50 }),
			TTFTP90:          med(func(x RouterResult) float64 { return x.TTFTP90 }),
			TTFTP99:          med(func(x RouterResult) float64 { return x.TTFTP99 }),
			TTFTP50Ratio:     med(func(x RouterResult) float64 { return x.TTFTP50Ratio }),
			TTFTP99Ratio:     med(func(x RouterResult) float64 { return x.TTFTP99Ratio }),
			TPOTP50:          med(func(x RouterResult) float64 { return x.TPOTP50 }),
			E2EP50:           med(func(x RouterResult) float64 { return x.E2EP50 }),
			RequestsPerS:     med(func(x RouterResult) float64 { return x.RequestsPerS }),
			OutputTokensPerS: med(func(x RouterResult) float64 { return x.OutputTokensPerS }),
			FollowUps:        medInt(func(x RouterResult) int { return x.FollowUps }),
			HistoryMisses:    medInt(func(x RouterResult) int { return x.HistoryMisses }),
			HistoryMissShare: med(func(x RouterResult) float64 { return x.HistoryMissShare }),
			LoadSpread:       med(func(x RouterResult) float64 { return x.LoadSpread }),
			CrossRegionShare: med(func(x RouterResult) float64 { return x.CrossRegionShare }),
			CPUSeconds:       med(func(x RouterResult) float64 { return x.CPUSeconds }),
		}
		for _, reg := range regionsOf(rs) {
			var xs []RegionResult
			for _, x := range rs {
				if v, ok := x.Regions[reg]; ok {
					xs = append(xs, v)
				}
			}
			rmed := func(f func(RegionResult) float64) float64 {
				v := make([]float64, len(xs))
				for i, x := range xs {
					v[i] = f(x)
				}
				return median(v)
			}
			if m.Regions == nil {
				m.Regions = map[string]RegionResult{}
			}
			m.Regions[reg] = RegionResult{
				Sent:             int(math.Round(rmed(func(x RegionResult) float64 { return float64(x.Sent) }))),
				OK:               int(math.Round(rmed(func(x RegionResult) float64 { return float64(x.OK) }))),
				Shed:             int(math.Round(rmed(func(x RegionResult) float64 { return float64(x.Shed) }))),
				TTFTP50:          rmed(func(x RegionResult) float64 { return x.TTFTP50 }),
				TTFTP99:          rmed(func(x RegionResult) float64 { return x.TTFTP99 }),
				HistoryMissShare: rmed(func(x RegionResult) float64 { return x.HistoryMissShare }),
			}
		}
		// The chart pools every run's requests.
		for _, x := range rs {
			m.ttfts = append(m.ttfts, x.ttfts...)
		}
		slices.Sort(m.ttfts)
		w.Median[r.ID] = m
	}
}

// regionsOf lists the regions any of rs has, sorted.
func regionsOf(rs []RouterResult) []string {
	var out []string
	for _, r := range rs {
		for reg := range r.Regions {
			if !slices.Contains(out, reg) {
				out = append(out, reg)
			}
		}
	}
	slices.Sort(out)
	return out
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// median of xs (NaN for none); xs is reordered.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// WriteTable prints one table per workload: each router's medians.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "inferlb bench rivals: %s, %d engines per region per router, %d run(s) of %gs, load %g, seed %d (medians)\n",
		strings.Join(r.Regions, "+"), r.EnginesPerRegion, r.Runs, r.DurationS, r.Load, r.Seed)
	for _, wl := range r.Workloads {
		fmt.Fprintf(w, "\n%s: %s\n", wl.Name, wl.About)
		if wl.IdealHit > 0 {
			fmt.Fprintf(w, "(an unbounded prefix cache would serve %.3f of the prompt tokens sent)\n", wl.IdealHit)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "router\thit\tTTFT p50\tp90\tp99\tp50/RR\tp99/RR\tTPOT p50\treq/s\tok\t429\terr\thistory miss\tspread\tCPU s\t")
		for _, id := range r.Routers {
			m, ok := wl.Median[id]
			if !ok {
				continue
			}
			miss := "-"
			if m.FollowUps > 0 {
				miss = fmt.Sprintf("%.1f%%", 100*m.HistoryMissShare)
			}
			fmt.Fprintf(tw, "%s\t%.3f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%.1f\t%.2f\t%d\t%d\t%d\t%s\t%.2f\t%.1f\t\n",
				id, m.HitRate, m.TTFTP50, m.TTFTP90, m.TTFTP99, fmtRatio(m.TTFTP50Ratio), fmtRatio(m.TTFTP99Ratio),
				m.TPOTP50, m.RequestsPerS, m.OK, m.Shed, m.Errors, miss, m.LoadSpread, m.CPUSeconds)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := writeRegionTable(w, r.Routers, wl); err != nil {
			return err
		}
	}
	return nil
}

// writeRegionTable prints, with several regions, each router's figures by
// the clients' region.
func writeRegionTable(w io.Writer, routers []string, wl WorkloadResult) error {
	var regions []string
	for _, m := range wl.Median {
		for reg := range m.Regions {
			if !slices.Contains(regions, reg) {
				regions = append(regions, reg)
			}
		}
	}
	if len(regions) < 2 {
		return nil
	}
	slices.Sort(regions)
	fmt.Fprintf(w, "by the clients' region (cross-region: the share of all requests an engine outside their region served):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "router\tcross-region\tregion\tsent\tok\t429\tTTFT p50\tp99\thistory miss\t")
	for _, id := range routers {
		m, ok := wl.Median[id]
		if !ok {
			continue
		}
		for k, reg := range regions {
			cross := ""
			if k == 0 {
				cross = fmt.Sprintf("%.1f%%", 100*m.CrossRegionShare)
			}
			x := m.Regions[reg]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.1f%%\t\n", id, cross, reg, x.Sent, x.OK, x.Shed, x.TTFTP50, x.TTFTP99, 100*x.HistoryMissShare)
		}
	}
	return tw.Flush()
}

// WriteFiles writes the result as JSON, the tables as text and each
// workload's TTFT CDF chart into dir.
func (r *Result) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var tb strings.Builder
	if err := r.WriteTable(&tb); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "table.txt"), []byte(tb.String()), 0o644); err != nil {
		return err
	}
	for _, wl := range r.Workloads {
		if err := ttftCDFChart(filepath.Join(dir, wl.Name+"-ttft-cdf.png"), wl, r.Routers); err != nil {
			return fmt.Errorf("%s chart: %w", wl.Name, err)
		}
	}
	return nil
}
