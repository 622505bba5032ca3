package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The evaluator prices the solution's own routing at the solution's
// objective (no stability term, nothing shed), any other routing of the
// same traffic at no less (the solution is optimal up to its tolerance),
// and a weight on an engine the flow cannot use at +Inf.
func TestEvaluator(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	checked := 0
	for n := range 5 {
		p := randomProblem(rng, genOpts{frontends: 3, classes: 2, engines: 8, load: 0.4, allEligible: true})
		sol, err := Solve(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		shed := 0.0
		for _, f := range sol.Flows {
			for _, s := range f.Shed {
				shed += s.RatePerS
			}
		}
		if shed > 0 {
			continue // the objective then holds shedding costs
		}
		checked++
		ev := NewEvaluator(p, sol)
		own := ev.Cost()
		if d := math.Abs(own-sol.Objective) / sol.Objective; d > 1e-6 {
			t.Errorf("instance %d: own routing costs %.3f, the solution's objective is %.3f", n, own, sol.Objective)
		}
		// Move a tenth of one flow to another engine: never cheaper (beyond
		// the solver's tolerance).
		f := sol.Flows[0]
		w := map[string]float64{}
		for _, x := range f.Weights {
			w[x.Engine] = x.Weight
		}
		for j := range p.Engines {
			id := p.Engines[j].ID
			alt := map[string]float64{}
			for k, v := range w {
				alt[k] = 0.9 * v
			}
			alt[id] += 0.1
			ev.Set(f.Frontend, f.Class, alt)
			if c := ev.Cost(); c < own*(1-1e-3) {
				t.Errorf("instance %d: moving 10%% of %s/%s to %s costs %.3f, less than the optimum %.3f", n, f.Frontend, f.Class, id, c, own)
			}
		}
		ev.Set(f.Frontend, f.Class, w)
		if c := ev.Cost(); math.Abs(c-own) > 1e-9*own {
			t.Errorf("instance %d: setting the solution's weights back costs %.6f, not %.6f", n, c, own)
		}
		if !ev.Set(f.Frontend, f.Class, map[string]float64{"no-such-engine": 1}) || !math.IsInf(ev.Cost(), 1) {
			t.Errorf("instance %d: a weight on an unknown engine costs %v, want +Inf", n, ev.Cost())
		}
		if ev.Set("no-such-frontend", f.Class, w) {
			t.Error("Set accepted an unknown frontend")
		}
	}
	if checked < 3 {
		t.Fatalf("only %d of 5 instances without shedding", checked)
	}
}
