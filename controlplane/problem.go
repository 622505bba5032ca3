package controlplane

import (
	"context"
	"fmt"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/optimizer"
)

// buildProblem is step 3's input: the fleet (RTTs, eligibility, learned
// class shapes, priorities), the engines as assessed, the smoothed demand
// per (frontend, class, priority) and the published weights as Last
// (except for classes an engine of which recovered, or had its profile
// correction move past correctionReplan).
func (c *Controller) buildProblem(eng engineStep, demand map[signals.DemandKey]signals.DemandRate) *optimizer.Problem {
	f := &c.problem
	p := &optimizer.Problem{Headroom: c.cfg.Headroom, StabilityMs: c.cfg.StabilityMs, PenaltyCostMs: c.cfg.PenaltyCostMs,
		MarginalStretch: c.cfg.MarginalStretch, Engines: eng.problem}
	for _, pr := range f.priorities {
		p.Priorities = append(p.Priorities, optimizer.Priority{Name: pr.Name, ShedCost: pr.ShedCost})
	}
	for _, cl := range f.classes {
		sh := c.shapeOf(cl)
		p.Classes = append(p.Classes, optimizer.Class{ID: cl.Name, PromptTokens: sh.PromptTokens,
			OutputTokens: sh.OutputTokens, CachedPromptShare: sh.CachedShare, Eligible: f.eligible[cl.Name]})
	}
	last := &optimizer.Allocation{Weights: map[string]map[string]map[string]float64{}}
	for i, fe := range f.frontends {
		p.Frontends = append(p.Frontends, optimizer.Frontend{ID: fe.NodeID})
		p.RTTMs = append(p.RTTMs, f.rtt[i])
		row := make([]optimizer.Demand, len(f.classes))
		for ci, cl := range f.classes {
			row[ci] = c.classDemand(fe.NodeID, cl.Name, demand)
		}
		p.Demand = append(p.Demand, row)
		if nd := c.published[fe.NodeID]; nd != nil {
			last.Weights[fe.NodeID] = map[string]map[string]float64{}
			for cl, cd := range nd.Classes {
				if !c.touchesRecovered(cl, eng.recovered) && !c.touchesRecovered(cl, eng.corrected) {
					last.Weights[fe.NodeID][cl] = cd.Weights
				}
			}
		}
	}
	if len(last.Weights) > 0 {
		p.Last = last
	}
	return p
}

// classDemand is one (frontend, class)'s demand per priority. The class's
// learned shape (Problem.Classes) serves every frontend: one estimate from
// all reports is steadier than each frontend's, and frontends alike in
// round trips still pool.
func (c *Controller) classDemand(node, class string, demand map[signals.DemandKey]signals.DemandRate) optimizer.Demand {
	f := &c.problem
	d := optimizer.Demand{RatePerS: make([]float64, len(f.priorities))}
	var req float64
	for k, pr := range f.priorities {
		r := demand[signals.DemandKey{Node: node, Class: class, Priority: pr.Name}]
		d.RatePerS[k] = r.RequestsPerS
		req += r.RequestsPerS
	}
	if req < c.cfg.IdleDemandPerS && len(f.eligible[class]) > 0 {
		// No demand reported: plan for a trickle at the middle priority.
		d.RatePerS[len(f.priorities)/2] += c.cfg.IdleDemandPerS - req
	}
	if len(f.eligible[class]) == 0 {
		d.RatePerS = make([]float64, len(f.priorities))
	}
	return d
}

// allocate is step 3: the allocator at Headroom, again at
// OverloadHeadroom when that sheds, the fallback allocator when the first
// fails. It records the headroom, allocator, fallback reason and objective
// in res.
func (c *Controller) allocate(ctx context.Context, p *optimizer.Problem, res *Result) (*optimizer.Solution, error) {
	sol, err := c.alloc.Allocate(ctx, p)
	if err == nil && c.cfg.OverloadHeadroom > p.Headroom && sheds(sol) {
		// Overloaded: serve up to OverloadHeadroom rather than shed to keep
		// latency headroom.
		po := *p
		po.Headroom = c.cfg.OverloadHeadroom
		if s2, err2 := c.alloc.Allocate(ctx, &po); err2 == nil {
			sol, res.Headroom = s2, po.Headroom
		}
	}
	if res.Headroom == 0 {
		res.Headroom = p.Headroom
	}
	c.capped = map[string]bool{}
	if err == nil && c.cfg.BalanceFactor > 0 {
		sol, res.BalanceSkipped = c.balance(ctx, p, res.Headroom, sol)
	}
	if err != nil {
		res.Fallback = err.Error()
		res.Allocator = fmt.Sprintf("%T", c.fallback)
		sol, err = c.fallback.Allocate(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("cycle: allocator failed and so did the fallback: %w", err)
		}
	}
	res.Objective = sol.Objective
	return sol, nil
}

// sheds reports whether a solution sheds any demand.
func sheds(sol *optimizer.Solution) bool {
	for _, f := range sol.Flows {
		for _, s := range f.Shed {
			if s.RatePerS > 1e-9 {
				return true
			}
		}
	}
	return false
}
