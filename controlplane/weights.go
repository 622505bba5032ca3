package controlplane

import (
	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/optimizer"
)

// propose is one (frontend, class)'s decision before the deadband: every
// eligible engine with the allocator's weight (0 if none), raised to a
// probe share for penalized engines that are up; the shed fractions by
// priority (consistent across levels); the class's planned utilization
// (its weights times the engines' solved utilization, unrounded).
func (c *Controller) propose(node string, cl fleet.Class, sol *optimizer.Solution, eng engineStep, engUtil map[string]float64) (cd *ClassDecision, flow *optimizer.Flow, util float64) {
	f := &c.problem
	flow = sol.Flow(node, cl.Name)
	cd = &ClassDecision{Class: cl.Name, Proposed: map[string]float64{}, Shed: map[string]float64{},
		shedLevels: map[uint32]float64{}, Health: map[string]string{}}
	for _, j := range f.eligible[cl.Name] {
		id := f.engines[j].ID
		cd.Proposed[id] = 0
		cd.Health[id] = eng.health[id].String()
	}
	if flow != nil {
		cd.Flow, cd.Demand, cd.Explain = flow, flow.DemandPerS, flow.Weights
		for _, w := range flow.Weights {
			cd.Proposed[w.Engine] = w.Weight
			util += w.Weight * engUtil[w.Engine]
		}
		c.probe(cd.Proposed, cd.Demand, c.penalties, eng.up, func(id string) bool { return c.nearestProber(node, cl.Name, id, sol) })
		for _, s := range flow.Shed {
			if s.Fraction > 0 {
				cd.shedLevels[f.levelOf[s.Priority]] = s.Fraction
			}
		}
		cd.shedLevels = consistentShed(cd.shedLevels, f.tprios)
		for _, pr := range f.tprios {
			if fr, ok := cd.shedLevels[pr.Level]; ok {
				cd.Shed[pr.Name] = fr
			}
		}
	}
	cd.Weights = cd.Proposed
	return cd, flow, util
}

// nearestProber reports whether node is, among the frontends with demand
// for the class, one of those nearest (least round trip) to the engine:
// only they send a penalized engine its probe share. Every frontend
// probing every penalized engine would send each remote one up to a
// tenth of the frontend's traffic across regions: with a few engines
// penalized, a large share of a class would go to another region that the
// plan never chose (docs/decisions/noisy-ttft-penalties.md). An engine unknown to the fleet is probed by every node.
func (c *Controller) nearestProber(node, class, engine string, sol *optimizer.Solution) bool {
	f := &c.problem
	i, ok := f.nodeIdx[node]
	j, ok2 := f.engineIdx[engine]
	if !ok || !ok2 {
		return true
	}
	if c.demandingSol != sol {
		// The nodes with demand per class, once per solution (Flow is a
		// scan of every flow).
		c.demandingSol, c.demanding = sol, map[string]map[string]bool{}
		for _, fl := range sol.Flows {
			if fl.DemandPerS > 0 {
				if c.demanding[fl.Class] == nil {
					c.demanding[fl.Class] = map[string]bool{}
				}
				c.demanding[fl.Class][fl.Frontend] = true
			}
		}
	}
	for k, fe := range f.frontends {
		if f.rtt[k][j] < f.rtt[i][j] && c.demanding[class][fe.NodeID] {
			return false // a nearer frontend has traffic to probe with
		}
	}
	return true
}

// heldOnProposed restricts held weights to the engines eligible now (the
// proposal's), at 0 for an eligible engine the held ones did not list.
func heldOnProposed(held, proposed map[string]float64) map[string]float64 {
	w := map[string]float64{}
	for id := range proposed {
		w[id] = 0
	}
	for id, v := range held {
		if _, ok := w[id]; ok {
			w[id] = v
		}
	}
	return w
}
