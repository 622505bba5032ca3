package optimizer

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
)

// Pooling: engines that no flow can tell apart — the same profile, the same
// round trip from every frontend, the same eligibility for every class —
// are merged into one pool engine whose capacity is the sum of theirs. For
// such engines the latency-optimal split of a pool's load is at equal
// utilization (G_j(Y) = C_j·g(Y/C_j) with a common g), which makes
// G_pool(Y) = C_pool·g(Y/C_pool) exact; the pooled stability term
// |Σ_j x − Σ_j x0| is at most the per-engine one. So the pooled problem is a
// relaxation with the same routing cost: its lower bound is valid for the
// engine-level problem, and its solution, split back to engines at equal
// utilization and as close to the last allocation as possible, is the
// engine-level answer up to the stability term (which a few engine-level
// sweeps then polish).
type pooling struct {
	pool    []int   // engine → pool index, -1 for engines without capacity
	members [][]int // pool → engines
	group   []int   // frontend → frontend group
	problem *Problem
}

// Frontends with the same round trip to every engine and the same request
// shapes are merged too: their flows are interchangeable, so summing their
// demand (and their last allocations) is again a relaxation, and splitting
// the merged flow back in proportion to demand gives identical frontends
// identical weights.
func (m *model) groupFrontends() (group []int, reps []int) {
	p := m.p
	group = make([]int, len(p.Frontends))
	byKey := map[uint64][]int{}
	h := fnv.New64a()
	var buf [8]byte
	for i := range p.Frontends {
		h.Reset()
		for _, v := range p.RTTMs[i] {
			u := math.Float64bits(v)
			for k := 0; k < 8; k++ {
				buf[k] = byte(u >> (8 * k))
			}
			h.Write(buf[:])
		}
		for _, d := range p.Demand[i] {
			for _, v := range []float64{d.PromptTokens, d.OutputTokens, d.CachedPromptShare} {
				u := math.Float64bits(v)
				for k := 0; k < 8; k++ {
					buf[k] = byte(u >> (8 * k))
				}
				h.Write(buf[:])
			}
		}
		key := h.Sum64()
		found := -1
		for _, g := range byKey[key] {
			if m.sameFrontend(reps[g], i) {
				found = g
				break
			}
		}
		if found < 0 {
			found = len(reps)
			reps = append(reps, i)
			byKey[key] = append(byKey[key], found)
		}
		group[i] = found
	}
	return group, reps
}

func (m *model) sameFrontend(i, k int) bool {
	p := m.p
	for j := range p.RTTMs[i] {
		if p.RTTMs[i][j] != p.RTTMs[k][j] {
			return false
		}
	}
	for c := range p.Demand[i] {
		if p.FlowShape(i, c) != p.FlowShape(k, c) {
			return false
		}
	}
	return true
}

func (m *model) poolKey(j int) uint64 {
	p := m.p
	h := fnv.New64a()
	var buf [8]byte
	put := func(v float64) {
		u := math.Float64bits(v)
		for k := 0; k < 8; k++ {
			buf[k] = byte(u >> (8 * k))
		}
		h.Write(buf[:])
	}
	pr := &p.Engines[j].Profile
	for _, v := range []float64{pr.CapacityRPS, pr.PromptTokenSec, pr.OutputTokenSec, pr.RefPromptTokens, pr.RefOutputTokens,
		pr.PrefillTokensPerS, pr.TTFT.Base, pr.TTFT.Linear, pr.TTFT.Queue, pr.TBOT.Base, pr.TBOT.Linear, pr.TBOT.Queue,
		pr.Batch.DecodeStepMs, pr.Batch.DecodeStepPerSeqMs, float64(pr.Batch.MaxRunning), float64(pr.Batch.KVCapacityTokens)} {
		put(v)
	}
	put(p.PenaltyCostMs * p.Engines[j].Penalty)
	put(p.Engines[j].MaxUtilization)
	for i := range p.RTTMs {
		put(p.RTTMs[i][j])
	}
	for c := range p.Classes {
		if m.eligible[c][j] {
			put(1)
		} else {
			put(0)
		}
	}
	return h.Sum64()
}

func (m *model) sameEngine(j, k int) bool {
	p := m.p
	if p.Engines[j].Profile != p.Engines[k].Profile {
		return false
	}
	// With a per-request penalty cost, engines of different penalties are
	// not interchangeable.
	if p.PenaltyCostMs*p.Engines[j].Penalty != p.PenaltyCostMs*p.Engines[k].Penalty {
		return false
	}
	// Engines of different caps (the balance bound) are not either.
	if p.Engines[j].MaxUtilization != p.Engines[k].MaxUtilization {
		return false
	}
	for i := range p.RTTMs {
		if p.RTTMs[i][j] != p.RTTMs[i][k] {
			return false
		}
	}
	for c := range p.Classes {
		if m.eligible[c][j] != m.eligible[c][k] {
			return false
		}
	}
	return true
}

// pool returns the pooled problem, or nil when no two engines merge.
func (m *model) pool() *pooling {
	p := m.p
	m.eligible = make([][]bool, len(p.Classes))
	for c := range p.Classes {
		m.eligible[c] = make([]bool, len(p.Engines))
		for _, j := range p.Classes[c].Eligible {
			m.eligible[c][j] = true
		}
	}
	pl := m.poolEngines()
	var reps []int
	pl.group, reps = m.groupFrontends()
	if len(pl.members) >= len(p.Engines)*3/4 && len(reps) >= len(p.Frontends)*3/4 {
		return nil // not worth it
	}
	q := &Problem{
		Priorities: p.Priorities,
		Headroom:   p.Headroom, StabilityMs: p.StabilityMs, RemapFactor: p.RemapFactor, MarginalStretch: p.MarginalStretch,
		PenaltyCostMs: p.PenaltyCostMs,
	}
	q.Frontends, q.Demand = pooledDemand(p, pl, reps)
	q.Engines = m.pooledEngines(pl)
	for c := range p.Classes {
		cl := p.Classes[c]
		seen := map[int]bool{}
		var el []int
		for _, j := range cl.Eligible {
			if k := pl.pool[j]; k >= 0 && !seen[k] {
				seen[k] = true
				el = append(el, k)
			}
		}
		cl.Eligible = el
		q.Classes = append(q.Classes, cl)
	}
	q.RTTMs = make([][]float64, len(reps))
	for g, i := range reps {
		q.RTTMs[g] = make([]float64, len(pl.members))
		for k, mem := range pl.members {
			q.RTTMs[g][k] = p.RTTMs[i][mem[0]]
		}
	}
	if p.Last != nil && p.Last.Weights != nil {
		q.Last = pooledLast(p, q, pl)
	}
	pl.problem = q
	return pl
}

// poolEngines puts interchangeable engines with capacity (sameEngine) in
// one pool each; engines without capacity are in none (-1).
func (m *model) poolEngines() *pooling {
	p := m.p
	pl := &pooling{pool: make([]int, len(p.Engines))}
	byKey := map[uint64][]int{} // key → pools
	for j := range p.Engines {
		pl.pool[j] = -1
		if !(m.eng[j].C > 0) {
			continue
		}
		key := m.poolKey(j)
		found := -1
		for _, q := range byKey[key] {
			if m.sameEngine(pl.members[q][0], j) {
				found = q
				break
			}
		}
		if found < 0 {
			found = len(pl.members)
			pl.members = append(pl.members, nil)
			byKey[key] = append(byKey[key], found)
		}
		pl.members[found] = append(pl.members[found], j)
		pl.pool[j] = found
	}
	return pl
}

// pooledDemand is one frontend per group (reps: each group's
// representative), with the summed demand of its members.
func pooledDemand(p *Problem, pl *pooling, reps []int) ([]Frontend, [][]Demand) {
	fronts := make([]Frontend, 0, len(reps))
	demand := make([][]Demand, len(reps))
	for g, i := range reps {
		fronts = append(fronts, Frontend{ID: fmt.Sprintf("group%d", g)})
		demand[g] = make([]Demand, len(p.Classes))
		for c := range p.Classes {
			demand[g][c] = Demand{RatePerS: make([]float64, len(p.Priorities)),
				PromptTokens: p.Demand[i][c].PromptTokens, OutputTokens: p.Demand[i][c].OutputTokens,
				CachedPromptShare: p.Demand[i][c].CachedPromptShare}
		}
	}
	for i := range p.Frontends {
		for c := range p.Classes {
			for k, r := range p.Demand[i][c].RatePerS {
				demand[pl.group[i]][c].RatePerS[k] += r
			}
		}
	}
	return fronts, demand
}

// pooledEngines is one engine per pool, whose capacity is its members'.
func (m *model) pooledEngines(pl *pooling) []Engine {
	p := m.p
	var out []Engine
	for k, mem := range pl.members {
		e0 := &p.Engines[mem[0]]
		c := 0.0
		for _, j := range mem {
			c += m.eng[j].C
		}
		// Members share the per-request penalty cost (the pool key includes
		// it); the pooled engine carries the penalty so the cost applies,
		// with its units scaled so its capacity stays the members' sum.
		pen := 0.0
		if p.PenaltyCostMs > 0 && e0.Penalty > 0 && e0.Penalty < 1 {
			pen = e0.Penalty
		}
		units := c / (e0.Profile.CapacityRPS * (1 - pen))
		out = append(out, Engine{ID: fmt.Sprintf("pool%d", k), Profile: e0.Profile,
			Replicas: units, ReadyReplicas: units, Health: 1, Penalty: pen, MaxUtilization: e0.MaxUtilization})
	}
	return out
}

// pooledLast is the pooled problem q's last weights: demand-weighted sums,
// normalized by the group's demand (x0 = d·w is what the model charges
// against).
func pooledLast(p, q *Problem, pl *pooling) *Allocation {
	last := &Allocation{Weights: map[string]map[string]map[string]float64{}}
	eng := make(map[string]int, len(p.Engines))
	for j := range p.Engines {
		eng[p.Engines[j].ID] = j
	}
	var js []int
	for i, f := range p.Frontends {
		byClass := p.Last.Weights[f.ID]
		if byClass == nil {
			continue
		}
		g := pl.group[i]
		gid := q.Frontends[g].ID
		for c, cl := range p.Classes {
			w := byClass[cl.ID]
			dg := q.Demand[g][c].Total()
			if w == nil || !(dg > 0) {
				continue
			}
			qm := last.Weights[gid]
			if qm == nil {
				qm = map[string]map[string]float64{}
				last.Weights[gid] = qm
			}
			qw := qm[cl.ID]
			if qw == nil {
				qw = map[string]float64{}
				qm[cl.ID] = qw
			}
			di := p.Demand[i][c].Total()
			// sum in engine order (map order would make the floating
			// point sums, and so the output, vary from run to run)
			js = js[:0]
			for id := range w {
				if j, ok := eng[id]; ok && pl.pool[j] >= 0 {
					js = append(js, j)
				}
			}
			sort.Ints(js)
			for _, j := range js {
				qw[q.Engines[pl.pool[j]].ID] += w[p.Engines[j].ID] * di / dg
			}
		}
	}
	return last
}

// disaggregate sets the engine-level model's flows from the solved pooled
// model pm: each pool's load is split over its engines at equal
// utilization, and each flow's share of a pool goes first where its last
// allocation was, then in proportion to the engines' remaining room.
func (m *model) disaggregate(pm *model, pl *pooling) {
	// engine-level block → pooled block
	pidx := make(map[[2]int]int, len(pm.blocks))
	for bi := range pm.blocks {
		pidx[[2]int{pm.blocks[bi].i, pm.blocks[bi].c}] = bi
	}
	toPooled := make([]int, len(m.blocks))
	for bi := range m.blocks {
		b := &m.blocks[bi]
		pbi := pidx[[2]int{pl.group[b.i], b.c}]
		toPooled[bi] = pbi
		pb := &pm.blocks[pbi]
		for k := range b.s {
			if pb.dp[k] > 0 {
				b.s[k] = pb.s[k] * b.dp[k] / pb.dp[k]
			}
		}
		b.nu = pb.nu
		for k := b.lo; k < b.hi; k++ {
			m.arcs[k].x = 0
		}
	}
	for j := range m.eng {
		if k := pl.pool[j]; k >= 0 {
			m.eng[j].lam = pm.eng[k].lam
		}
	}
	// Per engine-level block, the pooled x per pool (dense: blocks × pools
	// is small next to the arcs).
	np := len(pl.members)
	px := make([]float64, len(m.blocks)*np)
	for bi := range m.blocks {
		pb := &pm.blocks[toPooled[bi]]
		share := m.blocks[bi].d / pb.d
		for k := pb.lo; k < pb.hi; k++ {
			px[bi*np+pm.arcs[k].j] = pm.arcs[k].x * share
		}
	}
	// room: each engine's target load, Y_pool·C_j/C_pool
	cq := make([]float64, np)
	for j := range m.eng {
		if q := pl.pool[j]; q >= 0 {
			cq[q] += m.eng[j].C
		}
	}
	room := make([]float64, len(m.eng))
	for j := range m.eng {
		if q := pl.pool[j]; q >= 0 {
			room[j] = pm.eng[q].y * m.eng[j].C / cq[q]
		}
	}
	// 1. keep each flow's last allocation inside the pool, scaled down to
	// its need (in load units z = r·x)
	z0 := make([]float64, len(m.blocks)*np)
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			if q := pl.pool[a.j]; q >= 0 {
				z0[bi*np+q] += a.r * a.x0
			}
		}
	}
	left := make([]float64, len(m.blocks)*np) // remaining need in z units
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			q := pl.pool[a.j]
			if q < 0 {
				continue
			}
			need := a.r * px[bi*np+q]
			if z0[bi*np+q] > 0 && need > 0 && a.x0 > 0 {
				z := math.Min(a.r*a.x0*math.Min(1, need/z0[bi*np+q]), room[a.j])
				a.x = z / a.r
				room[a.j] -= z
			}
		}
		for k := b.lo; k < b.hi; k++ { // left starts at 0 (fresh slice)
			a := &m.arcs[k]
			if q := pl.pool[a.j]; q >= 0 {
				left[bi*np+q] -= a.r * a.x
			}
		}
		for q := 0; q < np; q++ {
			if v := px[bi*np+q]; v > 0 {
				// r is the same for every engine of a pool
				left[bi*np+q] += m.ratio(bi, q, pl) * v
			}
		}
	}
	// 2. the rest of each need in proportion to the engines' remaining room
	totalRoom := make([]float64, np)
	for j := range m.eng {
		if q := pl.pool[j]; q >= 0 {
			totalRoom[q] += math.Max(0, room[j])
		}
	}
	for bi := range m.blocks {
		b := &m.blocks[bi]
		for k := b.lo; k < b.hi; k++ {
			a := &m.arcs[k]
			q := pl.pool[a.j]
			if q < 0 {
				continue
			}
			if l := left[bi*np+q]; l > 0 && totalRoom[q] > 0 {
				a.x += l * math.Max(0, room[a.j]) / totalRoom[q] / a.r
			}
		}
	}
	m.loads()
}

// ratio is block bi's work ratio r on pool q's engines.
func (m *model) ratio(bi, q int, pl *pooling) float64 {
	b := &m.blocks[bi]
	pr := &m.p.Engines[pl.members[q][0]].Profile
	return pr.Ratio(b.shape)
}
