package optimizer

import (
	"math"
	"testing"
)

// TestMaxUtilizationCapsEngine: an engine's own cap (the control plane's
// balance bound) holds below the headroom with either solver, the traffic
// it cannot take goes to its region peer (1 ms) before another region
// (30 ms), and engines of different caps are not pooled together.
func TestMaxUtilizationCapsEngine(t *testing.T) {
	for _, m := range []Method{Fast, Reference} {
		for _, tc := range []struct {
			name string
			cap  float64 // A0's cap; 0: none
		}{{"no cap", 0}, {"cap 0.2", 0.2}, {"cap 0.1", 0.1}, {"cap above headroom", 0.9}} {
			p := threeRegions(hockeyStick(), [3]float64{0.5, 0.1, 0.1})
			p.Engines[0].MaxUtilization = tc.cap
			sol, err := Solve(p, Options{Method: m})
			if err != nil {
				t.Fatalf("%v %s: %v", m, tc.name, err)
			}
			e := sol.Engines[0]
			limit := p.Headroom
			if tc.cap > 0 && tc.cap < limit {
				limit = tc.cap
			}
			if math.Abs(e.LimitRPS-limit*e.CapacityRPS) > 1e-9 {
				t.Errorf("%v %s: A0's limit %.3f req/s, want %.3f", m, tc.name, e.LimitRPS, limit*e.CapacityRPS)
			}
			if e.Utilization > limit*(1+1e-3) {
				t.Errorf("%v %s: A0 at utilization %.4f, over its cap %.3f", m, tc.name, e.Utilization, limit)
			}
			if s := regionShares(&sol.Flows[0]); s[0] < 0.999 {
				t.Errorf("%v %s: region A keeps %.3f of its traffic, want all (A1 has room)", m, tc.name, s[0])
			}
			if tc.cap == 0.1 && math.Abs(sol.Engines[1].Utilization-(0.5*2*0.6-0.1)) > 1e-2 {
				t.Errorf("%v %s: A1 at %.3f, want the rest of A's load (%.3f)", m, tc.name, sol.Engines[1].Utilization, 0.5*2*0.6-0.1)
			}
		}
	}
}
