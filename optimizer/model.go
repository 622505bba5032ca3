package optimizer

import (
	"math"
	"sort"
)

// model is a Problem compiled for the solvers: flows with demand become
// blocks, eligible engines with capacity become arcs.
type model struct {
	p       *Problem
	nPri    int
	blocks  []block
	arcs    []arc
	eng     []engModel
	shed    []float64 // charged cost per shed request, per priority
	shedOrd []int     // priorities, cheapest shed first
	sigma   float64   // stability cost per unit |x − x0|

	g1       []float64 // G'(Y) per engine at the current loads (cacheMarginals)
	eligible [][]bool  // class → engine, built by pool
	engIdx   map[string]int
	lastBuf  []float64
}

type block struct {
	i, c    int
	d       float64
	dp      []float64 // demand per priority
	s       []float64 // shed per priority (solution)
	lo, hi  int       // arcs[lo:hi]
	shape   Shape
	nu      float64 // demand dual
	hasLast bool
}

type arc struct {
	j     int
	a     float64 // RTT + zero-load latency of this flow's request, ms
	r     float64 // work relative to the engine's reference request
	x, x0 float64
	sigma float64 // stability charge per unit |x − x0| (0: no last allocation)
}

// engModel is the convex engine cost G(Y) = C·g(Y/C), g(u) = u·K(u),
// K(u) = lin·u + q·u/(1−u) (ms per reference request), extended by its
// second-order Taylor expansion beyond ue so that iterates past saturation
// stay finite.
type engModel struct {
	C, limit float64 // available capacity and Headroom·C (or lower: fullLimits), reference req/s
	lin, q   float64
	ue       float64
	nominal  float64 // capacity without the penalty (for PenaltyMs)
	y        float64 // load
	lam, rho float64 // augmented Lagrangian multiplier and penalty
	rho0     float64
	prevViol float64
}

func (e *engModel) kAt(u float64) float64 { return e.lin*u + e.q*u/(1-u) }

// g, g1, g2 are g(u), g'(u), g”(u), extended past ue.
func (e *engModel) derivs(u float64) (g, g1, g2 float64) {
	v := u
	if v > e.ue {
		v = e.ue
	}
	w := 1 - v
	g = e.lin*v*v + e.q*v*v/w
	g1 = 2*e.lin*v + e.q*v*(2-v)/(w*w)
	g2 = 2*e.lin + 2*e.q/(w*w*w)
	if u > e.ue {
		du := u - e.ue
		g += g1*du + 0.5*g2*du*du
		g1 += g2 * du
	}
	return
}

// cost is G(Y).
func (e *engModel) cost(y float64) float64 {
	if e.C <= 0 {
		return 0
	}
	g, _, _ := e.derivs(y / e.C)
	return e.C * g
}

// marginal returns G'(Y) and G”(Y).
func (e *engModel) marginal(y float64) (d1, d2 float64) {
	_, g1, g2 := e.derivs(y / e.C)
	return g1, g2 / e.C
}

const defaultRemap = 1.35

// DefaultTailFactor is the TailFactor a Problem's 0 means: ln 100, the
// 99th percentile of an exponential wait over its mean.
const DefaultTailFactor = 4.6

func compile(p *Problem) *model {
	m := &model{p: p, nPri: len(p.Priorities)}
	remap := p.RemapFactor
	if remap == 0 {
		remap = defaultRemap
	}
	m.sigma = p.StabilityMs * remap / 2

	tau := p.TailFactor
	if tau == 0 {
		tau = DefaultTailFactor
	}
	m.eng = make([]engModel, len(p.Engines))
	for j := range p.Engines {
		e := &p.Engines[j]
		pr := &e.Profile
		nominal := pr.CapacityRPS * e.ReadyReplicas * e.Health
		c := nominal * (1 - e.Penalty)
		m.eng[j] = engModel{
			C: c, limit: p.Headroom * c, nominal: nominal,
			// The objective prices the time to first token, its
			// load-dependent part at the tail (TailFactor): see "What
			// the objective charges" in docs/optimizer.md.
			lin: tau * pr.TTFT.Linear,
			q:   tau * pr.TTFT.Queue,
			ue:  (1 + p.Headroom) / 2,
		}
	}

	for i := range p.Frontends {
		for c := range p.Classes {
			d := p.Demand[i][c]
			tot := d.Total()
			if !(tot > 0) {
				continue
			}
			cl := &p.Classes[c]
			b := block{i: i, c: c, d: tot, dp: d.RatePerS, s: make([]float64, m.nPri), shape: p.FlowShape(i, c)}
			var last map[string]float64
			if p.Last != nil && p.Last.Weights != nil {
				last = p.Last.Weights[p.Frontends[i].ID][cl.ID]
			}
			var lastW []float64 // dense by engine, from the (small) map
			if last != nil {
				if m.engIdx == nil {
					m.engIdx = make(map[string]int, len(p.Engines))
					for j := range p.Engines {
						m.engIdx[p.Engines[j].ID] = j
					}
					m.lastBuf = make([]float64, len(p.Engines))
				}
				lastW = m.lastBuf
				for j := range lastW {
					lastW[j] = 0
				}
				for id, w := range last {
					if j, ok := m.engIdx[id]; ok {
						lastW[j] = w
					}
				}
			}
			elig := append([]int(nil), cl.Eligible...)
			sort.Ints(elig)
			b.lo = len(m.arcs)
			for _, j := range elig {
				if !(m.eng[j].C > 0) {
					continue
				}
				pr := &p.Engines[j].Profile
				ttft, _ := pr.Latency(b.shape, 0)
				a := arc{j: j, a: p.RTTMs[i][j] + ttft + p.PenaltyCostMs*p.Engines[j].Penalty, r: pr.Ratio(b.shape)}
				if last != nil {
					a.x0 = tot * lastW[j]
					a.sigma = m.sigma
				}
				m.arcs = append(m.arcs, a)
			}
			b.hi = len(m.arcs)
			if last != nil {
				b.hasLast = true
			}
			m.blocks = append(m.blocks, b)
		}
	}

	if p.MarginalStretch > 0 {
		m.fullLimits()
	}
	for j := range m.eng {
		if u := p.Engines[j].MaxUtilization; u > 0 && u*m.eng[j].C < m.eng[j].limit {
			m.eng[j].limit = u * m.eng[j].C
		}
	}

	// Shed cost: M·(1 + ShedCost/max ShedCost) with M twice the largest
	// marginal cost of any route at full headroom, so that a request is
	// shed only when no eligible engine has room left.
	maxMarg := 1.0
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			e := &m.eng[a.j]
			_, g1, _ := e.derivs(e.limit / e.C)
			if v := a.a + a.r*g1 + 2*a.sigma; v > maxMarg {
				maxMarg = v
			}
		}
	}
	big := 2 * maxMarg
	maxShed := 0.0
	for _, pr := range p.Priorities {
		maxShed = math.Max(maxShed, pr.ShedCost)
	}
	m.shed = make([]float64, m.nPri)
	m.shedOrd = make([]int, m.nPri)
	for k, pr := range p.Priorities {
		m.shed[k] = big * (1 + pr.ShedCost/maxShed)
		m.shedOrd[k] = k
	}
	sort.SliceStable(m.shedOrd, func(a, b int) bool { return m.shed[m.shedOrd[a]] < m.shed[m.shedOrd[b]] })
	return m
}

// fullLimits lowers each engine's limit to where one more request costs
// MarginalStretch times its zero-load latency (Problem.MarginalStretch):
// the utilization at which that happens for each flow's shape
// (Profile.FullUtilization), averaged over the flows that may use the
// engine, weighted by the work each would bring if spread evenly over its
// eligible engines. An engine's limit is one utilization for every flow:
// judging each flow by its own marginal cost would refuse long prompts
// first (one adds the congestion of twenty short ones) on a fleet at a
// third of its capacity.
func (m *model) fullLimits() {
	p := m.p
	num, den := make([]float64, len(m.eng)), make([]float64, len(m.eng))
	type key struct { // engines of one profile share their limit (pools)
		p Profile
		s Shape
	}
	memo := map[key]float64{}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		n := float64(b.hi - b.lo)
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			kk := key{p.Engines[a.j].Profile, b.shape}
			u, ok := memo[kk]
			if !ok {
				u = kk.p.FullUtilization(b.shape, p.MarginalStretch, p.Headroom)
				memo[kk] = u
			}
			w := b.d * a.r / n
			num[a.j] += w * u
			den[a.j] += w
		}
	}
	for j := range m.eng {
		e := &m.eng[j]
		if den[j] > 0 {
			if u := num[j] / den[j]; u < p.Headroom {
				e.limit = u * e.C
			}
		}
	}
}

// loads recomputes engine loads from the arcs.
func (m *model) loads() {
	for j := range m.eng {
		m.eng[j].y = 0
	}
	for k := range m.arcs {
		a := &m.arcs[k]
		m.eng[a.j].y += a.r * a.x
	}
}

// objective evaluates the exact convex objective at the current x and s.
func (m *model) objective() float64 {
	m.loads()
	obj := 0.0
	for k := range m.arcs {
		a := &m.arcs[k]
		obj += a.a*a.x + a.sigma*math.Abs(a.x-a.x0)
	}
	// Stability charge for last-allocation weight on engines that are no
	// longer usable is a constant; leave it out.
	for j := range m.eng {
		obj += m.eng[j].cost(m.eng[j].y)
	}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for p, s := range b.s {
			obj += m.shed[p] * s
		}
	}
	return obj
}
