package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
)

// ScenarioResult is every policy's figures on one scenario.
type ScenarioResult struct {
	Scenario    string `json:"scenario"`
	Description string `json:"description"`
	Fleet       string `json:"fleet"`
	Seed        uint64 `json:"seed"`
	// Seeds are the seeds the figures are medians of (absent: one run,
	// Seed's).
	Seeds     []uint64 `json:"seeds,omitempty"`
	DurationS float64  `json:"duration_s"`
	WarmupS   float64  `json:"warmup_s"`
	SLOTTFTMs float64  `json:"slo_ttft_ms"`
	SLOTPOTMs float64  `json:"slo_tpot_ms"`
	// BestHitRate is the prefix-cache hit rate of the pooled reference
	// cache (the fleet's whole KV capacity as one LRU cache; see docs/sim.md).
	BestHitRate float64 `json:"best_achievable_hit_rate"`
	// BestRegionalHitRate is the same with each region's caches pooled
	// apart, fed only the requests from that region: the best a router
	// that keeps every request in its region can do.
	BestRegionalHitRate float64         `json:"best_regional_hit_rate"`
	Policies            []*PolicyResult `json:"policies"`
	// StrongestRival is the rival policy (any but inferlb and random_key)
	// with the lowest TTFT p99, then least shed (regional.go); a
	// comparison counts only against it.
	StrongestRival string `json:"strongest_rival,omitempty"`
	// StrongerVariant names, for each rival run both globally and per
	// region, the stronger deployment.
	StrongerVariant []string `json:"stronger_variant,omitempty"`
}

// RunOptions configure RunScenario.
type RunOptions struct {
	// Policies to run (default: the scenario's).
	Policies []string
	Seed     uint64
	// Seeds overrides the scenario's number of seeds when not 0.
	Seeds   int
	DataDir string
	// Parallel runs that many simulations at once (default 1).
	Parallel int
	// Progress is told each policy's share done (may be called from
	// several goroutines, not at once for one policy).
	Progress func(policy string, done float64)
	// BalanceFactor is Options.BalanceFactor for every run.
	BalanceFactor *float64
	// PrefillPlacement, IdlePlacement and CachePlacement are Options' for
	// every run.
	PrefillPlacement, IdlePlacement, CachePlacement bool
}

// RunScenario runs every policy on the scenario, each in its own
// simulation of the same work, once per seed; with several seeds every
// figure is the median over them (seeds.go).
func RunScenario(ctx context.Context, sc *Scenario, opt RunOptions) (*ScenarioResult, error) {
	pols := opt.Policies
	if len(pols) == 0 {
		pols = sc.Policies
	}
	out := &ScenarioResult{Scenario: sc.Name, Description: sc.Description, Fleet: sc.FleetPath, Seed: sc.Seed,
		DurationS: sc.Duration.Seconds(), WarmupS: sc.Warmup.Seconds(),
		SLOTTFTMs: ms1(sc.SLO.TTFT), SLOTPOTMs: ms1(sc.SLO.TPOT), Policies: make([]*PolicyResult, len(pols))}
	if opt.Seed != 0 {
		out.Seed = opt.Seed
	}
	n := sc.Seeds
	if opt.Seeds != 0 {
		n = opt.Seeds
	}
	if n < 1 || n > MaxSeeds {
		return nil, fmt.Errorf("fleetsim: %d seeds, want 1 to %d", n, MaxSeeds)
	}
	for k := range n {
		out.Seeds = append(out.Seeds, out.Seed+uint64(k))
	}
	if n == 1 {
		out.Seeds = nil
	}
	par := max(opt.Parallel, 1)
	sem := make(chan struct{}, par)
	errs := make([]error, len(pols)*n)
	best := make([]float64, len(pols)*n)
	bestReg := make([]float64, len(pols)*n)
	runs := make([]*PolicyResult, len(pols)*n)
	var (
		progMu sync.Mutex
		prog   = make([]float64, len(pols)*n)
	)
	var wg sync.WaitGroup
	for i, p := range pols {
		for k := range n {
			at := i*n + k
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				// Seed 0 means the scenario's: the first seed is passed as
				// is, later ones explicitly.
				seed := opt.Seed
				if k > 0 {
					seed = out.Seed + uint64(k)
				}
				o := Options{Scenario: sc, Policy: p, Seed: seed, DataDir: opt.DataDir, BalanceFactor: opt.BalanceFactor,
					PrefillPlacement: opt.PrefillPlacement, IdlePlacement: opt.IdlePlacement, CachePlacement: opt.CachePlacement}
				if opt.Progress != nil {
					o.Progress = func(d float64) {
						progMu.Lock()
						defer progMu.Unlock()
						prog[at] = d
						sum := 0.0
						for _, v := range prog[i*n : i*n+n] {
							sum += v
						}
						opt.Progress(p, sum/float64(n))
					}
				}
				t0 := time.Now()
				s, err := newSim(ctx, o)
				if err == nil {
					err = s.loop()
				}
				var r *PolicyResult
				if err == nil {
					r, err = s.result()
				}
				if err != nil {
					if n > 1 {
						err = fmt.Errorf("seed %d: %w", out.Seed+uint64(k), err)
					}
					errs[at] = fmt.Errorf("%s / %s: %w", sc.Name, p, err)
					return
				}
				r.WallSeconds = math.Round(time.Since(t0).Seconds()*100) / 100
				if s.rec.oracleQ > 0 {
					best[at] = s.rec.oracleHit / s.rec.oracleQ
					bestReg[at] = s.rec.regionHit / s.rec.oracleQ
				}
				runs[at] = r
			}()
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for i := range pols {
		out.Policies[i] = medianResult(runs[i*n:i*n+n], out.Seeds)
	}
	out.BestHitRate = median(best)
	out.BestRegionalHitRate = median(bestReg)
	markStrongest(out)
	return out, nil
}

func ms1(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WithSimGC sets the garbage collector's targets for a simulation run and
// returns the function that restores them.
func WithSimGC() func() {
	old := debug.SetGCPercent(SimGCPercent)
	oldLimit := debug.SetMemoryLimit(SimMemoryLimit)
	return func() { debug.SetGCPercent(old); debug.SetMemoryLimit(oldLimit) }
}

// WriteJSON writes results as indented JSON (NaN latencies, of policies
// that served nothing, as null).
func WriteJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// MarshalJSON writes NaN quantiles as null.
func (q Quantiles) MarshalJSON() ([]byte, error) {
	f := func(v float64) any {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return math.Round(v*10) / 10
	}
	return json.Marshal(map[string]any{"p50_ms": f(q.P50), "p90_ms": f(q.P90), "p95_ms": f(q.P95), "p99_ms": f(q.P99)})
}

// WriteTable writes one scenario's table as Markdown: one row per policy.
func WriteTable(w io.Writer, r *ScenarioResult) {
	fmt.Fprintf(w, "| policy | TTFT p50 | p90 | p99 | TPOT p50 | p99 | SLO goodput | hit rate | cross-region | shed | failed | retries | churn/cycle | remapped | max/mean load | max/mean util |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %d | %.3f | %.1f%% | %.2f | %.2f |\n",
			p.Policy, msStr(p.TTFT.P50), msStr(p.TTFT.P90), msStr(p.TTFT.P99), msStr(p.TPOTP50Ms), msStr(p.TPOTP99Ms),
			100*p.Goodput, 100*p.HitRate, p.CrossRegionPct, p.ShedPct, pct(p.Failed, p.Arrived), p.Retries, p.ChurnPerCycle, 100*p.Remapped, p.MaxMeanLoad, p.MaxMeanUtil)
	}
	if len(r.Seeds) > 1 {
		fmt.Fprintf(w, "\nMedians over %d seeds (%d–%d); counts (retries) are totals.\n", len(r.Seeds), r.Seeds[0], r.Seeds[len(r.Seeds)-1])
	}
	fmt.Fprintf(w, "\nBest achievable hit rate with the fleet's caches pooled (reference): %.1f%%; with each region's pooled apart, fed its own requests: %.1f%%.\n",
		100*r.BestHitRate, 100*r.BestRegionalHitRate)
	if r.BestHitRate > 0 {
		var parts []string
		for _, p := range r.Policies {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", p.Policy, 100*p.HitRate/r.BestHitRate))
		}
		fmt.Fprintf(w, "\nShare of the pooled ideal's hit rate: %s.\n", strings.Join(parts, ", "))
	}
	writeStrongest(w, r)
	for _, p := range r.Policies {
		if p.Shed == 0 || len(p.ShedPctByPriority) == 0 {
			continue
		}
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(p.ShedPctByPriority)) {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", name, p.ShedPctByPriority[name]))
		}
		fmt.Fprintf(w, "\nShed by priority (%s): %s.\n", p.Policy, strings.Join(parts, ", "))
	}
	for _, p := range r.Policies {
		for _, n := range p.Notes {
			fmt.Fprintf(w, "\nNote (%s): %s\n", p.Policy, n)
		}
	}
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func msStr(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

// WriteOut writes a scenario's results.json and charts under dir/<name>.
func WriteOut(dir string, r *ScenarioResult) error {
	d := filepath.Join(dir, r.Scenario)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(d, "results.json"))
	if err != nil {
		return err
	}
	if err := WriteJSON(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	var b strings.Builder
	WriteEngineTables(&b, r)
	if err := os.WriteFile(filepath.Join(d, "engines.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return writeCharts(d, r)
}

// WriteEngineTables writes, per policy, one row per engine: requests
// served, TTFT p50/p99 of them, hit rate, follow-up turns it took cold,
// mean in-flight requests and utilization (work over capacity).
func WriteEngineTables(w io.Writer, r *ScenarioResult) {
	fmt.Fprintf(w, "# %s: per engine\n\nGenerated by `make sim-report`. Utilization is each engine's work (uncached prompt tokens and generated tokens, priced by the control plane's work model of its profile) over its capacity; load its mean in-flight requests.", r.Scenario)
	if len(r.Seeds) > 1 {
		fmt.Fprintf(w, " Medians over %d seeds; served and remapped-in are totals.", len(r.Seeds))
	}
	fmt.Fprintln(w)
	for _, p := range r.Policies {
		fmt.Fprintf(w, "\n## %s\n\n| engine | gpu | region | served | TTFT p50 | p99 | hit rate | remapped in | load | utilization |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n", p.Policy)
		for _, e := range p.Engines {
			fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %.1f%% | %d | %.2f | %.1f%% |\n", e.ID, e.GPU, e.Region, e.Served,
				msStr(e.TTFTP50Ms), msStr(e.TTFTP99Ms), 100*e.HitRate, e.RemappedIn, e.Load, 100*e.Utilization)
		}
	}
}

// WriteSummary writes dir/README.md: every scenario's table, with links to
// its charts, and dir/results.json with every figure.
func WriteSummary(dir string, rs []*ScenarioResult, header string) error {
	var b strings.Builder
	b.WriteString(header)
	for _, r := range rs {
		seeds := fmt.Sprintf("seed %d", r.Seed)
		if len(r.Seeds) > 1 {
			seeds = fmt.Sprintf("medians over seeds %d–%d", r.Seeds[0], r.Seeds[len(r.Seeds)-1])
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s. Fleet `%s`, %.0f s of traffic (the first %.0f s left out), %s, SLO TTFT ≤ %.0f ms and TPOT ≤ %.0f ms.\n\n",
			r.Scenario, strings.TrimSuffix(r.Description, "."), r.Fleet, r.DurationS, r.WarmupS, seeds, r.SLOTTFTMs, r.SLOTPOTMs)
		WriteTable(&b, r)
		fmt.Fprintf(&b, "\nPer engine: [%s/engines.md](%[1]s/engines.md).\n", r.Scenario)
		writeChartLinks(&b, dir, r.Scenario)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	defer f.Close()
	return WriteJSON(f, rs)
}

// charts are the chart files a scenario's folder may hold, with their
// captions, in the order the summary shows them.
var charts = []struct{ file, caption string }{
	{"ttft_cdf.png", "TTFT CDF"}, {"p99_over_time.png", "p99 over time"},
	{"weights_inferlb.png", "inferlb weights"}, {"weights_old_controller.png", "old controller weights"},
	{"utilization.png", "engine load"},
}

// writeChartLinks links the scenario's charts that were written: a chart
// with nothing to draw (no run of that policy) has no file, and a link to
// it would show a broken image.
func writeChartLinks(b *strings.Builder, dir, scenario string) {
	var links []string
	for _, c := range charts {
		if _, err := os.Stat(filepath.Join(dir, scenario, c.file)); err == nil {
			links = append(links, fmt.Sprintf("![%s](%s/%s)", c.caption, scenario, c.file))
		}
	}
	if len(links) > 0 {
		fmt.Fprintf(b, "\n%s\n", strings.Join(links, " "))
	}
}
