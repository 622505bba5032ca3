package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSpillOnlyWhenItPays is the spill-over rule, over random problems:
// one frontend, engines in its own region (1 ms) and in farther ones (5 to
// 400 ms), H100s and A100s, a class of random shape, demand from idle to
// past the near engines' capacity. The near engines alone are solved first
// (the class restricted to them); when they carry the whole demand below
// their limits, and one more request there (round trip + TTFT, its
// load-dependent part at the tail (Problem.TailFactor), + the delay it adds
// to the requests already there: the flow's price) costs less than
// the zero-load TTFT + round trip of every farther engine, then the full
// problem sends nothing farther. Where the near engines do not suffice,
// the far traffic must go to engines whose round trip + TTFT is what the
// near ones' price has reached (no engine is used above the flow's price).
//
// The test rules out charging TTFT + output × TBOT, which fails it on the
// first instance with spill: 200 decode steps each slowed by a bigger
// batch outweigh any round trip.
func TestSpillOnlyWhenItPays(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 7))
	held, spilled := 0, 0
	for n := 0; n < 300; n++ {
		step := []StepModel{stepH100, stepA100}
		ref := 100 + rng.Float64()*900
		out := 20 + rng.Float64()*400
		var engines []Engine
		var rtt []float64
		var near []int
		nNear, nFar := 1+rng.IntN(3), 1+rng.IntN(4)
		for j := 0; j < nNear+nFar; j++ {
			prof, err := NewProfile(step[rng.IntN(2)], ref, out)
			if err != nil {
				t.Fatal(err)
			}
			e := Engine{ID: string(rune('a' + j)), Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}
			engines = append(engines, e)
			if j < nNear {
				near = append(near, j)
				rtt = append(rtt, 1)
			} else {
				rtt = append(rtt, 5+rng.Float64()*395)
			}
		}
		shape := Shape{PromptTokens: 50 + rng.Float64()*3000, OutputTokens: 10 + rng.Float64()*500, CachedShare: rng.Float64() * 0.9}
		nearCap := 0.0
		for _, j := range near {
			nearCap += engines[j].Profile.Capacity(shape)
		}
		rate := nearCap * rng.Float64() * 1.2
		all := make([]int, len(engines))
		for j := range all {
			all[j] = j
		}
		mk := func(elig []int) *Problem {
			return &Problem{Headroom: 0.85, Priorities: []Priority{{Name: "p", ShedCost: 1}},
				Frontends: []Frontend{{ID: "fe"}},
				Classes: []Class{{ID: "c", PromptTokens: shape.PromptTokens, OutputTokens: shape.OutputTokens,
					CachedPromptShare: shape.CachedShare, Eligible: elig}},
				Engines: engines, Demand: [][]Demand{{{RatePerS: []float64{rate}}}}, RTTMs: [][]float64{rtt}}
		}
		nearSol, err := Solve(mk(near), Options{})
		if err != nil {
			t.Fatalf("instance %d, near engines alone: %v", n, err)
		}
		full, err := Solve(mk(all), Options{})
		if err != nil {
			t.Fatalf("instance %d: %v", n, err)
		}
		fn, ff := nearSol.Flows[0], full.Flows[0]
		// the cheapest farther route at zero load
		farMin := math.Inf(1)
		for j := nNear; j < len(engines); j++ {
			ttft, _ := engines[j].Profile.Latency(shape, 0)
			farMin = math.Min(farMin, rtt[j]+ttft)
		}
		// The near engines' price from their profiles (not the solver's):
		// round trip + TTFT at the solved load + the delay one more
		// request adds to those there, r·u·K'(u) with K the TTFT's
		// load-dependent part.
		fits := fn.Shed[0].RatePerS <= 1e-9*rate
		nearPrice := 0.0
		for _, w := range fn.Weights {
			var e *Engine
			for j := range engines {
				if engines[j].ID == w.Engine {
					e = &engines[j]
				}
			}
			u := w.Utilization
			if u > 0.85-1e-6 {
				fits = false
			}
			pr := &e.Profile
			ttft, _ := pr.Latency(shape, u)
			t0, _ := pr.Latency(shape, 0)
			tail := t0 + DefaultTailFactor*(ttft-t0)
			cong := DefaultTailFactor * pr.Ratio(shape) * u * (pr.TTFT.Linear + pr.TTFT.Queue/((1-u)*(1-u)))
			nearPrice = math.Max(nearPrice, w.NetworkMs+tail+cong)
		}
		farShare := 0.0
		for _, w := range ff.Weights {
			if w.NetworkMs > 1 {
				farShare += w.Weight
			}
		}
		// 1% of the price: the fast solver's tolerance
		if fits && nearPrice < farMin*(1-0.01) {
			held++
			if farShare > 1e-3 {
				t.Errorf("instance %d: the near engines serve %.2f req/s at a price of %.1f ms, below the farther engines' %.1f ms (round trip + zero-load TTFT), yet %.1f%% leaves the region",
					n, rate, nearPrice, farMin, 100*farShare)
			}
			continue
		}
		if farShare > 1e-3 {
			spilled++
		}
		// What goes farther goes only where round trip + TTFT (tail) at
		// the solved load is within the flow's price.
		for _, w := range ff.Weights {
			if w.Weight > 1e-3 && w.NetworkMs+w.LatencyMs > ff.PriceMs*(1+0.01)+1e-6 {
				t.Errorf("instance %d: %s gets %.3f at round trip + TTFT %.1f ms, above the flow's price %.1f ms",
					n, w.Engine, w.Weight, w.NetworkMs+w.LatencyMs, ff.PriceMs)
			}
		}
	}
	t.Logf("%d instances held near, %d spilled", held, spilled)
	if held < 50 || spilled < 20 {
		t.Errorf("the generator reached the rule %d times and spill %d times; want both often", held, spilled)
	}
}
