package optimizer

import (
	"fmt"
	"math"
)

// Problem is one control cycle's input, independent of any I/O. Build it
// with controlplane.FromFleet or by hand; Solve does not modify it.
//
// Units: rates in requests per second, latencies and costs in milliseconds
// (a cost is milliseconds of latency charged per request, so objective terms
// are ms·req/s), tokens as counted by internal/tokens.
type Problem struct {
	Frontends  []Frontend
	Classes    []Class
	Engines    []Engine
	Priorities []Priority

	// Demand[i][c] is frontend i's demand for class c.
	Demand [][]Demand

	// RTTMs[i][j] is the network round trip (not one way) between frontend i
	// and engine j, in ms. A request pays one round trip before its first
	// token (request out, first token back); later tokens stream behind it,
	// so the round trip is charged once per request.
	RTTMs [][]float64

	// Last is the previous cycle's allocation (nil: none). Only its weights
	// are used: the stability term charges traffic moved away from them.
	Last *Allocation

	// Headroom in (0, 1) caps every engine's utilization of its available
	// capacity: load_j ≤ Headroom × capacity × health × ready × (1 − penalty).
	Headroom float64

	// StabilityMs is the cost charged per request whose engine changes
	// relative to Last: the expected extra latency of a cold KV cache (the
	// prefix that must be recomputed), e.g. prompt tokens × hit rate /
	// prefill rate. 0 turns the stability term off.
	StabilityMs float64

	// PenaltyCostMs is charged per request, per unit of an engine's outlier
	// penalty, on top of the latency model: the expected price of the
	// failures, retries and slowness that made the penalty. Removing
	// capacity alone moves no traffic while capacity is not binding, so an
	// engine failing half its requests would keep its share at low load;
	// with this term it loses traffic to healthy engines at once. Scale it
	// like the price of a failed request: a retry costs about one more
	// end-to-end latency (1–2 s for a 200-token answer), so the control
	// plane uses 1500 ms. A mild penalty of 0.05 then costs 75 ms, about a
	// cross-region round trip: traffic goes to same-region peers first. 0 turns the term off. The cost is linear in the flow, so the
	// problem stays convex.
	PenaltyCostMs float64

	// MarginalStretch, when > 0, also caps each engine's utilization where
	// one more request costs MarginalStretch times its zero-load latency —
	// its own latency and the congestion it adds to every request on the
	// engine (TTFT + output × TBOT, without the network): the latency
	// curves' hockey stick for the shapes of the flows that may use it
	// (Profile.FullUtilization, averaged over those flows by the work they
	// bring). Past it a few more requests slow everyone down by seconds;
	// demand beyond it is overload and is shed, lowest priority first, as
	// demand beyond the headroom is. How far below the headroom that is
	// depends on the shape: long uncached prompts interleave prefill with
	// every decode step and turn early, short cached requests late, a
	// batch bound by its running slots not at all. 0: the headroom alone.
	MarginalStretch float64

	// TailFactor ≥ 1 is the factor on the load-dependent part of the TTFT
	// (the wait for the step in progress and for the prefill budget, and
	// near saturation for a running slot) that the objective charges: the
	// profile's curves give the mean, and a wait's tail is a multiple of its
	// mean — the 99th percentile of an exponential wait is ln 100 ≈ 4.6
	// times it. Charging the mean packs the nearest engines to their
	// headroom, where their p99 is several times what it is with the tail
	// charged (the simulator's comparison is in docs/optimizer.md, "What
	// the objective charges"). The zero-load TTFT and the round trip
	// are not scaled: they do not queue. 0 means DefaultTailFactor.
	TailFactor float64

	// RemapFactor converts a change of weights into moved requests: with
	// Envoy's weighted Maglev the share of keys that move is about 1.35× the
	// total-variation distance of the weights. 0 means 1.35.
	RemapFactor float64
}

// Frontend is a frontend cluster (one Envoy node id).
type Frontend struct {
	ID string
}

// Class is an eligibility class.
type Class struct {
	ID string
	// PromptTokens and OutputTokens are the mean request shape, used where a
	// Demand carries none; CachedPromptShare ∈ [0, 1] is the share of the
	// prompt tokens served from the engines' prefix caches (Shape).
	PromptTokens, OutputTokens float64
	CachedPromptShare          float64
	// Eligible lists indices into Problem.Engines that may serve the class.
	Eligible []int
}

// Engine is one inference engine (a group of identical replicas).
type Engine struct {
	ID      string
	Profile Profile
	// Replicas is the configured replica count; ReadyReplicas of them are
	// ready (0 ≤ ReadyReplicas ≤ Replicas).
	Replicas, ReadyReplicas float64
	// Health in [0, 1] scales available capacity (1: healthy, 0: down).
	Health float64
	// Penalty in [0, 1] is the outlier penalty; it removes that share of
	// the engine's capacity.
	Penalty float64
	// MaxUtilization in [0, 1), when > 0, caps this engine's utilization
	// of its available capacity below Problem.Headroom (and below the
	// MarginalStretch limit): load_j ≤ MaxUtilization × C_j. 0: no cap of
	// its own. The control plane's balance bound sets it (BalanceFactor).
	MaxUtilization float64
}

// Priority is a traffic priority. ShedCost > 0 orders shedding: the
// priority with the smallest ShedCost is shed first. See Solve for how the
// cost is scaled so that shedding happens only when demand cannot fit.
type Priority struct {
	Name     string
	ShedCost float64
}

// Demand is one (frontend, class) demand.
type Demand struct {
	// RatePerS[p] is the request rate of priority p (len = len(Priorities)).
	RatePerS []float64
	// PromptTokens and OutputTokens override the class's mean shape when
	// either is > 0, and CachedPromptShare then overrides the class's
	// cached share.
	PromptTokens, OutputTokens float64
	CachedPromptShare          float64
}

// FlowShape is the request shape of frontend i's class c: the demand's
// when it states one, else the class's.
func (p *Problem) FlowShape(i, c int) Shape {
	d, cl := &p.Demand[i][c], &p.Classes[c]
	if d.PromptTokens > 0 || d.OutputTokens > 0 {
		return Shape{PromptTokens: d.PromptTokens, OutputTokens: d.OutputTokens, CachedShare: d.CachedPromptShare}
	}
	return Shape{PromptTokens: cl.PromptTokens, OutputTokens: cl.OutputTokens, CachedShare: cl.CachedPromptShare}
}

// Total returns the demand summed over priorities.
func (d Demand) Total() float64 {
	s := 0.0
	for _, r := range d.RatePerS {
		s += r
	}
	return s
}

// Allocation is a set of weights per (frontend, class) over engines, keyed
// by ids: Weights[frontendID][classID][engineID]. Solution.Allocation
// returns one for the next cycle's Problem.Last.
type Allocation struct {
	Weights map[string]map[string]map[string]float64
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func frac(name string, v float64) error {
	if !(v >= 0 && v <= 1) {
		return fmt.Errorf("%w: %s is %g, must be in [0, 1]", ErrInvalidProblem, name, v)
	}
	return nil
}

// Validate reports the first problem found, wrapping a sentinel error.
func (p *Problem) Validate() error {
	for _, check := range []func() error{p.validateCosts, p.validateEngines, p.validateClasses, p.validateFrontends, p.validateLast} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateCosts checks the scalar terms and the priorities.
func (p *Problem) validateCosts() error {
	if !(p.Headroom > 0 && p.Headroom < 1) {
		return fmt.Errorf("%w: headroom is %g, must be in (0, 1)", ErrInvalidProblem, p.Headroom)
	}
	if !(p.PenaltyCostMs >= 0) || !finite(p.PenaltyCostMs) {
		return fmt.Errorf("%w: penalty cost is %g ms, must be ≥ 0", ErrInvalidProblem, p.PenaltyCostMs)
	}
	if !(p.StabilityMs >= 0) || !finite(p.StabilityMs) {
		return fmt.Errorf("%w: stability cost is %g ms, must be ≥ 0", ErrInvalidProblem, p.StabilityMs)
	}
	if !(p.MarginalStretch == 0 || p.MarginalStretch > 1) || !finite(p.MarginalStretch) {
		return fmt.Errorf("%w: marginal stretch is %g, must be 0 (off) or > 1", ErrInvalidProblem, p.MarginalStretch)
	}
	if !(p.TailFactor == 0 || p.TailFactor >= 1) || !finite(p.TailFactor) {
		return fmt.Errorf("%w: tail factor is %g, must be 0 (the default) or ≥ 1", ErrInvalidProblem, p.TailFactor)
	}
	if !(p.RemapFactor >= 0) || !finite(p.RemapFactor) {
		return fmt.Errorf("%w: remap factor is %g, must be ≥ 0", ErrInvalidProblem, p.RemapFactor)
	}
	if len(p.Priorities) == 0 {
		return fmt.Errorf("%w: no priorities (need at least one)", ErrInvalidProblem)
	}
	seen := map[string]bool{}
	for _, pr := range p.Priorities {
		if seen[pr.Name] {
			return fmt.Errorf("%w: duplicate priority %q", ErrInvalidProblem, pr.Name)
		}
		seen[pr.Name] = true
		if !(pr.ShedCost > 0) || !finite(pr.ShedCost) {
			return fmt.Errorf("%w: priority %q has shed cost %g, must be > 0", ErrInvalidProblem, pr.Name, pr.ShedCost)
		}
	}
	return nil
}

func (p *Problem) validateEngines() error {
	seen := map[string]bool{}
	for j := range p.Engines {
		e := &p.Engines[j]
		if e.ID == "" || seen[e.ID] {
			return fmt.Errorf("%w: engine %d has empty or duplicate id %q", ErrInvalidProblem, j, e.ID)
		}
		seen[e.ID] = true
		if err := e.Profile.Validate(); err != nil {
			return fmt.Errorf("engine %q: %w", e.ID, err)
		}
		if !(e.Replicas > 0) || !finite(e.Replicas) || !(e.ReadyReplicas >= 0) || e.ReadyReplicas > e.Replicas {
			return fmt.Errorf("%w: engine %q has %g ready of %g replicas", ErrInvalidProblem, e.ID, e.ReadyReplicas, e.Replicas)
		}
		if err := frac("engine "+e.ID+" health", e.Health); err != nil {
			return err
		}
		if err := frac("engine "+e.ID+" penalty", e.Penalty); err != nil {
			return err
		}
		if !(e.MaxUtilization >= 0 && e.MaxUtilization < 1) {
			return fmt.Errorf("%w: engine %q has max utilization %g, must be in [0, 1) (0: none)", ErrInvalidProblem, e.ID, e.MaxUtilization)
		}
	}
	return nil
}

func (p *Problem) validateClasses() error {
	seen := map[string]bool{}
	for c := range p.Classes {
		cl := &p.Classes[c]
		if cl.ID == "" || seen[cl.ID] {
			return fmt.Errorf("%w: class %d has empty or duplicate id %q", ErrInvalidProblem, c, cl.ID)
		}
		seen[cl.ID] = true
		if !(cl.PromptTokens >= 0) || !(cl.OutputTokens >= 0) || cl.PromptTokens+cl.OutputTokens <= 0 || !finite(cl.PromptTokens+cl.OutputTokens) {
			return fmt.Errorf("%w: class %q has shape %g prompt / %g output tokens", ErrInvalidProblem, cl.ID, cl.PromptTokens, cl.OutputTokens)
		}
		if err := frac("class "+cl.ID+" cached prompt share", cl.CachedPromptShare); err != nil {
			return err
		}
		dup := map[int]bool{}
		for _, j := range cl.Eligible {
			if j < 0 || j >= len(p.Engines) || dup[j] {
				return fmt.Errorf("%w: class %q lists engine index %d (out of range or repeated)", ErrInvalidProblem, cl.ID, j)
			}
			dup[j] = true
		}
	}
	return nil
}

// validateFrontends checks each frontend's RTT row and demand against the
// engines, classes and priorities.
func (p *Problem) validateFrontends() error {
	seen := map[string]bool{}
	for i, f := range p.Frontends {
		if f.ID == "" || seen[f.ID] {
			return fmt.Errorf("%w: frontend %d has empty or duplicate id %q", ErrInvalidProblem, i, f.ID)
		}
		seen[f.ID] = true
	}
	if len(p.Demand) != len(p.Frontends) || len(p.RTTMs) != len(p.Frontends) {
		return fmt.Errorf("%w: %d frontends but %d demand rows and %d RTT rows", ErrInvalidProblem, len(p.Frontends), len(p.Demand), len(p.RTTMs))
	}
	for i, f := range p.Frontends {
		if len(p.RTTMs[i]) != len(p.Engines) {
			return fmt.Errorf("%w: frontend %q has %d RTTs for %d engines", ErrInvalidProblem, f.ID, len(p.RTTMs[i]), len(p.Engines))
		}
		for j, v := range p.RTTMs[i] {
			if !(v >= 0) || !finite(v) {
				return fmt.Errorf("%w: RTT from frontend %q to engine %q is %g ms", ErrInvalidProblem, f.ID, p.Engines[j].ID, v)
			}
		}
		if len(p.Demand[i]) != len(p.Classes) {
			return fmt.Errorf("%w: frontend %q has demand for %d classes, want %d", ErrInvalidProblem, f.ID, len(p.Demand[i]), len(p.Classes))
		}
		for c, d := range p.Demand[i] {
			cl := &p.Classes[c]
			if len(d.RatePerS) != len(p.Priorities) {
				return fmt.Errorf("%w: frontend %q class %q has %d priority rates, want %d", ErrInvalidProblem, f.ID, cl.ID, len(d.RatePerS), len(p.Priorities))
			}
			for k, r := range d.RatePerS {
				if !(r >= 0) || !finite(r) {
					return fmt.Errorf("%w: frontend %q class %q priority %q rate %g req/s", ErrNegativeDemand, f.ID, cl.ID, p.Priorities[k].Name, r)
				}
			}
			if !(d.PromptTokens >= 0) || !(d.OutputTokens >= 0) || !finite(d.PromptTokens+d.OutputTokens) {
				return fmt.Errorf("%w: frontend %q class %q has token shape %g/%g", ErrInvalidProblem, f.ID, cl.ID, d.PromptTokens, d.OutputTokens)
			}
			if err := frac(fmt.Sprintf("frontend %q class %q cached prompt share", f.ID, cl.ID), d.CachedPromptShare); err != nil {
				return err
			}
			if d.Total() > 0 && len(cl.Eligible) == 0 {
				return fmt.Errorf("%w: frontend %q has %g req/s of class %q, which lists no engine", ErrNoEligibleEngine, f.ID, d.Total(), cl.ID)
			}
		}
	}
	return nil
}

func (p *Problem) validateLast() error {
	// Last weights become x0 = demand × weight in the stability term: a NaN
	// there made every objective NaN, so the solver ran to MaxSweeps and
	// reported ErrNotConverged instead of the bad input. Ids that no longer
	// exist are fine (engines come and go between cycles); values are not.
	if p.Last != nil {
		for fe, classes := range p.Last.Weights {
			for cl, ws := range classes {
				for eng, w := range ws {
					if err := frac(fmt.Sprintf("last weight of frontend %q class %q engine %q", fe, cl, eng), w); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}
