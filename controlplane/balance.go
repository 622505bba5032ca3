package controlplane

import (
	"context"
	"fmt"

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
// more, which in the simulator's overload kept the tail shorter: refusing
// it took seed 105's p99 from 1.53 to 2.40 s), and balance says why (the cycle's Result shows it, so a
// bound that never applies is not silent). It records the engines whose cap
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
	caps := balanceCaps(sol, c.cfg.BalanceFactor, headroom, pools, restrictedLoad(p, sol, pools))
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
	if sheds(s2) && !sheds(sol) {
		return sol, "bounded plan would shed where the unbounded one does not"
	}
	for j, e := range s2.Engines {
		if caps[j] > 0 && e.LoadRPS >= caps[j]*e.CapacityRPS*(1-1e-3) {
			c.capped[e.ID] = true
		}
	}
	return s2, ""
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

// restrictedLoad is each engine's planned load (reference req/s, as
// EngineResult.LoadRPS) of classes that not every engine of its pool may
// serve.
func restrictedLoad(p *optimizer.Problem, sol *optimizer.Solution, pools []int) []float64 {
	size := map[int]int{}
	for _, k := range pools {
		size[k]++
	}
	idx := make(map[string]int, len(p.Engines))
	for j, e := range p.Engines {
		idx[e.ID] = j
	}
	classIdx := make(map[string]int, len(p.Classes))
	for c, cl := range p.Classes {
		classIdx[cl.ID] = c
	}
	frontIdx := make(map[string]int, len(p.Frontends))
	for i, fe := range p.Frontends {
		frontIdx[fe.ID] = i
	}
	// restricted[c][pool]: class c is eligible on only part of the pool.
	restricted := make([]map[int]bool, len(p.Classes))
	for c, cl := range p.Classes {
		n := map[int]int{}
		for _, j := range cl.Eligible {
			n[pools[j]]++
		}
		restricted[c] = map[int]bool{}
		for k, m := range n {
			restricted[c][k] = m < size[k]
		}
	}
	out := make([]float64, len(p.Engines))
	for _, fl := range sol.Flows {
		c := classIdx[fl.Class]
		for _, w := range fl.Weights {
			j := idx[w.Engine]
			if !restricted[c][pools[j]] {
				continue
			}
			pr := &p.Engines[j].Profile
			if rc := pr.Capacity(p.FlowShape(frontIdx[fl.Frontend], c)); rc > 0 {
				out[j] += w.RatePerS * pr.CapacityRPS / rc
			}
		}
	}
	return out
}

// balanceCaps returns each engine's utilization cap: β × its pool's
// planned load of the traffic all of it may serve, over the pool's
// capacity, plus the engine's own restricted load over its capacity (0:
// no cap, where that is at or above the headroom or the pool plans
// nothing); or nil when every engine is within its cap already (the plan
// stands, no second solve).
func balanceCaps(sol *optimizer.Solution, beta, headroom float64, pools []int, restricted []float64) []float64 {
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
		u := beta*load[k]/capa[k] + restricted[j]/e.CapacityRPS
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
