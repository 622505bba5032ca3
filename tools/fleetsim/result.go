package fleetsim

import (
	"math"
	"sort"
	"strconv"
)

// PolicyResult is one policy's figures on one scenario, over the requests
// that arrived after the warm-up.
type PolicyResult struct {
	Policy string `json:"policy"`
	// Counts: Arrived = Served + Shed + Failed + Rejected (checked).
	Arrived  int `json:"arrived"`
	Served   int `json:"served"`
	Shed     int `json:"shed"`
	Failed   int `json:"failed"`
	Rejected int `json:"rejected"`
	// TTFT (client side: network included) and TPOT of served requests.
	TTFT      Quantiles `json:"ttft"`
	TPOTP50Ms float64   `json:"tpot_p50_ms"`
	TPOTP99Ms float64   `json:"tpot_p99_ms"`
	// Goodput is the share of arrived requests served within the SLO
	// (TTFT and TPOT); GoodputPerS the rate of such requests.
	Goodput     float64 `json:"slo_goodput"`
	GoodputPerS float64 `json:"slo_goodput_per_s"`
	// HitRate is cached prompt tokens / prompt tokens of served requests.
	HitRate float64 `json:"prefix_hit_rate"`
	// CrossRegionPct is the share of the served requests (%) that an
	// engine outside their frontend's region served: what paid a
	// round trip between regions.
	CrossRegionPct float64 `json:"cross_region_pct"`
	ShedPct        float64 `json:"shed_pct"`
	// ShedPctByPriority is, per priority the workload gives its requests,
	// the share of its arrivals shed (%).
	ShedPctByPriority map[string]float64 `json:"shed_pct_by_priority,omitempty"`
	// Retries is the number of retries Envoy made; RetriedPct the share of
	// requests that needed one.
	Retries    int     `json:"retries"`
	RetriedPct float64 `json:"retried_pct"`
	// ChurnPerCycle is the mean total-variation distance between
	// consecutive published weights (per frontend and class); Cycles the
	// control cycles run.
	ChurnPerCycle float64 `json:"weight_churn_per_cycle"`
	Cycles        int     `json:"cycles"`
	// Remapped is the share of follow-up turns served by another engine
	// than the conversation's previous turn.
	Remapped float64 `json:"conversations_remapped"`
	// MaxMeanLoad is the busiest engine's mean in-flight requests over the
	// mean of all engines (1 = perfectly even).
	MaxMeanLoad float64 `json:"max_mean_engine_load"`
	// MaxMeanUtil is the same ratio of utilizations: each engine's work
	// over its capacity (EngineFigures.Utilization). With mixed GPUs this
	// is the balance figure: a latency-minimizing allocation should give
	// an H100 more requests than an A100, not more of its capacity.
	MaxMeanUtil float64 `json:"max_mean_engine_utilization"`
	// Engines are the per-engine figures, in the fleet's engine order.
	Engines     []EngineFigures `json:"engines"`
	WallSeconds float64         `json:"wall_seconds"`
	// BySeed has each seed's headline figures when the others are medians
	// over several seeds.
	BySeed []SeedFigures `json:"by_seed,omitempty"`
	Events []mark        `json:"events,omitempty"`
	Notes  []string      `json:"notes,omitempty"`

	// Series for the charts (not in the JSON).
	series *series
}

// EngineFigures are one engine's figures over the measured requests it
// served.
type EngineFigures struct {
	ID     string `json:"id"`
	GPU    string `json:"gpu"`
	Region string `json:"region"`
	Served int    `json:"served"`
	// TTFT at the client of the requests it served.
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	HitRate   float64 `json:"prefix_hit_rate"`
	// RemappedIn is the number of follow-up turns it served whose previous
	// turn another engine served (cold caches it took).
	RemappedIn int `json:"remapped_in"`
	// Load is its mean in-flight requests (running, waiting, in overhead).
	Load float64 `json:"load"`
	// Utilization is its work over its capacity: uncached prompt tokens and
	// generated tokens of the requests it served, priced by the control
	// plane's work model of its profile (optimizer.Profile's per-token
	// costs), per second of the measured span and per replica.
	Utilization float64 `json:"utilization"`
}

// series are the time series of one run.
type series struct {
	ttft      []float64 // sorted TTFTs (s) of measured served requests
	p99T      []float64
	p99       []float64 // p99 TTFT (s) per window
	weightsT  []float64
	weights   []map[string]float64
	samples   []float64
	load      [][]float32
	engineIDs []string
}

// p99Window is the width of the p99-over-time windows.
const p99Window = 10.0

func (s *Sim) result() (*PolicyResult, error) {
	r := s.rec
	res := &PolicyResult{Policy: s.opt.Policy, Cycles: r.cycles, Notes: r.notesText(), Events: r.marks}
	perTTFT := make([][]float64, len(s.engines))
	perPrompt, perCached := make([]float64, len(s.engines)), make([]float64, len(s.engines))
	perRemap := make([]int, len(s.engines))
	var ttft, tpot []float64
	var prompt, cached float64
	good, follow, moved := 0, 0, 0
	warm := s.sc.Warmup.Seconds()
	wins := map[int]*win{}
	prioArrived, prioShed := map[int8]int{}, map[int8]int{}
	for _, rec := range r.recs {
		if float64(rec.arrival) < warm {
			continue
		}
		res.Arrived++
		if rec.prio >= 0 {
			prioArrived[rec.prio]++
			if rec.out == outcomeShed {
				prioShed[rec.prio]++
			}
		}
		res.Retries += int(rec.retries)
		if rec.retries > 0 {
			res.RetriedPct++
		}
		switch rec.out {
		case outcomeServed:
			res.Served++
			if rec.far {
				res.CrossRegionPct++
			}
			t := float64(rec.ttft)
			ttft = append(ttft, t)
			if rec.tpot > 0 {
				tpot = append(tpot, float64(rec.tpot))
			}
			prompt += float64(rec.prompt)
			cached += float64(rec.cached)
			if j := rec.engine; j >= 0 {
				perTTFT[j] = append(perTTFT[j], t)
				perPrompt[j] += float64(rec.prompt)
				perCached[j] += float64(rec.cached)
				if rec.remap == 1 {
					perRemap[j]++
				}
			}
			if t <= s.sc.SLO.TTFT.Seconds() && float64(rec.tpot) <= s.sc.SLO.TPOT.Seconds() {
				good++
			}
			if rec.remap >= 0 {
				follow++
				moved += int(rec.remap)
			}
			k := int(float64(rec.arrival) / p99Window)
			w := wins[k]
			if w == nil {
				w = &win{}
				wins[k] = w
			}
			w.xs = append(w.xs, t)
		case outcomeShed:
			res.Shed++
		case outcomeFailed:
			res.Failed++
		case outcomeRejected:
			res.Rejected++
		}
	}
	if res.Arrived != res.Served+res.Shed+res.Failed+res.Rejected {
		return nil, errConservation(res)
	}
	// Every arrival must have ended (the simulator drains): conservation
	// over the whole run, warm-up included.
	if r.nArrived != len(r.recs) {
		return nil, errConservation(res)
	}
	q := quantilesOf(ms(ttft))
	res.TTFT = q
	tq := quantilesOf(ms(tpot))
	res.TPOTP50Ms, res.TPOTP99Ms = tq.P50, tq.P99
	if res.Arrived > 0 {
		res.Goodput = float64(good) / float64(res.Arrived)
		res.ShedPct = 100 * float64(res.Shed) / float64(res.Arrived)
		res.RetriedPct = 100 * res.RetriedPct / float64(res.Arrived)
	}
	if res.Served > 0 {
		res.CrossRegionPct = 100 * res.CrossRegionPct / float64(res.Served)
	}
	for i, n := range prioArrived {
		if res.ShedPctByPriority == nil {
			res.ShedPctByPriority = map[string]float64{}
		}
		res.ShedPctByPriority[s.spec.Priorities[i].Name] = pct(prioShed[i], n)
	}
	if span := (s.sc.Duration - s.sc.Warmup).Seconds(); span > 0 {
		res.GoodputPerS = float64(good) / span
	}
	if prompt > 0 {
		res.HitRate = cached / prompt
	}
	if follow > 0 {
		res.Remapped = float64(moved) / float64(follow)
	}
	if r.churnN > 0 {
		// Rounded: the published weights' last bits vary with the order
		// of float sums inside the control plane (map order), which moves
		// nothing but this figure's trailing digits.
		res.ChurnPerCycle = math.Round(r.churnSum/float64(r.churnN)*1e6) / 1e6
	}
	var load, util []float64
	res.Engines, load, util = s.engineFigures(perTTFT, perPrompt, perCached, perRemap)
	res.MaxMeanLoad, res.MaxMeanUtil = maxOverMean(load), maxOverMean(util)
	if !s.opt.NoSeries {
		res.series = s.resultSeries(ttft, wins)
	}
	return res, nil
}

// engineFigures are each engine's figures from its served requests' TTFTs,
// prompt and cached tokens and remaps, and the recorder's load and work;
// load and util are the engines' mean in-flight and utilization.
func (s *Sim) engineFigures(perTTFT [][]float64, perPrompt, perCached []float64, perRemap []int) (figs []EngineFigures, load, util []float64) {
	r := s.rec
	span := (s.sc.Duration - s.sc.Warmup).Seconds()
	load, util = make([]float64, len(s.engines)), make([]float64, len(s.engines))
	for j, e := range s.engines {
		if r.loadN > 0 {
			load[j] = r.loadSum[j] / float64(r.loadN)
		}
		if span > 0 {
			util[j] = r.work[j] / span / float64(max(e.spec.Replicas, 1))
		}
		ef := EngineFigures{ID: e.spec.ID, GPU: e.spec.GPU, Region: e.spec.Region, Served: len(perTTFT[j]), RemappedIn: perRemap[j],
			Load: round3(load[j]), Utilization: round3(util[j])}
		if len(perTTFT[j]) > 0 { // else 0, with Served 0
			sort.Float64s(perTTFT[j])
			ef.TTFTP50Ms = round3(1000 * quantile(perTTFT[j], 0.5))
			ef.TTFTP99Ms = round3(1000 * quantile(perTTFT[j], 0.99))
		}
		if perPrompt[j] > 0 {
			ef.HitRate = round3(perCached[j] / perPrompt[j])
		}
		figs = append(figs, ef)
	}
	return figs, load, util
}

// win holds the TTFTs of the served requests that arrived in one p99
// window.
type win struct{ xs []float64 }

// resultSeries is the run's time series: the TTFTs, the p99 per window, the
// published weights and the load samples.
func (s *Sim) resultSeries(ttft []float64, wins map[int]*win) *series {
	r := s.rec
	sr := &series{ttft: ttft, weightsT: r.weightsT, weights: r.weights, samples: r.samples, load: r.load}
	sort.Float64s(sr.ttft)
	keys := make([]int, 0, len(wins))
	for k := range wins {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	for _, k := range keys {
		xs := wins[k].xs
		sort.Float64s(xs)
		sr.p99T = append(sr.p99T, (float64(k)+0.5)*p99Window)
		sr.p99 = append(sr.p99, quantile(xs, 0.99))
	}
	for _, e := range s.spec.Engines {
		sr.engineIDs = append(sr.engineIDs, e.ID)
	}
	return sr
}

// maxOverMean is the largest value over the mean (0 when the mean is 0).
func maxOverMean(xs []float64) float64 {
	mx, sum := 0.0, 0.0
	for _, v := range xs {
		mx = math.Max(mx, v)
		sum += v
	}
	if len(xs) == 0 || sum <= 0 {
		return 0
	}
	return mx / (sum / float64(len(xs)))
}

func ms(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * 1000
	}
	return out
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

type conservationError struct{ r *PolicyResult }

func (e conservationError) Error() string {
	return "fleetsim: conservation violated: arrived " + itoa(e.r.Arrived) + " ≠ served " + itoa(e.r.Served) +
		" + shed " + itoa(e.r.Shed) + " + failed " + itoa(e.r.Failed) + " + rejected " + itoa(e.r.Rejected)
}

func errConservation(r *PolicyResult) error { return conservationError{r} }

func itoa(n int) string { return strconv.Itoa(n) }
