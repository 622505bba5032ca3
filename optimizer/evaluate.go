package optimizer

import (
	"math"

	"github.com/inferlb/inferlb/internal/ordered"
)

// Evaluator prices routings of one solution's admitted traffic: every
// (frontend, class) routes what the solution routes (Flow.RoutedPerS), by
// the solution's weights or by others set with Set. Cost is the latency
// part of the objective at the loads that result: network, TTFT and output
// tokens × TBOT per request, plus the outlier penalty charge; no stability
// and no shedding term, so two routings of the same traffic compare by
// what their requests wait. The control plane's deadband asks it what
// publishing new weights gains over keeping the published ones.
type Evaluator struct {
	m       *model
	p       *Problem
	routed  []float64 // per block
	block   map[[2]string]int
	arcOf   []map[string]int // per block: engine id → arc index
	invalid []bool           // per block: its weights name an engine it cannot use
}

// NewEvaluator compiles p (without its Last: no stability term) and starts
// from sol's routing. p must be the problem sol solved.
func NewEvaluator(p *Problem, sol *Solution) *Evaluator {
	q := *p
	q.Last = nil
	m := compile(&q)
	ev := &Evaluator{m: m, p: p, routed: make([]float64, len(m.blocks)), block: map[[2]string]int{},
		arcOf: make([]map[string]int, len(m.blocks)), invalid: make([]bool, len(m.blocks))}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		fe, cl := p.Frontends[b.i].ID, p.Classes[b.c].ID
		ev.block[[2]string{fe, cl}] = bi
		ev.arcOf[bi] = map[string]int{}
		for k := b.lo; k < b.hi; k++ {
			ev.arcOf[bi][p.Engines[m.arcs[k].j].ID] = k
		}
		if f := sol.Flow(fe, cl); f != nil {
			ev.routed[bi] = f.RoutedPerS
			w := make(map[string]float64, len(f.Weights))
			for _, x := range f.Weights {
				w[x.Engine] = x.Weight
			}
			ev.set(bi, w)
		}
	}
	return ev
}

// Set routes the (frontend, class)'s traffic by weights (shares over
// engine ids; normalized here). It reports whether the flow is known.
func (ev *Evaluator) Set(frontend, class string, weights map[string]float64) bool {
	bi, ok := ev.block[[2]string{frontend, class}]
	if ok {
		ev.set(bi, weights)
	}
	return ok
}

func (ev *Evaluator) set(bi int, weights map[string]float64) {
	b := &ev.m.blocks[bi]
	for k := b.lo; k < b.hi; k++ {
		ev.m.arcs[k].x = 0
	}
	// In key order: the same weights price the same, bit for bit, in
	// every run (replicas agree; TestStepIsDeterministic).
	ids := ordered.Keys(weights)
	sum := 0.0
	for _, id := range ids {
		if v := weights[id]; v > 0 {
			sum += v
		}
	}
	ev.invalid[bi] = false
	if !(sum > 0) {
		ev.invalid[bi] = ev.routed[bi] > 0
		return
	}
	for _, id := range ids {
		v := weights[id]
		if !(v > 0) {
			continue
		}
		k, ok := ev.arcOf[bi][id]
		if !ok {
			ev.invalid[bi] = true // an engine it cannot use (not eligible, no capacity)
			continue
		}
		ev.m.arcs[k].x = ev.routed[bi] * v / sum
	}
}

// Cost is the routing's latency cost in ms·req/s (+Inf if a flow's
// weights name an engine it cannot use).
func (ev *Evaluator) Cost() float64 {
	for _, bad := range ev.invalid {
		if bad {
			return math.Inf(1)
		}
	}
	m := ev.m
	m.loads()
	obj := 0.0
	for k := range m.arcs {
		obj += m.arcs[k].a * m.arcs[k].x
	}
	for j := range m.eng {
		obj += m.eng[j].cost(m.eng[j].y)
	}
	return obj
}

// Routed is the (frontend, class)'s routed rate (0 if unknown).
func (ev *Evaluator) Routed(frontend, class string) float64 {
	if bi, ok := ev.block[[2]string{frontend, class}]; ok {
		return ev.routed[bi]
	}
	return 0
}

// DefaultRemapFactor is the RemapFactor a Problem's 0 means: the share of
// keys weighted Maglev moves per unit of total-variation change.
const DefaultRemapFactor = defaultRemap
