package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// moved is the share of routed traffic whose engine changes between two
// allocations: Σ_flows demand × total-variation distance of the weights,
// over total demand. (Weighted Maglev remaps about RemapFactor times this
// share of conversation keys.)
func moved(p *Problem, last *Allocation, sol *Solution) float64 {
	num, den := 0.0, 0.0
	for _, f := range sol.Flows {
		if f.RoutedPerS == 0 {
			continue
		}
		w0 := last.Weights[f.Frontend][f.Class]
		tv := 0.0
		seen := map[string]bool{}
		for _, w := range f.Weights {
			tv += math.Abs(w.Weight - w0[w.Engine])
			seen[w.Engine] = true
		}
		for e, v := range w0 {
			if !seen[e] {
				tv += v
			}
		}
		num += f.RoutedPerS * tv / 2
		den += f.RoutedPerS
	}
	return num / den
}

// stabilityRun solves p, then p with every demand changed by up to ±1%,
// with and without the stability term, and returns the moved shares.
func stabilityRun(t *testing.T, p *Problem) (with, without float64) {
	t.Helper()
	sol0, err := Solve(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	last := sol0.Allocation()
	rng := rand.New(rand.NewPCG(11, 12))
	q := *p
	q.Last = last
	q.Demand = make([][]Demand, len(p.Demand))
	for i := range p.Demand {
		q.Demand[i] = make([]Demand, len(p.Demand[i]))
		for c, d := range p.Demand[i] {
			d.RatePerS = append([]float64(nil), d.RatePerS...)
			for k := range d.RatePerS {
				d.RatePerS[k] *= 1 + 0.01*(2*rng.Float64()-1)
			}
			q.Demand[i][c] = d
		}
	}
	q.StabilityMs = 20
	a, err := Solve(&q, Options{})
	if err != nil {
		t.Fatal(err)
	}
	q.StabilityMs = 0
	b, err := Solve(&q, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return moved(&q, last, a), moved(&q, last, b)
}

// TestStability: after a ±1% demand change, with the stability term (20 ms
// per moved request) at most 2% of the traffic changes engine; without it,
// more does. Measured on a pooled fleet (20 frontends, 100 engines, region
// round trips) and on random instances with per-engine round trips (no
// pooling).
func TestStability(t *testing.T) {
	w1, wo1 := stabilityRun(t, fleetProblem(20, 100, false))
	t.Logf("fleet 20×100×4: moved %.3f%% with stability, %.3f%% without", 100*w1, 100*wo1)
	rng := rand.New(rand.NewPCG(13, 14))
	p := randomProblem(rng, genOpts{frontends: 8, classes: 2, engines: 16, load: 0.35, allEligible: true})
	w2, wo2 := stabilityRun(t, p)
	t.Logf("random 8×16×2: moved %.3f%% with stability, %.3f%% without", 100*w2, 100*wo2)
	for _, c := range []struct{ with, without float64 }{{w1, wo1}, {w2, wo2}} {
		if c.with > 0.02 {
			t.Errorf("a 1%% demand change moved %.2f%% of traffic with the stability term, want ≤ 2%%", 100*c.with)
		}
		if c.without <= c.with {
			t.Errorf("without the stability term %.3f%% moved, not more than with it (%.3f%%)", 100*c.without, 100*c.with)
		}
	}
}
