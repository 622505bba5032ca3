package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/inferlb/inferlb/optimizer"
)

// Allocator turns one cycle's problem into an allocation. The control loop
// uses OptimizerAllocator; ProportionalAllocator is the fallback when the
// optimizer fails (and a baseline).
type Allocator interface {
	Allocate(ctx context.Context, p *optimizer.Problem) (*optimizer.Solution, error)
}

// DefaultSolverTolerance is the control loop's optimality gap: 0.1% of the
// objective, far finer than the 3% deadband that decides what is published.
// Certifying the library default (1e-4) on a large cold instance takes
// many times the sweeps and the time that 1e-3 does (docs/optimizer.md,
// "Measured").
const DefaultSolverTolerance = 1e-3

// OptimizerAllocator calls optimizer.Solve. A not-converged solve is used
// (it is the last iterate) and reported.
type OptimizerAllocator struct {
	Options optimizer.Options
}

// Allocate implements Allocator.
func (a OptimizerAllocator) Allocate(_ context.Context, p *optimizer.Problem) (*optimizer.Solution, error) {
	sol, err := optimizer.Solve(p, a.Options)
	if errors.Is(err, optimizer.ErrNotConverged) && sol != nil {
		return sol, nil
	}
	return sol, err
}

// ProportionalAllocator splits every flow over its class's engines in
// proportion to their available capacity (capacity × ready replicas ×
// health × (1 − penalty)); it never sheds and explains nothing.
type ProportionalAllocator struct{}

// Allocate implements Allocator.
func (ProportionalAllocator) Allocate(_ context.Context, p *optimizer.Problem) (*optimizer.Solution, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	avail := make([]float64, len(p.Engines))
	for j, e := range p.Engines {
		avail[j] = e.Profile.CapacityRPS * e.ReadyReplicas * e.Health * (1 - e.Penalty)
	}
	sol := &optimizer.Solution{Method: optimizer.Auto}
	load := make([]float64, len(p.Engines))
	for i, f := range p.Frontends {
		for c, cl := range p.Classes {
			d := p.Demand[i][c]
			flow := optimizer.Flow{Frontend: f.ID, Class: cl.ID, DemandPerS: d.Total(), RoutedPerS: d.Total()}
			sum := 0.0
			for _, j := range cl.Eligible {
				sum += avail[j]
			}
			if sum <= 0 {
				return nil, fmt.Errorf("proportional allocator: class %q has no available capacity", cl.ID)
			}
			for _, j := range cl.Eligible {
				if avail[j] <= 0 {
					continue
				}
				w := avail[j] / sum
				flow.Weights = append(flow.Weights, optimizer.Weight{Engine: p.Engines[j].ID, Weight: w, RatePerS: w * d.Total()})
				load[j] += w * d.Total()
			}
			for _, pr := range p.Priorities {
				flow.Shed = append(flow.Shed, optimizer.Shed{Priority: pr.Name})
			}
			sol.Flows = append(sol.Flows, flow)
		}
	}
	for j, e := range p.Engines {
		r := optimizer.EngineResult{ID: e.ID, LoadRPS: load[j], CapacityRPS: avail[j], LimitRPS: p.Headroom * avail[j]}
		if avail[j] > 0 {
			r.Utilization = load[j] / avail[j]
		}
		sol.Engines = append(sol.Engines, r)
	}
	return sol, nil
}
