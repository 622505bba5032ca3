package fleetsim

import (
	"slices"
	"sort"
	"strconv"
)

// SeedFigures are one seed's headline figures, kept next to the medians so
// that their spread shows.
type SeedFigures struct {
	Seed        uint64  `json:"seed"`
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	TTFTP99Ms   float64 `json:"ttft_p99_ms"`
	HitRate     float64 `json:"prefix_hit_rate"`
	Remapped    float64 `json:"conversations_remapped"`
	Churn       float64 `json:"weight_churn_per_cycle"`
	MaxMeanLoad float64 `json:"max_mean_engine_load"`
	MaxMeanUtil float64 `json:"max_mean_engine_utilization"`
}

// medianResult merges one policy's runs over seeds: counts (requests,
// retries, cycles) are totals, every other figure is the median of the
// runs' (each figure on its own: the median p99 need not come from the run
// of the median p50). The charts' series, the fault marks and the per-run
// identity come from the first seed's run. One run is returned as is.
func medianResult(runs []*PolicyResult, seeds []uint64) *PolicyResult {
	if len(runs) == 1 {
		return runs[0]
	}
	first := runs[0]
	out := &PolicyResult{Policy: first.Policy, Events: first.Events, series: first.series}
	m := func(get func(*PolicyResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = get(r)
		}
		return median(xs)
	}
	for k, r := range runs {
		out.Arrived += r.Arrived
		out.Served += r.Served
		out.Shed += r.Shed
		out.Failed += r.Failed
		out.Rejected += r.Rejected
		out.Retries += r.Retries
		out.Cycles += r.Cycles
		out.WallSeconds += r.WallSeconds
		for _, n := range r.Notes {
			out.Notes = append(out.Notes, "seed "+strconv.FormatUint(seeds[k], 10)+": "+n)
		}
		out.BySeed = append(out.BySeed, SeedFigures{Seed: seeds[k], TTFTP50Ms: r.TTFT.P50, TTFTP99Ms: r.TTFT.P99, HitRate: r.HitRate,
			Remapped: r.Remapped, Churn: r.ChurnPerCycle, MaxMeanLoad: r.MaxMeanLoad, MaxMeanUtil: r.MaxMeanUtil})
	}
	out.TTFT = Quantiles{P50: m(func(r *PolicyResult) float64 { return r.TTFT.P50 }), P90: m(func(r *PolicyResult) float64 { return r.TTFT.P90 }),
		P95: m(func(r *PolicyResult) float64 { return r.TTFT.P95 }), P99: m(func(r *PolicyResult) float64 { return r.TTFT.P99 })}
	out.TPOTP50Ms = m(func(r *PolicyResult) float64 { return r.TPOTP50Ms })
	out.TPOTP99Ms = m(func(r *PolicyResult) float64 { return r.TPOTP99Ms })
	out.Goodput = m(func(r *PolicyResult) float64 { return r.Goodput })
	out.GoodputPerS = m(func(r *PolicyResult) float64 { return r.GoodputPerS })
	out.HitRate = m(func(r *PolicyResult) float64 { return r.HitRate })
	out.ShedPct = m(func(r *PolicyResult) float64 { return r.ShedPct })
	for name := range first.ShedPctByPriority {
		if out.ShedPctByPriority == nil {
			out.ShedPctByPriority = map[string]float64{}
		}
		out.ShedPctByPriority[name] = m(func(r *PolicyResult) float64 { return r.ShedPctByPriority[name] })
	}
	out.RetriedPct = m(func(r *PolicyResult) float64 { return r.RetriedPct })
	out.CrossRegionPct = m(func(r *PolicyResult) float64 { return r.CrossRegionPct })
	out.ChurnPerCycle = m(func(r *PolicyResult) float64 { return r.ChurnPerCycle })
	out.Remapped = m(func(r *PolicyResult) float64 { return r.Remapped })
	out.MaxMeanLoad = m(func(r *PolicyResult) float64 { return r.MaxMeanLoad })
	out.MaxMeanUtil = m(func(r *PolicyResult) float64 { return r.MaxMeanUtil })
	for j, e := range first.Engines {
		me := func(get func(EngineFigures) float64) float64 {
			return m(func(r *PolicyResult) float64 { return get(r.Engines[j]) })
		}
		ef := EngineFigures{ID: e.ID, GPU: e.GPU, Region: e.Region}
		for _, r := range runs {
			ef.Served += r.Engines[j].Served
			ef.RemappedIn += r.Engines[j].RemappedIn
		}
		ef.TTFTP50Ms = me(func(e EngineFigures) float64 { return e.TTFTP50Ms })
		ef.TTFTP99Ms = me(func(e EngineFigures) float64 { return e.TTFTP99Ms })
		ef.HitRate = me(func(e EngineFigures) float64 { return e.HitRate })
		ef.Load = me(func(e EngineFigures) float64 { return e.Load })
		ef.Utilization = me(func(e EngineFigures) float64 { return e.Utilization })
		out.Engines = append(out.Engines, ef)
	}
	return out
}

// median of xs (the mean of the middle two for an even count); NaNs (the
// latencies of a run that served nothing) sort below every number.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
