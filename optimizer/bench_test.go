package optimizer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// fleetProblem is a fleet-scale instance shaped like a fleet spec: 10
// regions with round trips per region pair, frontends and engines spread
// over them, H100 and A100 engines of two models with random replicas,
// readiness, health and penalties, four classes (two per model, one of them
// restricted to five regions), 70% load. With warm set it carries the last
// allocation of the same fleet and a demand 1% different: the steady-state
// control loop.
func fleetProblem(frontends, engines int, warm bool) *Problem {
	return fleetProblemWith(frontends, engines, warm, nil)
}

// fleetProblemWith is fleetProblem with set applied before the warm start's
// solve (so that the last allocation is the same problem's).
func fleetProblemWith(frontends, engines int, warm bool, set func(*Problem)) *Problem {
	rng := rand.New(rand.NewPCG(7, uint64(engines)))
	const regions = 10
	rtt := make([][]float64, regions)
	for a := range rtt {
		rtt[a] = make([]float64, regions)
	}
	for a := 0; a < regions; a++ {
		rtt[a][a] = 1
		for b := a + 1; b < regions; b++ {
			v := 20 + 140*rng.Float64()
			rtt[a][b], rtt[b][a] = v, v
		}
	}
	prof := map[bool]Profile{}
	for _, h := range []bool{true, false} {
		sm := stepA100
		if h {
			sm = stepH100
		}
		pr, err := NewProfile(sm, 500, 200)
		if err != nil {
			panic(err)
		}
		prof[h] = pr
	}
	p := &Problem{Headroom: 0.85, StabilityMs: 20, Priorities: []Priority{{Name: "high", ShedCost: 10}, {Name: "low", ShedCost: 1}}}
	eReg := make([]int, engines)
	model := make([]int, engines)
	totalCap := [2]float64{}
	for j := 0; j < engines; j++ {
		eReg[j] = rng.IntN(regions)
		model[j] = rng.IntN(2)
		e := Engine{ID: fmt.Sprintf("e%d", j), Profile: prof[rng.IntN(2) == 0], Replicas: float64(1 + rng.IntN(4)), Health: 1}
		e.ReadyReplicas = e.Replicas
		if rng.IntN(10) == 0 {
			e.ReadyReplicas--
		}
		if rng.IntN(10) == 0 {
			e.Health = 0.5 + 0.5*rng.Float64()
		}
		if rng.IntN(20) == 0 {
			e.Penalty = 0.3 * rng.Float64()
		}
		totalCap[model[j]] += e.Profile.CapacityRPS * e.ReadyReplicas * e.Health * (1 - e.Penalty) * p.Headroom
		p.Engines = append(p.Engines, e)
	}
	shapes := [][2]float64{{800, 150}, {3000, 300}, {400, 400}, {1500, 100}}
	for c := 0; c < 4; c++ {
		cl := Class{ID: fmt.Sprintf("c%d", c), PromptTokens: shapes[c][0], OutputTokens: shapes[c][1]}
		for j := range p.Engines {
			if model[j] == c%2 && (c != 3 || eReg[j] < 5) {
				cl.Eligible = append(cl.Eligible, j)
			}
		}
		p.Classes = append(p.Classes, cl)
	}
	p.Demand = make([][]Demand, frontends)
	p.RTTMs = make([][]float64, frontends)
	raw := [2]float64{}
	for i := 0; i < frontends; i++ {
		p.Frontends = append(p.Frontends, Frontend{ID: fmt.Sprintf("fe%d", i)})
		reg := rng.IntN(regions)
		p.RTTMs[i] = make([]float64, engines)
		for j := range p.Engines {
			p.RTTMs[i][j] = rtt[reg][eReg[j]]
		}
		p.Demand[i] = make([]Demand, 4)
		for c := range p.Demand[i] {
			d := Demand{RatePerS: []float64{rng.Float64(), rng.Float64()}}
			raw[c%2] += d.Total() // in class-0-shaped units, roughly
			p.Demand[i][c] = d
		}
	}
	for i := range p.Demand {
		for c := range p.Demand[i] {
			for k := range p.Demand[i][c].RatePerS {
				f := 0.7 * totalCap[c%2] / raw[c%2] * 0.5
				if c == 3 {
					f *= 0.4 // restricted to half the regions
				}
				p.Demand[i][c].RatePerS[k] *= f
			}
		}
	}
	if set != nil {
		set(p)
	}
	if warm {
		sol, _ := Solve(p, Options{})
		p.Last = sol.Allocation()
		for i := range p.Demand {
			for c := range p.Demand[i] {
				for k := range p.Demand[i][c].RatePerS {
					p.Demand[i][c].RatePerS[k] *= 1 + 0.01*(2*rng.Float64()-1)
				}
			}
		}
	}
	return p
}

func benchSolve(b *testing.B, frontends, engines int, warm bool) {
	benchSolveTol(b, frontends, engines, warm, 0)
}

func benchSolveTol(b *testing.B, frontends, engines int, warm bool, tol float64) {
	benchProblem(b, fleetProblem(frontends, engines, warm), tol)
}

func benchProblem(b *testing.B, p *Problem, tol float64) {
	b.ReportAllocs()
	b.ResetTimer()
	var sol *Solution
	var err error
	for i := 0; i < b.N; i++ {
		sol, err = Solve(p, Options{Tolerance: tol})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sol.Sweeps), "sweeps")
}

func BenchmarkSolve100x1000x4(b *testing.B)     { benchSolve(b, 100, 1000, false) }
func BenchmarkSolve100x1000x4Warm(b *testing.B) { benchSolve(b, 100, 1000, true) }

// The warm case with the engines' full limits (MarginalStretch 12, as the
// control plane solves): the fleet's long-prompt classes then overload some
// engines, and part of the demand is shed.
func BenchmarkSolve100x1000x4WarmFull(b *testing.B) {
	benchProblem(b, fleetProblemWith(100, 1000, true, func(p *Problem) { p.MarginalStretch = 12 }), 0)
}

// The same at a 0.1% certified gap instead of the default 0.01%.
func BenchmarkSolve100x1000x4Gap1e3(b *testing.B) { benchSolveTol(b, 100, 1000, false, 1e-3) }
func BenchmarkSolve1000x10000x4(b *testing.B)     { benchSolve(b, 1000, 10000, false) }
