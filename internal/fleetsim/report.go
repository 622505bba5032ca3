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
	"sort"
	"strings"
	"sync"
	"time"
)

// ScenarioResult is every policy's figures on one scenario.
type ScenarioResult struct {
	Scenario    string  `json:"scenario"`
	Description string  `json:"description"`
	Fleet       string  `json:"fleet"`
	Seed        uint64  `json:"seed"`
	DurationS   float64 `json:"duration_s"`
	WarmupS     float64 `json:"warmup_s"`
	SLOTTFTMs   float64 `json:"slo_ttft_ms"`
	SLOTPOTMs   float64 `json:"slo_tpot_ms"`
	// BestHitRate is the prefix-cache hit rate of the pooled reference
	// cache (the fleet's whole KV capacity as one LRU cache; see docs/sim.md).
	BestHitRate float64         `json:"best_achievable_hit_rate"`
	Policies    []*PolicyResult `json:"policies"`
}

// RunOptions configure RunScenario.
type RunOptions struct {
	// Policies to run (default: the scenario's).
	Policies []string
	Seed     uint64
	DataDir  string
	// Parallel runs that many policies at once (default 1).
	Parallel int
	// Progress is told each policy's share done (may be called from
	// several goroutines, not at once for one policy).
	Progress func(policy string, done float64)
}

// RunScenario runs every policy on the scenario, each in its own
// simulation of the same work.
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
	par := max(opt.Parallel, 1)
	sem := make(chan struct{}, par)
	errs := make([]error, len(pols))
	best := make([]float64, len(pols))
	var wg sync.WaitGroup
	for i, p := range pols {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o := Options{Scenario: sc, Policy: p, Seed: opt.Seed, DataDir: opt.DataDir}
			if opt.Progress != nil {
				o.Progress = func(d float64) { opt.Progress(p, d) }
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
				errs[i] = fmt.Errorf("%s / %s: %w", sc.Name, p, err)
				return
			}
			r.WallSeconds = math.Round(time.Since(t0).Seconds()*100) / 100
			if s.rec.oracleQ > 0 {
				best[i] = s.rec.oracleHit / s.rec.oracleQ
			}
			out.Policies[i] = r
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	sort.Float64s(best)
	out.BestHitRate = best[len(best)/2]
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
	fmt.Fprintf(w, "| policy | TTFT p50 | p90 | p99 | TPOT p50 | p99 | SLO goodput | hit rate | shed | failed | retries | churn/cycle | remapped | max/mean load |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %d | %.3f | %.1f%% | %.2f |\n",
			p.Policy, msStr(p.TTFT.P50), msStr(p.TTFT.P90), msStr(p.TTFT.P99), msStr(p.TPOTP50Ms), msStr(p.TPOTP99Ms),
			100*p.Goodput, 100*p.HitRate, p.ShedPct, pct(p.Failed, p.Arrived), p.Retries, p.ChurnPerCycle, 100*p.Remapped, p.MaxMeanLoad)
	}
	fmt.Fprintf(w, "\nBest achievable hit rate with the fleet's caches pooled (reference): %.1f%%.\n", 100*r.BestHitRate)
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
	return writeCharts(d, r)
}

// WriteSummary writes dir/README.md: every scenario's table, with links to
// its charts, and dir/results.json with every figure.
func WriteSummary(dir string, rs []*ScenarioResult, header string) error {
	var b strings.Builder
	b.WriteString(header)
	for _, r := range rs {
		fmt.Fprintf(&b, "\n## %s\n\n%s. Fleet `%s`, %.0f s of traffic (the first %.0f s left out), seed %d, SLO TTFT ≤ %.0f ms and TPOT ≤ %.0f ms.\n\n",
			r.Scenario, strings.TrimSuffix(r.Description, "."), r.Fleet, r.DurationS, r.WarmupS, r.Seed, r.SLOTTFTMs, r.SLOTPOTMs)
		WriteTable(&b, r)
		fmt.Fprintf(&b, "\n![TTFT CDF](%[1]s/ttft_cdf.png) ![p99 over time](%[1]s/p99_over_time.png)\n![inferlb weights](%[1]s/weights_inferlb.png) ![old controller weights](%[1]s/weights_old_controller.png)\n![engine load](%[1]s/utilization.png)\n", r.Scenario)
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
