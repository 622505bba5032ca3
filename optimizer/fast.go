package optimizer

import (
	"cmp"
	"math"
	"slices"
)

// fastSolver is Gauss–Seidel block coordinate descent: for each (frontend,
// class) in turn it minimizes the objective over that flow's arcs and shed
// variables, holding the other flows fixed. The block subproblem is solved
// exactly for a local model: each engine's cost is expanded to second order
// at its current load (the block Hessian is diagonal, since a flow's arcs go
// to distinct engines), the augmented-Lagrangian capacity penalty and the
// stability term |x − x0| are kept exact, and the demand constraint's
// multiplier ν is found by a bracketed Newton search on the piecewise-linear
// monotone total Σ_k x_k(ν). Engine capacity is enforced by an augmented
// Lagrangian whose multipliers are updated after every sweep.
type fastSolver struct {
	m   *model
	tol float64
	// rho0 is the initial augmented-Lagrangian penalty in units of the
	// engine cost's curvature at its limit; rhoMax bounds its growth.
	rho0, rhoMax float64
	capTol       float64
	shedBuf      []float64
	exchangeOK   bool
	// exchangeEvery is the number of sweeps between exchange passes.
	exchangeEvery int
	// omega > 1 over-relaxes block steps (successive over-relaxation):
	// the block sees its engines' curvature divided by omega.
	omega float64
	// stalled is set when iterate stopped on the stall rule rather than
	// on the certified gap (then the explanations' stationarity residual
	// is not certified either).
	stalled bool
	// scratch per arc of a block for gap: base marginal, stability up/down
	gb, gu, gd []float64
	// scratch per arc of the current block
	m0, hg, xc, p0, rr, r, x0, sg []float64
}

// per-arc local model: marginal(x) = m0 + hg·(x−xc) + r·max(0, p0 + rr/r·(x−xc))
// where rr = ρ·r². inv returns x with marginal(x) = t.
func (s *fastSolver) inv(k int, t float64) float64 {
	m0, hg, xc := s.m0[k], s.hg[k], s.xc[k]
	r, p0, rr := s.r[k], s.p0[k], s.rr[k]
	if rr > 0 {
		// kink where p0 + ρ·r·(x−xc) = 0
		xk := xc - p0*r/rr
		mk := m0 + hg*(xk-xc)
		if t > mk {
			return xc + (t-m0-r*p0)/(hg+rr)
		}
	}
	return xc + (t-m0)/hg
}

// xOf is arc k's minimizer at multiplier nu, and its slope dx/dν (0 where
// clamped at 0 or held at x0).
func (s *fastSolver) xOf(k int, nu float64) (x, slope float64) {
	sg := s.sg[k]
	x0 := s.x0[k]
	hi := s.inv(k, nu-sg)
	switch {
	case hi > x0:
		x = hi
	default:
		lo := s.inv(k, nu+sg)
		if lo < x0 {
			x = lo
		} else {
			x = x0
			if x <= 0 {
				return 0, 0
			}
			return x, 0
		}
	}
	if x <= 0 {
		return 0, 0
	}
	// slope of the active piece
	t := nu
	if x > x0 {
		t = nu - sg
	} else {
		t = nu + sg
	}
	h := s.hg[k]
	if s.rr[k] > 0 {
		xk := s.xc[k] - s.p0[k]*s.r[k]/s.rr[k]
		if t > s.m0[k]+s.hg[k]*(xk-s.xc[k]) {
			h += s.rr[k]
		}
	}
	return x, 1 / h
}

func (s *fastSolver) total(n int, nu float64) (f, slope float64) {
	for k := 0; k < n; k++ {
		x, d := s.xOf(k, nu)
		f += x
		slope += d
	}
	return
}

// root finds ν in (lo, cap] with total(ν) = target, starting from guess
// (lo may be -Inf). If total(cap) < target it returns (cap, false). It uses
// Newton steps on the piecewise-linear total, safeguarded by bisection on
// the bracket found so far.
func (s *fastSolver) root(n int, target, lo, cap, guess float64) (float64, bool) {
	hi := math.Inf(1)
	nu := guess
	if !(nu > lo) || nu > cap {
		nu = math.Min(cap, math.Max(lo, 0)+1)
	}
	tolF := 1e-12 * math.Max(target, 1e-300)
	step := math.Max(1, math.Abs(nu)*1e-2)
	for it := 0; it < 300; it++ {
		f, d := s.total(n, nu)
		if math.Abs(f-target) <= tolF {
			return nu, true
		}
		if f < target {
			lo = nu
			if nu >= cap {
				return cap, false
			}
		} else {
			hi = nu
		}
		next := math.NaN()
		if d > 0 {
			next = nu + (target-f)/d
		}
		if !(next > lo && next < hi) || math.IsNaN(next) {
			switch {
			case math.IsInf(hi, 1):
				next = nu + step
				step *= 4
			case math.IsInf(lo, -1):
				next = nu - step
				step *= 4
			default:
				next = 0.5 * (lo + hi)
			}
		}
		if next > cap {
			next = cap
		}
		if !math.IsInf(lo, -1) && !math.IsInf(hi, 1) && hi-lo <= 1e-15*math.Max(1, math.Abs(hi)) {
			return hi, true
		}
		nu = next
	}
	return nu, true
}

func (s *fastSolver) ensure(n int) {
	if cap(s.m0) < n {
		s.m0 = make([]float64, n)
		s.hg = make([]float64, n)
		s.xc = make([]float64, n)
		s.p0 = make([]float64, n)
		s.rr = make([]float64, n)
		s.r = make([]float64, n)
		s.x0 = make([]float64, n)
		s.sg = make([]float64, n)
	}
	s.m0, s.hg, s.xc, s.p0 = s.m0[:n], s.hg[:n], s.xc[:n], s.p0[:n]
	s.rr, s.r, s.x0, s.sg = s.rr[:n], s.r[:n], s.x0[:n], s.sg[:n]
}

// step re-optimizes one block and returns Σ|Δx| + Σ|Δs|.
func (s *fastSolver) step(b *block) float64 {
	m := s.m
	arcs := m.arcs[b.lo:b.hi]
	n := len(arcs)
	s.ensure(n)
	for k := range arcs {
		a := &arcs[k]
		e := &m.eng[a.j]
		d1, d2 := e.marginal(e.y)
		hg := a.r * a.r * d2 / s.omega
		if hg < 1e-12 {
			hg = 1e-12
		}
		s.m0[k] = a.a + a.r*d1
		s.hg[k] = hg
		s.xc[k] = a.x
		s.r[k] = a.r
		s.p0[k] = e.lam + e.rho*(e.y-e.limit)
		s.rr[k] = e.rho * a.r * a.r
		s.x0[k] = a.x0
		s.sg[k] = a.sigma
	}
	if b.nu == 0 && n > 0 {
		// first visit: start from the flow-weighted marginal cost
		w := 0.0
		for k := range arcs {
			b.nu += arcs[k].x * s.m0[k]
			w += arcs[k].x
		}
		if w > 0 {
			b.nu /= w
		}
	}
	// Shedding, cheapest priority first (see package doc): try without
	// shedding below the cheapest shed cost; if the arcs cannot take the
	// demand there, shed priorities in order.
	rem := b.d
	lo := math.Inf(-1)
	newShed := s.shedBuf[:len(b.s)]
	for p := range newShed {
		newShed[p] = 0
	}
	var nu float64
	for idx, p := range m.shedOrd {
		cost := m.shed[p]
		dp := b.dp[p]
		v, ok := s.root(n, rem, lo, cost, b.nu)
		if ok {
			nu = v
			break
		}
		f, _ := s.total(n, cost)
		if f >= rem-dp || idx == len(m.shedOrd)-1 {
			nu = cost
			newShed[p] = math.Max(0, math.Min(dp, rem-f))
			break
		}
		newShed[p] = dp
		rem -= dp
		lo = cost
	}
	b.nu = nu
	moved := 0.0
	for k := range arcs {
		a := &arcs[k]
		x, _ := s.xOf(k, nu)
		if n > 0 && x != a.x {
			dx := x - a.x
			m.eng[a.j].y += a.r * dx
			moved += math.Abs(dx)
			a.x = x
		}
	}
	for p := range b.s {
		moved += math.Abs(newShed[p] - b.s[p])
		b.s[p] = newShed[p]
	}
	return moved
}

func (s *fastSolver) init() {
	m := s.m
	for bi := range m.blocks {
		b := &m.blocks[bi]
		arcs := m.arcs[b.lo:b.hi]
		if len(arcs) == 0 {
			// nothing can serve it: shed everything
			copy(b.s, b.dp)
			continue
		}
		sum := 0.0
		if b.hasLast {
			for k := range arcs {
				sum += arcs[k].x0
			}
		}
		if sum > 0 {
			for k := range arcs {
				arcs[k].x = b.d * arcs[k].x0 / sum
			}
		} else {
			// Cold start from nothing: the first sweep is then a greedy
			// fill, each flow taking the best engines given the flows
			// before it, which is much closer to the optimum than spreading
			// every flow over all eligible engines.
			for k := range arcs {
				arcs[k].x = 0
			}
		}
		b.nu = 0
	}
	m.loads()
	s.initRho()
}

func (s *fastSolver) initRho() {
	m := s.m
	for j := range m.eng {
		e := &m.eng[j]
		if e.C > 0 {
			_, d2 := e.marginal(e.limit)
			e.rho = s.rho0 * d2
			e.rho0 = e.rho
		}
	}
}

// run iterates sweeps until the duality gap is below tol (relative) and no
// engine exceeds its limit by more than capTol (relative); it returns the
// number of sweeps, whether it converged, and the final lower bound.
func (s *fastSolver) run(maxSweeps int) (int, bool, float64) {
	s.init()
	return s.iterate(maxSweeps, math.Inf(-1))
}

// iterate runs sweeps from the model's current point; lb is a lower bound
// already known (from a relaxation), or -Inf.
func (s *fastSolver) iterate(maxSweeps int, lb float64) (int, bool, float64) {
	m := s.m
	s.stalled = false
	s.shedBuf = make([]float64, m.nPri)
	s.exchangeOK = s.exchangeWork() <= 2_000_000
	if s.exchangeEvery <= 0 {
		s.exchangeEvery = 10
	}
	m.loads()
	if s.viol() <= s.capTol && s.residual() <= s.capTol {
		// already converged (e.g. an exact pooled solution)?
		if obj, bound, resid := s.gap(); obj-math.Max(lb, bound) <= s.tol*math.Abs(obj) && resid <= s.tol*math.Abs(obj) {
			return 0, true, math.Max(lb, bound)
		}
	}
	const stallWindow = 100
	var hist [stallWindow]float64
	for sweep := 1; sweep <= maxSweeps; sweep++ {
		maxMove := 0.0
		for bi := range m.blocks {
			b := &m.blocks[bi]
			if b.hi == b.lo {
				continue
			}
			if mv := s.step(b) / b.d; mv > maxMove {
				maxMove = mv
			}
		}
		maxViol := s.multipliers(maxMove)
		if s.exchangeOK && sweep%s.exchangeEvery == 0 {
			if s.exchange() > 0 {
				m.loads()
			}
		}
		if maxViol <= s.capTol {
			obj, bound, resid := s.gap()
			lb = math.Max(lb, bound)
			stationary := resid <= s.tol*math.Abs(obj)
			if obj-lb <= s.tol*math.Abs(obj) && stationary {
				return sweep, true, lb
			}
			// Stalled: degenerate exchanges between flows (two flows trading
			// a saturated engine at nearly equal value) creep at a flat
			// objective while the Lagrangian bound stays loose. Stop when the
			// objective improved by less than tol/100 over the window.
			old := hist[sweep%stallWindow]
			hist[sweep%stallWindow] = obj
			if old != 0 && old-obj <= 1e-3*s.tol*math.Abs(obj) {
				s.stalled = true
				return sweep, true, lb
			}
		}
	}
	return maxSweeps, false, lb
}

// gap returns the objective and a lower bound on the optimum: by weak
// duality, for multipliers λ ≥ 0 the optimum is at least min over the
// flows' own constraints of the Lagrangian L(x, λ) = F(x) + Σ λ_j (Y_j −
// limit_j), and by convexity L is at least its linearization at the current
// point, whose minimum over each flow's simplex (routes and shed
// priorities) is found greedily. A stability kink at x = x0 takes the
// subgradient closest to the flow's price.
func (s *fastSolver) gap() (obj, bound, resid float64) {
	m := s.m
	obj = m.objective() // also refreshes loads
	m.cacheMarginals()
	lag := obj
	for j := range m.eng {
		e := &m.eng[j]
		if e.C > 0 {
			lag += e.lam * (e.y - e.limit)
		}
	}
	lin := 0.0 // Σ_b min over the simplex of ⟨∇L, x' − x⟩
	for bi := range m.blocks {
		b := &m.blocks[bi]
		// At a stability kink take the subgradient closest to the flow's
		// price ν (flowPrice, the cheapest route's marginal cost): then
		// gmin = ν and −lin ≥ Σ_k x_k·(g_k − ν), the weighted stationarity
		// residual of the explanations, so a certified gap bounds it.
		n := b.hi - b.lo
		if cap(s.gb) < n {
			s.gb, s.gu, s.gd = make([]float64, n), make([]float64, n), make([]float64, n)
		}
		// (plain comparisons: math.Min and math.Max are slow here, and
		// nothing is NaN)
		nu, routed := math.Inf(1), false
		for k := 0; k < n; k++ {
			a := &m.arcs[b.lo+k]
			base, up, down := m.marginals(b, a)
			s.gb[k], s.gu[k], s.gd[k] = base, up, down
			if base+up < nu {
				nu = base + up
			}
			if a.x > 0 {
				routed = true
			}
		}
		if !routed {
			nu = m.flowPrice(b)
		}
		cur, gmin, xsum := 0.0, math.Inf(1), 0.0
		for k := 0; k < n; k++ {
			x := m.arcs[b.lo+k].x
			st := nu - s.gb[k]
			if st > s.gu[k] {
				st = s.gu[k]
			} else if st < s.gd[k] {
				st = s.gd[k]
			}
			g := s.gb[k] + st
			cur += g * x
			xsum += x
			if g < gmin {
				gmin = g
			}
		}
		if xsum > 0 {
			// Σ_k x_k·(g_k − gmin), gmin = ν: the explanations' residual
			resid += math.Max(0, cur-gmin*xsum)
		}
		best, rem := 0.0, b.d
		for _, p := range m.shedOrd {
			cur += m.shed[p] * b.s[p]
			if m.shed[p] < gmin && rem > 0 {
				take := math.Min(rem, b.dp[p])
				best += take * m.shed[p]
				rem -= take
			}
		}
		if rem > 0 {
			if math.IsInf(gmin, 1) {
				// only shedding is possible; cheapest remaining priorities
				for _, p := range m.shedOrd {
					_ = p
				}
			} else {
				best += rem * gmin
			}
		}
		lin += best - cur
	}
	return obj, lag + lin, resid
}

// multipliers does the augmented-Lagrangian update λ ← max(0, λ + ρ·(Y −
// limit)) after a sweep, and stiffens ρ on engines whose violation did not
// shrink by 4× although the sweep had settled (maxMove below the violation):
// raising ρ while blocks are still moving would only slow the sweeps down.
func (s *fastSolver) multipliers(maxMove float64) float64 {
	m := s.m
	maxViol := 0.0
	for j := range m.eng {
		e := &m.eng[j]
		if !(e.C > 0) {
			continue
		}
		v := (e.y - e.limit) / e.limit
		if v > maxViol {
			maxViol = v
		}
		e.lam = math.Max(0, e.lam+e.rho*(e.y-e.limit))
		if v > s.tol && maxMove < v {
			if v > 0.25*e.prevViol && e.rho < s.rhoMax*e.rho0 {
				e.rho *= 2
			}
			e.prevViol = v
		}
	}
	return maxViol
}

func (s *fastSolver) viol() float64 {
	v := 0.0
	for j := range s.m.eng {
		e := &s.m.eng[j]
		if e.C > 0 {
			v = math.Max(v, (e.y-e.limit)/e.limit)
		}
	}
	return v
}

// residual is the largest relative violation of a flow's demand
// constraint Σx + Σs = d (non-zero only before the first sweep).
func (s *fastSolver) residual() float64 {
	m := s.m
	r := 0.0
	for bi := range m.blocks {
		b := &m.blocks[bi]
		t := 0.0
		for k := b.lo; k < b.hi; k++ {
			t += m.arcs[k].x
		}
		for _, v := range b.s {
			t += v
		}
		r = math.Max(r, math.Abs(t-b.d)/b.d)
	}
	return r
}

// exchange is a pass of pairwise exchanges: two flows of the same class and
// request shape have arcs to the same engines with the same work ratio, so
// moving δ of flow 1 from engine j to k while flow 2 moves δ from k to j
// leaves every engine's load unchanged and changes the cost linearly (plus
// the stability kinks). Block coordinate descent creeps along these
// directions (each single-flow step changes loads and pays curvature); here
// each pair's split is solved exactly: with the engines' pair totals fixed,
// flow 1's share on each engine has a convex piecewise-linear cost, and the
// cheapest segments are filled greedily. Returns the cost decrease.
func (s *fastSolver) exchange() float64 {
	m := s.m
	gain := 0.0
	type seg struct {
		k           int
		slope, size float64
	}
	var segs []seg
	var take []float64
	for b1 := range m.blocks {
		p := &m.blocks[b1]
		n := p.hi - p.lo
		if n < 2 {
			continue
		}
		for b2 := b1 + 1; b2 < len(m.blocks); b2++ {
			q := &m.blocks[b2]
			if q.c != p.c || q.hi-q.lo != n || q.shape != p.shape {
				continue
			}
			a1, a2 := m.arcs[p.lo:p.hi], m.arcs[q.lo:q.hi]
			x1 := 0.0
			for k := range a1 {
				x1 += a1[k].x
			}
			if x1 <= 0 {
				continue
			}
			segs = segs[:0]
			before := 0.0
			for k := range a1 {
				u, v := &a1[k], &a2[k]
				tot := u.x + v.x
				before += u.a*u.x + u.sigma*math.Abs(u.x-u.x0) + v.a*v.x + v.sigma*math.Abs(v.x-v.x0)
				if tot <= 0 {
					continue
				}
				// breakpoints of x ↦ (u.a−v.a)x + σ1|x−x01| + σ2|tot−x−x02|
				pts := [4]float64{0, math.Min(math.Max(u.x0, 0), tot), math.Min(math.Max(tot-v.x0, 0), tot), tot}
				if pts[1] > pts[2] {
					pts[1], pts[2] = pts[2], pts[1]
				}
				for i := 0; i < 3; i++ {
					lo, hi := pts[i], pts[i+1]
					if hi <= lo {
						continue
					}
					mid := (lo + hi) / 2
					sl := u.a - v.a
					if u.sigma > 0 {
						if mid > u.x0 {
							sl += u.sigma
						} else {
							sl -= u.sigma
						}
					}
					if v.sigma > 0 {
						if tot-mid > v.x0 {
							sl -= v.sigma
						} else {
							sl += v.sigma
						}
					}
					segs = append(segs, seg{k, sl, hi - lo})
				}
			}
			slices.SortStableFunc(segs, func(x, y seg) int { return cmp.Compare(x.slope, y.slope) })
			if cap(take) < n {
				take = make([]float64, n)
			}
			take = take[:n]
			for k := range take {
				take[k] = 0
			}
			rem := x1
			for _, sg := range segs {
				if rem <= 0 {
					break
				}
				d := math.Min(rem, sg.size)
				take[sg.k] += d
				rem -= d
			}
			after := 0.0
			for k := range a1 {
				u, v := &a1[k], &a2[k]
				tot := u.x + v.x
				nx := math.Min(take[k], tot)
				after += u.a*nx + u.sigma*math.Abs(nx-u.x0) + v.a*(tot-nx) + v.sigma*math.Abs(tot-nx-v.x0)
			}
			if after < before-1e-12*math.Abs(before) {
				for k := range a1 {
					u, v := &a1[k], &a2[k]
					tot := u.x + v.x
					u.x = math.Min(take[k], tot)
					v.x = tot - u.x
				}
				gain += before - after
			}
		}
	}
	return gain
}

// exchangeWork estimates one exchange pass's cost (arc visits).
func (s *fastSolver) exchangeWork() int {
	perClass := map[int]int{}
	for bi := range s.m.blocks {
		perClass[s.m.blocks[bi].c]++
	}
	w := 0
	for bi := range s.m.blocks {
		b := &s.m.blocks[bi]
		w += perClass[b.c] * (b.hi - b.lo) / 2
	}
	return w
}
