package optimizer

import "math"

// result turns the model's solved state into a Solution.
func (m *model) result(method Method) *Solution {
	p := m.p
	m.loads()
	m.cacheMarginals()
	sol := &Solution{Method: method, Bound: math.NaN(), ShedCostMs: append([]float64(nil), m.shed...)}
	sol.Objective = m.objective()

	sol.Engines = make([]EngineResult, len(p.Engines))
	price := make([]float64, len(p.Engines)) // capacity dual per reference request
	for j := range p.Engines {
		e := &m.eng[j]
		pr := &p.Engines[j].Profile
		er := EngineResult{ID: p.Engines[j].ID, LoadRPS: e.y, CapacityRPS: e.C, LimitRPS: e.limit}
		if e.C > 0 {
			er.Utilization = e.y / e.C
			// The multiplier itself: the fast solver's last block steps
			// were stationary for max(0, λ_old + ρ·(Y − limit)), which is
			// λ after its update; the reference sets λ from its duals.
			price[j] = e.lam
			er.CapacityPriceMs = price[j]
			er.TTFTMs, er.TBOTMs = pr.Latency(pr.Reference(), er.Utilization)
		}
		sol.Engines[j] = er
	}

	// index blocks by (i, c)
	bidx := make(map[[2]int]int, len(m.blocks))
	for bi := range m.blocks {
		bidx[[2]int{m.blocks[bi].i, m.blocks[bi].c}] = bi
	}
	for i := range p.Frontends {
		for c := range p.Classes {
			f := Flow{Frontend: p.Frontends[i].ID, Class: p.Classes[c].ID}
			f.Shed = make([]Shed, len(p.Priorities))
			for k, pr := range p.Priorities {
				f.Shed[k] = Shed{Priority: pr.Name, DemandPerS: p.Demand[i][c].RatePerS[k]}
			}
			bi, ok := bidx[[2]int{i, c}]
			if !ok {
				sol.Flows = append(sol.Flows, f)
				continue
			}
			b := &m.blocks[bi]
			f.DemandPerS = b.d
			b.nu = m.flowPrice(b)
			f.PriceMs = b.nu
			var last map[string]float64
			if p.Last != nil && p.Last.Weights != nil {
				last = p.Last.Weights[f.Frontend][f.Class]
			}
			for k, s := range b.s {
				f.Shed[k].RatePerS = s
				if f.Shed[k].DemandPerS > 0 {
					f.Shed[k].Fraction = s / f.Shed[k].DemandPerS
				}
			}
			routed := 0.0
			for k := b.lo; k < b.hi; k++ {
				routed += m.arcs[k].x
			}
			f.RoutedPerS = routed
			for k := b.lo; k < b.hi; k++ {
				a := &m.arcs[k]
				if !(a.x > 0) {
					continue
				}
				ex := m.explain(b, a, price[a.j])
				w := Weight{Engine: p.Engines[a.j].ID, Weight: a.x / routed, RatePerS: a.x, LastWeight: last[p.Engines[a.j].ID], Explanation: ex}
				f.Weights = append(f.Weights, w)
				f.TTFTMs += w.Weight * ex.TTFTMs
				f.TBOTMs += w.Weight * ex.TBOTMs
				f.NetworkMs += w.Weight * ex.NetworkMs
				f.LatencyMs += w.Weight * (ex.NetworkMs + ex.LatencyMs)
			}
			// normalize so weights sum to 1 exactly up to rounding
			sum := 0.0
			for _, w := range f.Weights {
				sum += w.Weight
			}
			for k := range f.Weights {
				f.Weights[k].Weight /= sum
			}
			sol.Flows = append(sol.Flows, f)
		}
	}
	return sol
}

// heldEps is the distance from the last allocation (relative to the flow's
// demand) within which an arc counts as held at the stability kink.
const heldEps = 1e-9

// marginals returns arc a's marginal cost without the stability term,
// base = a.a + r·(G'(Y) + λ), and the stability charge of moving one more
// request onto the arc (up) and of taking one off it (down): ±σ off the
// kink, +σ and −σ at it (x = x0).
//
// It reads G'(Y) from m.g1, which cacheMarginals fills for the current loads.
func (m *model) marginals(b *block, a *arc) (base, up, down float64) {
	base = a.a + a.r*(m.g1[a.j]+m.eng[a.j].lam)
	if a.sigma == 0 {
		return base, 0, 0
	}
	eps := heldEps * b.d
	switch {
	case a.x > a.x0+eps:
		return base, a.sigma, a.sigma
	case a.x < a.x0-eps:
		return base, -a.sigma, -a.sigma
	}
	return base, a.sigma, -a.sigma
}

// cacheMarginals stores every engine's G'(Y) at its current load in m.g1
// (for marginals and flowPrice).
func (m *model) cacheMarginals() {
	if len(m.g1) != len(m.eng) {
		m.g1 = make([]float64, len(m.eng))
	}
	for j := range m.eng {
		if e := &m.eng[j]; e.C > 0 {
			m.g1[j], _ = e.marginal(e.y)
		}
	}
}

// flowPrice is the flow's price ν at the current point (loads, x, s and
// capacity multipliers λ): the marginal cost of routing one more request,
// min over the flow's eligible arcs of base + up. At an optimum every used
// arc's marginal cost equals it (the demand constraint's dual) and unused
// arcs cost at least as much; away from it, used arcs exceed it by their
// stationarity residual, which the fast solver's gap bounds. A flow that
// routes nothing is priced at its most expensive shed priority (or the
// cheapest route if that is lower).
func (m *model) flowPrice(b *block) float64 {
	nu, routed := math.Inf(1), false
	for k := b.lo; k < b.hi; k++ {
		a := &m.arcs[k]
		base, up, _ := m.marginals(b, a)
		nu = math.Min(nu, base+up)
		if a.x > 0 {
			routed = true
		}
	}
	if routed {
		return nu
	}
	shed := 0.0
	for p, s := range b.s {
		if s > 0 {
			shed = math.Max(shed, m.shed[p])
		}
	}
	return math.Min(nu, shed)
}

// explain decomposes arc a's marginal cost at the current point; b.nu must
// be the flow's price (flowPrice). The terms add up to base + stability
// (see marginals), which equals b.nu for a used arc at an optimum.
func (m *model) explain(b *block, a *arc, capPrice float64) Explanation {
	p := m.p
	e := &m.eng[a.j]
	pr := &p.Engines[a.j].Profile
	u := e.y / e.C
	var ex Explanation
	ex.Utilization = u
	ex.NetworkMs = p.RTTMs[b.i][a.j]
	ex.TTFTMs, ex.TBOTMs = pr.Latency(b.shape, u)
	ex.QueueingMs = a.r * e.kAt(u)
	ex.OutlierCostMs = p.PenaltyCostMs * p.Engines[a.j].Penalty
	// The latency the objective charges: zero-load latency (a.a less the
	// network and outlier terms) plus the load-dependent part r·K(u); with
	// G(Y) = C·g(Y/C), g(u) = u·K(u), the arc's marginal cost is
	// a.a + r·g'(u) = a.a + r·K(u) + r·u·K'(u).
	ex.LatencyMs = a.a - ex.NetworkMs - ex.OutlierCostMs + ex.QueueingMs
	// marginal congestion: r·u·K'(u) = r·(g'(u) − K(u))
	_, g1, _ := e.derivs(u)
	ex.CongestionMs = a.r * (g1 - e.kAt(u))
	ex.CapacityPriceMs = a.r * capPrice
	if e.nominal > 0 && p.Engines[a.j].Penalty > 0 {
		ex.PenaltyMs = a.r * (e.kAt(u) - e.kAt(e.y/e.nominal))
	}
	// Stability: +σ where the arc carries more than its last allocation
	// (one more request here moves one more), −σ where less (one more
	// request here moves one back); at the kink (held at the last
	// allocation) whatever in [−σ, σ] brings the sum to the flow's price.
	base := ex.NetworkMs + ex.LatencyMs + ex.OutlierCostMs + ex.CongestionMs + ex.CapacityPriceMs
	if _, up, down := m.marginals(b, a); up == down {
		ex.StabilityMs = up
	} else {
		ex.StabilityMs = math.Max(down, math.Min(up, b.nu-base))
	}
	return ex
}
