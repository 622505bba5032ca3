package optimizer

import "math"

// result turns the model's solved state into a Solution.
func (m *model) result(method Method) *Solution {
	p := m.p
	m.loads()
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
			price[j] = math.Max(0, e.lam+e.rho*(e.y-e.limit))
			er.CapacityPriceMs = price[j]
			er.TTFTMs, er.TBOTMs = pr.Latency(pr.RefPromptTokens, pr.RefOutputTokens, er.Utilization)
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

// explain decomposes arc a's marginal cost.
func (m *model) explain(b *block, a *arc, capPrice float64) Explanation {
	p := m.p
	e := &m.eng[a.j]
	pr := &p.Engines[a.j].Profile
	u := e.y / e.C
	var ex Explanation
	ex.Utilization = u
	ex.NetworkMs = p.RTTMs[b.i][a.j]
	ex.TTFTMs, ex.TBOTMs = pr.Latency(b.prompt, b.output, u)
	ex.QueueingMs = a.r * e.kAt(u)
	ex.OutlierCostMs = p.PenaltyCostMs * p.Engines[a.j].Penalty
	// The latency the objective charges: zero-load latency (a.a less the
	// network and outlier terms) plus the load-dependent part, so that the
	// terms add up to the flow's price. TTFTMs and TBOTMs are the profile's
	// curves at this load, shown beside it.
	ex.LatencyMs = a.a - ex.NetworkMs - ex.OutlierCostMs + ex.QueueingMs
	// marginal congestion: r·u·K'(u) = r·(g'(u) − K(u))
	_, g1, _ := e.derivs(u)
	ex.CongestionMs = a.r * (g1 - e.kAt(u))
	ex.CapacityPriceMs = a.r * capPrice
	if e.nominal > 0 && p.Engines[a.j].Penalty > 0 {
		ex.PenaltyMs = a.r * (e.kAt(u) - e.kAt(e.y/e.nominal))
	}
	ex.StabilityMs = b.nu - (ex.NetworkMs + ex.LatencyMs + ex.OutlierCostMs + ex.CongestionMs + ex.CapacityPriceMs)
	if math.Abs(ex.StabilityMs) < 1e-9*math.Max(1, math.Abs(b.nu)) || a.sigma == 0 {
		ex.StabilityMs = 0
	}
	return ex
}
