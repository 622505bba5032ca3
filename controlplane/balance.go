package controlplane

import (
	"context"
	"fmt"
	"math"

	"github.com/inferlb/inferlb/optimizer"
)

// balance applies Config.BalanceFactor β to a solved plan: it caps every
// engine at β × its pool's mean planned utilization and solves again. A
// pool is the engines of one region linked by the classes they serve
// (balancePools); the mean is capacity-weighted (the pool's planned load
// over its capacity), of the traffic every engine of the pool may serve.
// Traffic of a class only some of the pool may serve (a long-context class
// on the region's H100s) stays where the optimizer put it: it lifts its
// engine's cap by its own load, so the bound never forces it out of the
// region. So the bound redistributes what the optimizer already sends to a
// region among its engines rather than pushing traffic across regions
// merely to balance: the caps of a pool add up to at least β × its
// planned load, so the region can keep all of it, and a round trip to
// another region costs more than a slower local GPU. Caps at or above
// the headroom are no caps. When the bounded plan fails, or sheds where
// the unbounded did not, the unbounded plan stands (balance never sheds a
// fleet that can serve everything; under overload a bounded plan may shed
// more, and it is kept: the extra shedding keeps the tail shorter in the
// simulator's overload scenario; docs/decisions/balance-bound.md), and
// balance says why
// (the cycle's Result shows it, so a bound that never applies is not
// silent). It records the engines whose cap
// binds (c.capped) for the deadband.
func (c *Controller) balance(ctx context.Context, p *optimizer.Problem, headroom float64, sol *optimizer.Solution) (*optimizer.Solution, string) {
	f := &c.problem
	regions := make([]string, len(p.Engines))
	for j, e := range p.Engines {
		regions[j] = e.ID // unknown to the fleet: a pool of its own
		if k, ok := f.engineIdx[e.ID]; ok {
			regions[j] = f.engines[k].Region
		}
	}
	pools := balancePools(regions, p.Classes)
	restricted, even := poolLoads(p, sol, pools)
	caps := balanceCaps(sol, c.cfg.BalanceFactor, headroom, pools, restricted, even)
	if caps == nil {
		return sol, ""
	}
	q := *p
	q.Headroom = headroom
	q.Engines = make([]optimizer.Engine, len(p.Engines))
	copy(q.Engines, p.Engines)
	for j := range q.Engines {
		q.Engines[j].MaxUtilization = caps[j]
	}
	s2, err := c.alloc.Allocate(ctx, &q)
	if err != nil {
		return sol, fmt.Sprintf("bounded plan failed: %v", err)
	}
	if sheds(s2) && !sheds(sol) && liftForShed(&q, s2, headroom) {
		if s2, err = c.alloc.Allocate(ctx, &q); err != nil {
			return sol, fmt.Sprintf("bounded plan failed: %v", err)
		}
	}
	if sheds(s2) && !sheds(sol) {
		return sol, "bounded plan would shed where the unbounded one does not"
	}
	// The caps s2 was solved under are q's (liftForShed may have raised
	// some).
	for j, e := range s2.Engines {
		if u := q.Engines[j].MaxUtilization; u > 0 && e.LoadRPS >= u*e.CapacityRPS*(1-1e-3) {
			c.capped[e.ID] = true
		}
	}
	return s2, ""
}

// liftForShed makes room, under the caps of the bounded problem q, for
// the traffic its plan sol shed: every engine eligible for a shed flow's
// class has its cap raised by that traffic's utilization on it (a cap
// reaching the headroom is dropped), and it reports whether any cap moved.
//
// Why: with every engine at its cap, the few engines a restricted class may
// use (the H100s of a long-context class) are full of the traffic everyone
// may serve, and the optimizer sheds the restricted flow rather than pay
// to move that traffic elsewhere. Without the lift the whole unbounded plan
// would stand for that cycle and the bounded one come back the next: even
// a tiny long-context flow would flip every frontend's weights for a
// cycle, again and again, remapping the prefixes their keys had cached.
// The lift is at most the shed
// traffic's own load on each engine, so the bound loosens by no more than
// the work it crowded out.
func liftForShed(q *optimizer.Problem, sol *optimizer.Solution, headroom float64) bool {
	classIdx, frontIdx := problemIndex(q)
	lifted := false
	for _, fl := range sol.Flows {
		rate := 0.0
		for _, sh := range fl.Shed {
			rate += sh.RatePerS
		}
		c, ok := classIdx[fl.Class]
		if !(rate > 1e-9) || !ok {
			continue
		}
		shape := q.FlowShape(frontIdx[fl.Frontend], c)
		for _, j := range q.Classes[c].Eligible {
			e := &q.Engines[j]
			capa := sol.Engines[j].CapacityRPS
			rc := e.Profile.Capacity(shape)
			if !(e.MaxUtilization > 0) || !(rc > 0) || !(capa > 0) {
				continue
			}
			e.MaxUtilization += rate * e.Profile.CapacityRPS / rc / capa
			if e.MaxUtilization >= headroom {
				e.MaxUtilization = 0
			}
			lifted = true
		}
	}
	return lifted
}

// problemIndex maps a problem's class and frontend ids to their indices
// (a solution names flows by id; FlowShape takes indices).
func problemIndex(p *optimizer.Problem) (classIdx, frontIdx map[string]int) {
	classIdx = make(map[string]int, len(p.Classes))
	for c, cl := range p.Classes {
		classIdx[cl.ID] = c
	}
	frontIdx = make(map[string]int, len(p.Frontends))
	for i, fe := range p.Frontends {
		frontIdx[fe.ID] = i
	}
	return classIdx, frontIdx
}

// balancePools numbers each engine's balance pool: engines of one region
// are in one pool when a class may use both, directly or through other
// engines of the region (an H100 serving a long-context class and the
// general one shares a pool with the A100s serving only the general one).
// An engine no class may use is a pool of its own.
func balancePools(regions []string, classes []optimizer.Class) []int {
	parent := make([]int, len(regions))
	for j := range parent {
		parent[j] = j
	}
	find := func(j int) int {
		for parent[j] != j {
			parent[j] = parent[parent[j]]
			j = parent[j]
		}
		return j
	}
	for _, cl := range classes {
		first := map[string]int{} // region → first eligible engine seen
		for _, j := range cl.Eligible {
			if k, ok := first[regions[j]]; ok {
				parent[find(j)] = find(k)
			} else {
				first[regions[j]] = j
			}
		}
	}
	out := make([]int, len(regions))
	for j := range out {
		out[j] = find(j)
	}
	return out
}

// poolLoads returns each engine's planned load (reference req/s, as
// EngineResult.LoadRPS) of classes that not every engine of its pool may
// serve, and per pool (indexed by pool number) the utilization at which
// the pool's other traffic would load every engine of the pool alike: u*
// with Σ_j u*·C_j over the mix's work on j = the pool's requests, i.e.
// 1 / Σ_j 1/U_j, where U_j = Σ_f R_f / capacity_j(f) is the utilization j
// would have serving all of it alone. The planned load over the pool's
// capacity is not that figure: a flow's work depends on the engine (a long
// prompt costs an A100 relatively more of its capacity than an H100), so
// traffic moved from the engines the plan prefers onto the others needs
// more of their reference capacity than it took, and caps of β × the
// planned utilization would leave no room for it: the bounded plan would
// shed (every cycle, where the objective packs the fast engines), and the
// unbounded plan would stand.
func poolLoads(p *optimizer.Problem, sol *optimizer.Solution, pools []int) (restricted []float64, even map[int]float64) {
	size := map[int]int{}
	for _, k := range pools {
		size[k]++
	}
	idx := make(map[string]int, len(p.Engines))
	for j, e := range p.Engines {
		idx[e.ID] = j
	}
	classIdx, frontIdx := problemIndex(p)
	// restricted[c][pool]: class c is eligible on only part of the pool.
	restrictedIn := make([]map[int]bool, len(p.Classes))
	for c, cl := range p.Classes {
		n := map[int]int{}
		for _, j := range cl.Eligible {
			n[pools[j]]++
		}
		restrictedIn[c] = map[int]bool{}
		for k, m := range n {
			restrictedIn[c][k] = m < size[k]
		}
	}
	restricted = make([]float64, len(p.Engines))
	alone := make([]float64, len(p.Engines)) // U_j
	for _, fl := range sol.Flows {
		c := classIdx[fl.Class]
		shape := p.FlowShape(frontIdx[fl.Frontend], c)
		pr := map[int]float64{} // the flow's rate per pool of unrestricted traffic
		for _, w := range fl.Weights {
			j := idx[w.Engine]
			if !restrictedIn[c][pools[j]] {
				pr[pools[j]] += w.RatePerS
				continue
			}
			prof := &p.Engines[j].Profile
			if rc := prof.Capacity(shape); rc > 0 {
				restricted[j] += w.RatePerS * prof.CapacityRPS / rc
			}
		}
		for k, rate := range pr {
			for j := range p.Engines {
				if pools[j] != k || !(sol.Engines[j].CapacityRPS > 0) {
					continue
				}
				prof := &p.Engines[j].Profile
				// The engine's capacity for this shape, scaled as its
				// CapacityRPS is from the profile's (replicas, health).
				rc := prof.Capacity(shape)
				if !(rc > 0) || !(prof.CapacityRPS > 0) {
					alone[j] = math.Inf(1)
					continue
				}
				alone[j] += rate / (rc * sol.Engines[j].CapacityRPS / prof.CapacityRPS)
			}
		}
	}
	inv := map[int]float64{}
	for j, u := range alone {
		if u > 0 {
			inv[pools[j]] += 1 / u
		}
	}
	even = make(map[int]float64, len(inv))
	for k, s := range inv {
		if s > 0 {
			even[k] = 1 / s
		}
	}
	return restricted, even
}

// balanceCaps returns each engine's utilization cap: β × its pool's
// even utilization (poolLoads; where even has no entry for the pool, its
// planned load of the traffic all of it may serve over its capacity), plus the engine's own restricted load over its capacity (0:
// no cap, where that is at or above the headroom or the pool plans
// nothing); or nil when every engine is within its cap already (the plan
// stands, no second solve).
func balanceCaps(sol *optimizer.Solution, beta, headroom float64, pools []int, restricted []float64, even map[int]float64) []float64 {
	load, capa := make([]float64, len(pools)), make([]float64, len(pools))
	for j, e := range sol.Engines {
		load[pools[j]] += e.LoadRPS - restricted[j]
		capa[pools[j]] += e.CapacityRPS
	}
	caps := make([]float64, len(sol.Engines))
	over := false
	for j, e := range sol.Engines {
		k := pools[j]
		if !(capa[k] > 0) || !(load[k] > 0) || !(e.CapacityRPS > 0) {
			continue
		}
		mean := load[k] / capa[k]
		if u, ok := even[k]; ok {
			mean = u
		}
		u := beta*mean + restricted[j]/e.CapacityRPS
		if u >= headroom {
			continue
		}
		caps[j] = u
		if e.LoadRPS > u*e.CapacityRPS*(1+1e-6) {
			over = true
		}
	}
	if !over {
		return nil
	}
	return caps
}

// balanceHolds reports whether keeping held instead of proposed would
// leave more than tv of the flow on engines the balance bound capped this
// cycle: the deadband's latency pricing knows no bound (an unbalanced
// plan is always cheaper), so without this rule it held the unbalanced
// weights for ever.
func (c *Controller) balanceHolds(held, proposed map[string]float64, tv float64) bool {
	over := 0.0
	for id := range c.capped {
		if d := held[id] - proposed[id]; d > 0 {
			over += d
		}
	}
	return over > tv
}
