package optimizer

import (
	"fmt"
	"math"
	"testing"
)

// hockeyStick is a profile whose congestion stays small up to the headroom
// used below (0.6): TTFT 50 ms + 5 ms·u/(1−u), TBOT 10 ms + 0.04 ms·u, 20
// req/s per replica for 500/50-token requests. Its marginal congestion at
// the limit is about 20 ms, less than any inter-region round trip.
func hockeyStick() Profile {
	p := Profile{CapacityRPS: 20, RefPromptTokens: 500, RefOutputTokens: 50,
		TTFT: Curve{Base: 50, Queue: 5}, TBOT: Curve{Base: 10, Linear: 0.04}}
	// work split: prompt 40%, output 60% of 50 ms
	p.PromptTokenSec = 0.4 * 0.05 / 500
	p.OutputTokenSec = 0.6 * 0.05 / 50
	return p
}

// threeRegions: regions A, B, C with 2 engines each and one frontend each;
// round trips A–B 30 ms, A–C 120 ms, B–C 100 ms; headroom 0.6. load[r] is
// region r's demand as a fraction of its own limit.
func threeRegions(prof Profile, load [3]float64) *Problem {
	rtt := [3][3]float64{{1, 30, 120}, {30, 1, 100}, {120, 100, 1}}
	// TailFactor 1: the geography is stated against the profile's mean
	// congestion (20 ms at the limit, below the 30 ms round trip).
	p := &Problem{Headroom: 0.6, TailFactor: 1, Priorities: []Priority{{Name: "p", ShedCost: 1}}}
	cl := Class{ID: "chat", PromptTokens: prof.RefPromptTokens, OutputTokens: prof.RefOutputTokens}
	for r := 0; r < 3; r++ {
		for k := 0; k < 2; k++ {
			cl.Eligible = append(cl.Eligible, len(p.Engines))
			p.Engines = append(p.Engines, Engine{ID: fmt.Sprintf("%c%d", 'A'+r, k), Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1})
		}
	}
	p.Classes = []Class{cl}
	limit := 2 * 0.6 * prof.CapacityRPS
	for r := 0; r < 3; r++ {
		p.Frontends = append(p.Frontends, Frontend{ID: fmt.Sprintf("fe-%c", 'A'+r)})
		row := make([]float64, 6)
		for j := range row {
			row[j] = rtt[r][j/2]
		}
		p.RTTMs = append(p.RTTMs, row)
		p.Demand = append(p.Demand, []Demand{{RatePerS: []float64{load[r] * limit}}})
	}
	return p
}

func regionShares(f *Flow) [3]float64 {
	var s [3]float64
	for _, w := range f.Weights {
		s[w.Engine[0]-'A'] += w.Weight
	}
	return s
}

// TestGeographyOverflowToNearest: with a queueing-dominated profile,
// region A's demand is 120% of its limit and B and C have spare capacity
// (30% load each): A fills its own engines, its overflow goes to B (30 ms
// away) and none to C (120 ms), and nothing is shed.
func TestGeographyOverflowToNearest(t *testing.T) {
	p := threeRegions(hockeyStick(), [3]float64{1.2, 0.3, 0.3})
	for _, m := range []Method{Fast, Reference} {
		sol, err := Solve(p, Options{Method: m})
		if err != nil {
			t.Fatal(err)
		}
		checkSolution(t, m.String(), p, sol)
		a := sol.Flow("fe-A", "chat")
		s := regionShares(a)
		t.Logf("%s: fe-A shares A %.4f B %.4f C %.4f", m, s[0], s[1], s[2])
		if a.RoutedPerS < a.DemandPerS*(1-1e-9) {
			t.Errorf("%s: sheds while B and C have room", m)
		}
		if math.Abs(s[0]-1/1.2) > 1e-4 {
			t.Errorf("%s: A keeps %.4f of its traffic, want %.4f (its engines full)", m, s[0], 1/1.2)
		}
		if s[2] > 1e-6 {
			t.Errorf("%s: %.4g of A's traffic goes to C (120 ms) although B (30 ms) has room", m, s[2])
		}
		for _, fe := range []string{"fe-B", "fe-C"} {
			f := sol.Flow(fe, "chat")
			if s := regionShares(f); s[0] > 1e-6 {
				t.Errorf("%s: %s sends %.4g to the saturated region A", m, fe, s[0])
			}
		}
	}
}

// TestGeographyStaysLocal: region A at 90% of its limit, B and C at 50%:
// with the queueing-dominated profile the congestion A would save by moving
// traffic is worth less than the 30 ms round trip, so nothing leaves A; and
// with the step-model (H100) profile at equal loads (60%) nothing leaves any
// region.
func TestGeographyStaysLocal(t *testing.T) {
	h100, _ := NewProfile(stepH100, 500, 200)
	for _, c := range []struct {
		prof Profile
		load [3]float64
	}{{hockeyStick(), [3]float64{0.9, 0.5, 0.5}}, {h100, [3]float64{0.6, 0.6, 0.6}}} {
		checkLocal(t, threeRegions(c.prof, c.load))
	}
}

func checkLocal(t *testing.T, p *Problem) {
	for _, m := range []Method{Fast, Reference} {
		sol, err := Solve(p, Options{Method: m})
		if err != nil {
			t.Fatal(err)
		}
		for r, fe := range []string{"fe-A", "fe-B", "fe-C"} {
			s := regionShares(sol.Flow(fe, "chat"))
			if math.Abs(s[r]-1) > 1e-6 {
				t.Errorf("%s: %s keeps only %.6f of its traffic local (%v)", m, fe, s[r], s)
			}
		}
	}
}
