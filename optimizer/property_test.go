package optimizer

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// checkSolution asserts what users of a Solution rely on: demand is
// conserved (routed + shed = demand), rates, weights and shed are
// non-negative, weights of a routed flow sum to 1, engines stay within their
// limit (up to the capacity tolerance, Tolerance/10 relative).
func checkSolution(t *testing.T, name string, p *Problem, sol *Solution) {
	t.Helper()
	if len(sol.Flows) != len(p.Frontends)*len(p.Classes) {
		t.Fatalf("%s: %d flows, want %d", name, len(sol.Flows), len(p.Frontends)*len(p.Classes))
	}
	for _, f := range sol.Flows {
		shed, sumW, routed := 0.0, 0.0, 0.0
		for _, s := range f.Shed {
			if s.RatePerS < 0 || s.Fraction < 0 || s.Fraction > 1+1e-9 {
				t.Errorf("%s: %s/%s shed %+v", name, f.Frontend, f.Class, s)
			}
			shed += s.RatePerS
		}
		for _, w := range f.Weights {
			if !(w.Weight > 0) || !(w.RatePerS > 0) {
				t.Errorf("%s: %s/%s weight %+v", name, f.Frontend, f.Class, w)
			}
			sumW += w.Weight
			routed += w.RatePerS
		}
		if d := math.Abs(routed + shed - f.DemandPerS); d > 1e-9*math.Max(1, f.DemandPerS) {
			t.Errorf("%s: %s/%s routed %g + shed %g ≠ demand %g", name, f.Frontend, f.Class, routed, shed, f.DemandPerS)
		}
		if routed > 0 && math.Abs(sumW-1) > 1e-12 {
			t.Errorf("%s: %s/%s weights sum to %.15g", name, f.Frontend, f.Class, sumW)
		}
	}
	for _, e := range sol.Engines {
		if e.LoadRPS < 0 || e.LoadRPS > e.LimitRPS*(1+1e-5)+1e-12 {
			t.Errorf("%s: engine %s load %g, limit %g", name, e.ID, e.LoadRPS, e.LimitRPS)
		}
	}
}

// TestProperties solves 200 random instances (1–6 frontends, 1–3 classes,
// 2–12 engines, 20%–150% load, with and without a last allocation) and
// checks every solution; on instances where every class may use every
// engine and the demand fits even at each flow's worst engine, nothing is
// shed.
func TestProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	fits := 0
	for n := 0; n < 200; n++ {
		o := genOpts{frontends: 1 + rng.IntN(6), classes: 1 + rng.IntN(3), engines: 2 + rng.IntN(11),
			load: 0.2 + 1.3*rng.Float64(), withLast: rng.IntN(2) == 0, stabilityMs: 50 * rng.Float64(), allEligible: rng.IntN(2) == 0}
		p := randomProblem(rng, o)
		sol, err := Solve(p, Options{})
		if err != nil {
			t.Fatalf("instance %d (%+v): %v", n, o, err)
		}
		checkSolution(t, "random", p, sol)
		if !o.allEligible {
			continue
		}
		// worst-case work of the demand against the total limit
		work, limit := 0.0, 0.0
		for j := range p.Engines {
			e := &p.Engines[j]
			limit += p.Headroom * e.Profile.CapacityRPS * e.ReadyReplicas * e.Health * (1 - e.Penalty)
		}
		for i := range p.Frontends {
			for c, cl := range p.Classes {
				rmax := 0.0
				for _, j := range cl.Eligible {
					pr := &p.Engines[j].Profile
					if e := &p.Engines[j]; e.ReadyReplicas*e.Health*(1-e.Penalty) > 0 {
						rmax = math.Max(rmax, pr.Ratio(Shape{PromptTokens: cl.PromptTokens, OutputTokens: cl.OutputTokens}))
					}
				}
				work += p.Demand[i][c].Total() * rmax
			}
		}
		if work > 0.97*limit {
			continue
		}
		fits++
		for _, f := range sol.Flows {
			for _, s := range f.Shed {
				if s.RatePerS > 1e-9*math.Max(1, f.DemandPerS) {
					t.Errorf("instance %d: demand fits (work %.4g ≤ limit %.4g) but %s/%s sheds %g req/s of %s",
						n, work, limit, f.Frontend, f.Class, s.RatePerS, s.Priority)
				}
			}
		}
	}
	t.Logf("%d instances where demand fits", fits)
	if fits < 20 {
		t.Errorf("only %d instances where demand fits; the generator drifted", fits)
	}
}

// TestShedLowestPriorityFirst: one engine, demand twice its limit, three
// priorities: the least important is shed entirely before the next loses
// anything, and the most important is not shed.
func TestShedLowestPriorityFirst(t *testing.T) {
	prof, _ := NewProfile(stepH100, 500, 200)
	limit := 0.8 * prof.CapacityRPS
	p := &Problem{
		Headroom:   0.8,
		Frontends:  []Frontend{{ID: "fe"}},
		Classes:    []Class{{ID: "c", PromptTokens: 500, OutputTokens: 200, Eligible: []int{0}}},
		Engines:    []Engine{{ID: "e", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}},
		Priorities: []Priority{{Name: "critical", ShedCost: 100}, {Name: "standard", ShedCost: 10}, {Name: "batch", ShedCost: 1}},
		Demand:     [][]Demand{{{RatePerS: []float64{0.5 * limit, 0.8 * limit, 0.7 * limit}}}},
		RTTMs:      [][]float64{{1}},
	}
	for _, m := range []Method{Fast, Reference} {
		sol, err := Solve(p, Options{Method: m, Tolerance: 1e-7})
		if err != nil {
			t.Fatal(err)
		}
		checkSolution(t, m.String(), p, sol)
		sh := sol.Flows[0].Shed
		// 2.0·limit demand, 1.0·limit routed: batch (0.7) all, standard 0.3 of 0.8
		if math.Abs(sh[2].Fraction-1) > 1e-6 || math.Abs(sh[1].RatePerS-0.3*limit) > 1e-4*limit || sh[0].RatePerS > 1e-9 {
			t.Errorf("%s: shed %+v, want batch 100%%, standard %.4g req/s, critical 0", m, sh, 0.3*limit)
		}
	}
}

// TestDeterministic: the same input gives the same output, bit for bit.
func TestDeterministic(t *testing.T) {
	p := fleetProblem(20, 100, true)
	a, err := Solve(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Solve(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatal("two solves of the same problem differ")
	}
}

// TestSentinelErrors: bad problems are refused with a sentinel error.
func TestSentinelErrors(t *testing.T) {
	base := func() *Problem { return fleetProblem(2, 4, false) }
	cases := []struct {
		name string
		edit func(p *Problem)
		want error
	}{
		{"negative demand", func(p *Problem) { p.Demand[0][0].RatePerS[0] = -1 }, ErrNegativeDemand},
		{"NaN demand", func(p *Problem) { p.Demand[0][0].RatePerS[0] = math.NaN() }, ErrNegativeDemand},
		{"no eligible engine", func(p *Problem) { p.Classes[0].Eligible = nil; p.Demand[0][0].RatePerS[0] = 1 }, ErrNoEligibleEngine},
		{"negative queue term", func(p *Problem) { p.Engines[0].Profile.TTFT.Queue = -1 }, ErrNonConvexProfile},
		{"negative linear term", func(p *Problem) { p.Engines[0].Profile.TBOT.Linear = -0.1 }, ErrNonConvexProfile},
		{"zero capacity", func(p *Problem) { p.Engines[0].Profile.CapacityRPS = 0 }, ErrNonConvexProfile},
		{"headroom 1", func(p *Problem) { p.Headroom = 1 }, ErrInvalidProblem},
		{"health > 1", func(p *Problem) { p.Engines[1].Health = 1.5 }, ErrInvalidProblem},
		{"max utilization 1", func(p *Problem) { p.Engines[1].MaxUtilization = 1 }, ErrInvalidProblem},
		{"negative max utilization", func(p *Problem) { p.Engines[1].MaxUtilization = -0.1 }, ErrInvalidProblem},
		{"NaN max utilization", func(p *Problem) { p.Engines[1].MaxUtilization = math.NaN() }, ErrInvalidProblem},
		{"duplicate engine", func(p *Problem) { p.Engines[1].ID = p.Engines[0].ID }, ErrInvalidProblem},
		{"ragged RTT", func(p *Problem) { p.RTTMs[0] = p.RTTMs[0][:1] }, ErrInvalidProblem},
		{"NaN last weight", func(p *Problem) { p.Last = lastWeight(p, math.NaN()) }, ErrInvalidProblem},
		{"negative last weight", func(p *Problem) { p.Last = lastWeight(p, -0.5) }, ErrInvalidProblem},
	}
	for _, c := range cases {
		p := base()
		c.edit(p)
		_, err := Solve(p, Options{})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// lastWeight is a previous allocation giving w to the first eligible engine
// of frontend 0's first class.
func lastWeight(p *Problem, w float64) *Allocation {
	eng := p.Engines[p.Classes[0].Eligible[0]].ID
	return &Allocation{Weights: map[string]map[string]map[string]float64{
		p.Frontends[0].ID: {p.Classes[0].ID: {eng: w}},
	}}
}

// TestBadOptions: options outside their documented range are refused with
// ErrInvalidProblem, not run with a NaN tolerance or a degenerate LP.
func TestBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Tolerance: math.NaN()},
		{Tolerance: -1e-3},
		{Tolerance: math.Inf(1)},
		{MaxSweeps: -1},
		{Method: Reference, Tangents: 1},
		{Method: Reference, Tangents: -2},
		{Method: Reference, MaxReferenceArcs: -1},
	} {
		if _, err := Solve(fleetProblem(2, 4, false), o); !errors.Is(err, ErrInvalidProblem) {
			t.Errorf("%+v: got %v, want ErrInvalidProblem", o, err)
		}
	}
	if _, err := Solve(fleetProblem(2, 4, false), Options{Method: Reference, Tangents: 2}); err != nil {
		t.Errorf("2 tangents: %v", err)
	}
}
