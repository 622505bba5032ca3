package optimizer

import (
	"fmt"
	"math/rand/v2"
)

var (
	stepH100 = StepModel{PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055, MaxRunning: 256, KVCapacityTokens: 450000}
	stepA100 = StepModel{PrefillTokensPerS: 11000, OverheadMs: 15, DecodeStepMs: 13, DecodeStepPerSeqMs: 0.09, MaxRunning: 256, KVCapacityTokens: 450000}
)

type genOpts struct {
	frontends, classes, engines, regions int
	load                                 float64 // total demand / total limit
	withLast                             bool
	stabilityMs                          float64
	allEligible                          bool
}

// randomProblem builds a random instance: frontends and engines spread over
// regions with a random symmetric RTT matrix, H100/A100 engines with random
// health, readiness and penalties, classes of random shape and eligibility,
// two priorities, and demand scaled to the given load factor.
func randomProblem(rng *rand.Rand, o genOpts) *Problem {
	if o.regions == 0 {
		o.regions = 3
	}
	rtt := make([][]float64, o.regions)
	for a := range rtt {
		rtt[a] = make([]float64, o.regions)
	}
	for a := 0; a < o.regions; a++ {
		rtt[a][a] = 1
		for b := a + 1; b < o.regions; b++ {
			v := 20 + 140*rng.Float64()
			rtt[a][b], rtt[b][a] = v, v
		}
	}
	p := &Problem{Headroom: 0.7 + 0.25*rng.Float64(), StabilityMs: o.stabilityMs,
		Priorities: []Priority{{Name: "high", ShedCost: 10}, {Name: "low", ShedCost: 1}}}
	fReg := make([]int, o.frontends)
	for i := 0; i < o.frontends; i++ {
		p.Frontends = append(p.Frontends, Frontend{ID: fmt.Sprintf("fe%d", i)})
		fReg[i] = rng.IntN(o.regions)
	}
	eReg := make([]int, o.engines)
	totalCap := 0.0
	for j := 0; j < o.engines; j++ {
		eReg[j] = rng.IntN(o.regions)
		sm := stepH100
		if rng.IntN(2) == 0 {
			sm = stepA100
		}
		prof, err := NewProfile(sm, 500, 200)
		if err != nil {
			panic(err)
		}
		e := Engine{ID: fmt.Sprintf("e%d", j), Profile: prof, Replicas: float64(1 + rng.IntN(4)), Health: 1}
		e.ReadyReplicas = e.Replicas
		if rng.IntN(4) == 0 {
			e.ReadyReplicas = float64(rng.IntN(int(e.Replicas) + 1))
		}
		if rng.IntN(4) == 0 {
			e.Health = 0.3 + 0.7*rng.Float64()
		}
		if rng.IntN(5) == 0 {
			e.Penalty = 0.5 * rng.Float64()
		}
		p.Engines = append(p.Engines, e)
	}
	for c := 0; c < o.classes; c++ {
		cl := Class{ID: fmt.Sprintf("c%d", c), PromptTokens: 100 + 2000*rng.Float64(), OutputTokens: 20 + 400*rng.Float64()}
		for j := 0; j < o.engines; j++ {
			if c == 0 || o.allEligible || rng.IntN(3) > 0 {
				cl.Eligible = append(cl.Eligible, j)
			}
		}
		if len(cl.Eligible) == 0 {
			cl.Eligible = []int{rng.IntN(o.engines)}
		}
		p.Classes = append(p.Classes, cl)
	}
	for j := range p.Engines {
		e := &p.Engines[j]
		totalCap += e.Profile.CapacityRPS * e.ReadyReplicas * e.Health * (1 - e.Penalty) * p.Headroom
	}
	// raw demand, then scale
	raw := 0.0
	p.Demand = make([][]Demand, o.frontends)
	p.RTTMs = make([][]float64, o.frontends)
	for i := range p.Frontends {
		p.RTTMs[i] = make([]float64, o.engines)
		for j := range p.Engines {
			p.RTTMs[i][j] = rtt[fReg[i]][eReg[j]] * (0.9 + 0.2*rng.Float64())
		}
		p.Demand[i] = make([]Demand, o.classes)
		for c := range p.Classes {
			d := Demand{RatePerS: []float64{rng.Float64(), rng.Float64()}}
			if rng.IntN(5) == 0 {
				d.RatePerS[rng.IntN(2)] = 0
			}
			raw += d.Total()
			p.Demand[i][c] = d
		}
	}
	scale := o.load * totalCap / raw
	for i := range p.Demand {
		for c := range p.Demand[i] {
			for k := range p.Demand[i][c].RatePerS {
				p.Demand[i][c].RatePerS[k] *= scale
			}
		}
	}
	if o.withLast {
		p.Last = &Allocation{Weights: map[string]map[string]map[string]float64{}}
		for i, f := range p.Frontends {
			p.Last.Weights[f.ID] = map[string]map[string]float64{}
			for _, cl := range p.Classes {
				w := map[string]float64{}
				sum := 0.0
				for _, j := range cl.Eligible {
					v := rng.Float64()
					w[p.Engines[j].ID] = v
					sum += v
				}
				for k := range w {
					w[k] /= sum
				}
				p.Last.Weights[f.ID][cl.ID] = w
				_ = i
			}
		}
	}
	// Half the instances charge penalized engines per request (drawn last
	// so the rest of the instance is what it was without the term).
	if rng.IntN(2) == 0 {
		p.PenaltyCostMs = 500 * rng.Float64()
	}
	return p
}
