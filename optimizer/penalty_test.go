package optimizer

import (
	"math"
	"testing"
)

// An engine failing half its requests gets a large penalty from the control
// plane. At low load its capacity is not binding, so removing capacity alone
// would leave its share where it was; the per-request penalty cost moves its
// traffic to its healthy peer, and the explanation names the charge.
func TestPenaltyCostMovesTrafficAtLowLoad(t *testing.T) {
	prof, err := NewProfile(stepH100, 500, 200)
	if err != nil {
		t.Fatal(err)
	}
	build := func(costMs float64) *Problem {
		return &Problem{
			Headroom: 0.85, PenaltyCostMs: costMs,
			Priorities: []Priority{{Name: "p", ShedCost: 1}},
			Frontends:  []Frontend{{ID: "fe"}},
			Classes:    []Class{{ID: "c", PromptTokens: 500, OutputTokens: 200, Eligible: []int{0, 1}}},
			Engines: []Engine{
				{ID: "healthy", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1},
				{ID: "failing", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1, Penalty: 0.7},
			},
			RTTMs:  [][]float64{{1, 1}},
			Demand: [][]Demand{{{RatePerS: []float64{0.1 * prof.CapacityRPS}}}},
		}
	}
	weights := func(p *Problem) (map[string]float64, *Flow) {
		t.Helper()
		sol, err := Solve(p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		f := sol.Flow("fe", "c")
		w := map[string]float64{}
		for _, x := range f.Weights {
			w[x.Engine] = x.Weight
		}
		return w, f
	}
	off, _ := weights(build(0))
	on, flow := weights(build(1500))
	t.Logf("failing engine's weight: %.3f without the penalty cost, %.3f with 1500 ms", off["failing"], on["failing"])
	if off["failing"] < 0.2 {
		t.Errorf("without the cost the failing engine should keep a real share at 10%% load (capacity is not binding), got %.3f", off["failing"])
	}
	if on["failing"] > 0.03 {
		t.Errorf("with a 1500 ms penalty cost the failing engine keeps %.3f of the traffic", on["failing"])
	}
	if len(flow.Weights) != 1 || flow.Weights[0].Engine != "healthy" || flow.Weights[0].Explanation.OutlierCostMs != 0 {
		t.Errorf("want all traffic on the healthy engine with no outlier cost, got %+v", flow.Weights)
	}
}

func TestPenaltyCostRejectsBadValues(t *testing.T) {
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		p := &Problem{Headroom: 0.85, PenaltyCostMs: v}
		if err := p.Validate(); err == nil {
			t.Errorf("penalty cost %v accepted", v)
		}
	}
}
