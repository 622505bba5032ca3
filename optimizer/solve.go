package optimizer

import (
	"fmt"
	"math"
)

// Solve computes the allocation for p. See the package documentation for
// the model. It returns an error wrapping one of the package's sentinel
// errors for a malformed problem; on ErrNotConverged the returned Solution
// is the last iterate (usable, but not at tolerance).
func Solve(p *Problem, opts Options) (*Solution, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	m := compile(p)
	switch opts.Method {
	case Auto, Fast:
		tol := opts.Tolerance
		if tol <= 0 {
			tol = 1e-4
		}
		maxSweeps := opts.MaxSweeps
		if maxSweeps <= 0 {
			maxSweeps = 20000
		}
		newSolver := func(m *model) *fastSolver {
			return &fastSolver{m: m, tol: tol, capTol: tol / 10, rho0: 0.1, rhoMax: 1, omega: 1.5}
		}
		var (
			stalled bool
			sweeps  int
			ok      bool
			bound   = math.Inf(-1)
		)
		if pl := m.pool(); pl != nil && !opts.NoPooling {
			pm := compile(pl.problem)
			ps := newSolver(pm)
			sweeps, _, bound = ps.run(maxSweeps)
			m.disaggregate(pm, pl)
			s := newSolver(m)
			s.initRho()
			var n int
			n, ok, bound = s.iterate(maxSweeps, bound)
			sweeps += n
			stalled = s.stalled
		} else {
			s := newSolver(m)
			sweeps, ok, bound = s.run(maxSweeps)
			stalled = s.stalled
		}
		sol := m.result(Fast)
		sol.Sweeps = sweeps
		sol.stalled = stalled
		sol.Bound = bound
		if !finite(bound) {
			sol.Bound = 0 // every cost is ≥ 0
		}
		if !ok {
			return sol, fmt.Errorf("%w: fast solver after %d sweeps (tolerance %g)", ErrNotConverged, sweeps, tol)
		}
		return sol, nil
	case Reference:
		return solveLP(m, opts)
	}
	return nil, fmt.Errorf("%w: unknown method %d", ErrInvalidProblem, opts.Method)
}

// validate refuses options the zero-means-default rule does not cover: a
// NaN tolerance would never converge and a negative one has no meaning, and
// a single tangent would divide by zero when spacing the reference LP's
// tangent points (an "unbounded" LP error).
func (o Options) validate() error {
	switch {
	case !(o.Tolerance >= 0) || math.IsInf(o.Tolerance, 0):
		return fmt.Errorf("%w: tolerance %g, must be finite and ≥ 0 (0: default)", ErrInvalidProblem, o.Tolerance)
	case o.MaxSweeps < 0:
		return fmt.Errorf("%w: max sweeps %d, must be ≥ 0 (0: default)", ErrInvalidProblem, o.MaxSweeps)
	case o.Tangents < 0 || o.Tangents == 1:
		return fmt.Errorf("%w: %d tangents per engine, must be 0 (default) or ≥ 2", ErrInvalidProblem, o.Tangents)
	case o.MaxReferenceArcs < 0:
		return fmt.Errorf("%w: max reference arcs %d, must be ≥ 0 (0: default)", ErrInvalidProblem, o.MaxReferenceArcs)
	}
	return nil
}
