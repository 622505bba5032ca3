package optimizer

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// solveLP is the reference solver: the problem with each engine's convex
// cost G_j replaced by the maximum of tangent lines (an epigraph variable
// t_j ≥ G(Y_s) + G'(Y_s)(Y_j − Y_s)), which is an LP, solved with gonum's
// Simplex. Tangents start at Options.Tangents points per engine (denser
// near the headroom limit) and are refined by Kelley's cutting-plane method:
// after each solve a tangent is added at every engine's solved load, until
// the LP's value (a lower bound on the optimum, since tangents under-estimate
// a convex function) and the exact objective at the LP's solution agree to
// 1e-5 relative, for at most 60 rounds (Solution.Bound reports the gap
// reached). Dense Simplex: small instances only.
func solveLP(m *model, opts Options) (*Solution, error) {
	maxArcs := opts.MaxReferenceArcs
	if maxArcs <= 0 {
		maxArcs = 2000
	}
	if len(m.arcs) > maxArcs {
		return nil, fmt.Errorf("%w: %d arcs > %d", ErrTooLarge, len(m.arcs), maxArcs)
	}
	nT := opts.Tangents
	if nT <= 0 {
		nT = 6
	}
	tangents := make([][]float64, len(m.eng)) // loads Y_s per engine
	for j := range m.eng {
		e := &m.eng[j]
		if !(e.C > 0) {
			continue
		}
		for s := 0; s < nT; s++ {
			f := float64(s) / float64(nT-1)
			tangents[j] = append(tangents[j], e.limit*(1-(1-f)*(1-f)))
		}
	}
	var lower float64
	var saved *lpState
	if len(m.blocks) == 0 {
		sol := m.result(Reference)
		sol.Bound = 0
		return sol, nil
	}
	for round := 0; round < 60; round++ {
		obj, err := m.lpOnce(tangents)
		if err != nil {
			if round == 0 {
				return nil, err
			}
			// A refined LP can be numerically harder (nearly parallel
			// tangents): keep the last solution, whose bound still holds.
			m.restore(saved)
			break
		}
		saved = m.save(saved)
		lower = obj
		exact := m.objective()
		if exact-lower <= 1e-5*math.Abs(exact) {
			break
		}
		added := false
		for j := range m.eng {
			e := &m.eng[j]
			if !(e.C > 0 && e.y > 0) {
				continue
			}
			y := math.Min(e.y, e.limit)
			dup := false
			for _, t := range tangents[j] {
				if math.Abs(t-y) <= 1e-4*e.limit {
					dup = true
				}
			}
			if !dup {
				tangents[j] = append(tangents[j], y)
				added = true
			}
		}
		if !added {
			break
		}
	}
	sol := m.result(Reference)
	sol.Bound = lower
	return sol, nil
}

// lpOnce builds and solves the LP for the given tangent points, stores the
// solution in the model (arcs x, shed s, engine loads, capacity duals
// approximated by the slope of the active tangent beyond the cost) and
// returns the LP's optimal value.
func (m *model) lpOnce(tangents [][]float64) (float64, error) {
	cols := m.lpColumns(tangents)
	A, rhs := m.lpRows(cols, tangents)
	opt, x, err := lp.Simplex(cols.cost, A, rhs, 1e-10, nil)
	opt *= cols.scale
	if err != nil {
		r, c := A.Dims()
		return 0, fmt.Errorf("optimizer: reference LP (%d rows × %d columns): %w", r, c, err)
	}
	m.lpStore(cols, x)
	return opt, nil
}

// lpCols is the reference LP's column layout: the index of each variable
// (-1: not in the LP) and the cost vector, in units of scale.
type lpCols struct {
	scale float64
	cost  []float64
	// x: routed flow per arc; stab: the arc's move away from and back to
	// its last flow (only arcs with a stability charge).
	x    []int
	stab [][2]int
	// shed and shedSlack per block and priority (only priorities with
	// demand).
	shed, shedSlack [][]int
	// Per engine reached by an arc (used): load y (in units of its limit),
	// cost epigraph t, capacity slack and one slack per tangent.
	used           []bool
	y, t, capSlack []int
	tanSlack       [][]int
}

func (m *model) lpColumns(tangents [][]float64) *lpCols {
	// Scaling: costs in units of the largest route marginal cost, engine
	// loads in units of their limit (y = Y/limit), so that coefficients are
	// of order one.
	c := &lpCols{scale: m.shed[m.shedOrd[0]] / float64(len(m.blocks)+1) / 2}
	newCol := func(v float64) int { c.cost = append(c.cost, v/c.scale); return len(c.cost) - 1 }

	c.x = make([]int, len(m.arcs))
	for k := range m.arcs {
		c.x[k] = newCol(m.arcs[k].a)
	}
	c.stab = make([][2]int, len(m.arcs))
	for k := range m.arcs {
		if m.arcs[k].sigma > 0 {
			c.stab[k] = [2]int{newCol(m.arcs[k].sigma), newCol(m.arcs[k].sigma)}
		} else {
			c.stab[k] = [2]int{-1, -1}
		}
	}
	c.shed = make([][]int, len(m.blocks))
	c.shedSlack = make([][]int, len(m.blocks))
	for bi := range m.blocks {
		b := &m.blocks[bi]
		c.shed[bi] = make([]int, m.nPri)
		c.shedSlack[bi] = make([]int, m.nPri)
		for p := 0; p < m.nPri; p++ {
			c.shed[bi][p], c.shedSlack[bi][p] = -1, -1
			if b.dp[p] > 0 {
				c.shed[bi][p] = newCol(m.shed[p])
				c.shedSlack[bi][p] = newCol(0)
			}
		}
	}
	c.used = make([]bool, len(m.eng))
	for k := range m.arcs {
		c.used[m.arcs[k].j] = true
	}
	c.y = make([]int, len(m.eng))
	c.t = make([]int, len(m.eng))
	c.capSlack = make([]int, len(m.eng))
	c.tanSlack = make([][]int, len(m.eng))
	for j := range m.eng {
		if !c.used[j] {
			continue
		}
		c.y[j], c.t[j], c.capSlack[j] = newCol(0), newCol(c.scale), newCol(0)
		for range tangents[j] {
			c.tanSlack[j] = append(c.tanSlack[j], newCol(0))
		}
	}
	return c
}

// lpRows builds the equality constraints: each block's demand routed or
// shed (shed within its priority's demand), each stability pair, and per
// used engine its load, its capacity and its tangents.
func (m *model) lpRows(c *lpCols, tangents [][]float64) (*mat.Dense, []float64) {
	n := len(c.cost)
	var rows [][]float64
	var rhs []float64
	newRow := func(b float64) []float64 {
		r := make([]float64, n)
		rows = append(rows, r)
		rhs = append(rhs, b)
		return r
	}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		r := newRow(b.d)
		for k := b.lo; k < b.hi; k++ {
			r[c.x[k]] = 1
		}
		for p := 0; p < m.nPri; p++ {
			if col := c.shed[bi][p]; col >= 0 {
				r[col] = 1
				r2 := newRow(b.dp[p])
				r2[col], r2[c.shedSlack[bi][p]] = 1, 1
			}
		}
	}
	for k := range m.arcs {
		if c.stab[k][0] < 0 {
			continue
		}
		r := newRow(m.arcs[k].x0)
		r[c.x[k]], r[c.stab[k][0]], r[c.stab[k][1]] = 1, -1, 1
	}
	for j := range m.eng {
		if !c.used[j] {
			continue
		}
		e := &m.eng[j]
		r := newRow(0)
		for k := range m.arcs {
			if m.arcs[k].j == j {
				r[c.x[k]] = m.arcs[k].r
			}
		}
		r[c.y[j]] = -e.limit
		r = newRow(1)
		r[c.y[j]], r[c.capSlack[j]] = 1, 1
		for s, ys := range tangents[j] {
			g := e.cost(ys)
			g1, _ := e.marginal(ys)
			// t − g1·Y − slack = g − g1·ys, with t in cost units and Y = limit·y
			r = newRow((g - g1*ys) / c.scale)
			r[c.t[j]], r[c.y[j]], r[c.tanSlack[j][s]] = 1, -g1*e.limit/c.scale, -1
		}
	}
	A := mat.NewDense(len(rows), n, nil)
	for i, r := range rows {
		A.SetRow(i, r)
	}
	return A, rhs
}

// lpStore takes the LP's solution x into the model: arc flows, shed
// rates, then loads and duals.
func (m *model) lpStore(c *lpCols, x []float64) {
	for k := range m.arcs {
		m.arcs[k].x = math.Max(0, x[c.x[k]])
	}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for p := 0; p < m.nPri; p++ {
			b.s[p] = 0
			if col := c.shed[bi][p]; col >= 0 {
				b.s[p] = math.Max(0, x[col])
			}
		}
	}
	// The demand duals: the cheapest marginal cost among used arcs,
	// computed once loads are known.
	m.loads()
	m.lpDuals()
}

// lpDuals fills the demand duals ν and capacity prices λ from the primal
// solution of the reference LP, using the exact marginal costs (base =
// a + r·G'(Y), plus the stability charge of one more request, up). The
// duals are propagated over the graph of flows and full engines: a flow's
// ν is known from a used arc to an engine below its limit (the smallest
// base + up among them) or from a partly shed priority (its shed cost); a
// full engine's λ is the largest gap (ν − base − up)/r among its users
// whose ν is known; a flow whose used arcs all go to full engines then
// gets ν from the smallest base + r·λ + up among those with λ known, and so
// on. Engines the propagation does not reach keep λ = 0. flowPrice later
// recomputes ν from these λ as the cheapest route.
func (m *model) lpDuals() {
	m.cacheMarginals()
	full := make([]bool, len(m.eng))
	lamKnown := make([]bool, len(m.eng))
	for j := range m.eng {
		e := &m.eng[j]
		e.lam, e.rho = 0, 0
		full[j] = e.C > 0 && e.y >= e.limit*(1-1e-9)
		lamKnown[j] = !full[j]
	}
	used := func(b *block, a *arc) bool { return a.x > 1e-12*b.d }
	nuKnown := make([]bool, len(m.blocks))
	for bi := range m.blocks {
		b := &m.blocks[bi]
		b.nu = math.Inf(1)
		for p, s := range b.s {
			if s > 1e-9*b.d && s < b.dp[p]*(1-1e-9) {
				b.nu = math.Min(b.nu, m.shed[p])
			}
		}
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			if used(b, a) && !full[a.j] {
				base, up, _ := m.marginals(b, a) // λ = 0 here
				b.nu = math.Min(b.nu, base+up)
			}
		}
		nuKnown[bi] = !math.IsInf(b.nu, 1)
	}
	for changed := true; changed; {
		changed = false
		// λ of full engines from users with a known ν
		for j := range m.eng {
			if lamKnown[j] {
				continue
			}
			lam, found := 0.0, false
			for bi := range m.blocks {
				b := &m.blocks[bi]
				if !nuKnown[bi] {
					continue
				}
				for k := b.lo; k < b.hi; k++ {
					a := &m.arcs[k]
					if a.j != j || !used(b, a) {
						continue
					}
					base, up, _ := m.marginals(b, a) // e.lam is still 0
					lam, found = math.Max(lam, (b.nu-base-up)/a.r), true
				}
			}
			if found {
				m.eng[j].lam, lamKnown[j], changed = lam, true, true
			}
		}
		// ν of flows whose used arcs reach an engine with a known λ
		for bi := range m.blocks {
			if nuKnown[bi] {
				continue
			}
			b := &m.blocks[bi]
			for k := b.lo; k < b.hi; k++ {
				a := &m.arcs[k]
				if used(b, a) && lamKnown[a.j] {
					base, up, _ := m.marginals(b, a)
					b.nu = math.Min(b.nu, base+up)
				}
			}
			if !math.IsInf(b.nu, 1) {
				nuKnown[bi], changed = true, true
			}
		}
	}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		if math.IsInf(b.nu, 1) {
			b.nu = 0
		}
	}
}

type lpState struct {
	x   []float64
	s   [][]float64
	nu  []float64
	lam []float64
}

func (m *model) save(st *lpState) *lpState {
	if st == nil {
		st = &lpState{x: make([]float64, len(m.arcs)), s: make([][]float64, len(m.blocks)),
			nu: make([]float64, len(m.blocks)), lam: make([]float64, len(m.eng))}
		for bi := range m.blocks {
			st.s[bi] = make([]float64, m.nPri)
		}
	}
	for k := range m.arcs {
		st.x[k] = m.arcs[k].x
	}
	for bi := range m.blocks {
		copy(st.s[bi], m.blocks[bi].s)
		st.nu[bi] = m.blocks[bi].nu
	}
	for j := range m.eng {
		st.lam[j] = m.eng[j].lam
	}
	return st
}

func (m *model) restore(st *lpState) {
	for k := range m.arcs {
		m.arcs[k].x = st.x[k]
	}
	for bi := range m.blocks {
		copy(m.blocks[bi].s, st.s[bi])
		m.blocks[bi].nu = st.nu[bi]
	}
	for j := range m.eng {
		m.eng[j].lam = st.lam[j]
	}
	m.loads()
}
