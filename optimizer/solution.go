package optimizer

import (
	"encoding/json"
	"math"
)

// Method selects a solver.
type Method int

const (
	// Auto uses Fast.
	Auto Method = iota
	// Fast is the fleet-scale solver: Gauss–Seidel block coordinate descent
	// over (frontend, class) blocks with exact Newton steps on each block,
	// and an augmented Lagrangian for engine capacity.
	Fast
	// Reference is the exact LP over a piecewise-linear (tangent)
	// approximation of the convex cost, solved with gonum's Simplex. For
	// small instances only (see Options.MaxReferenceArcs).
	Reference
)

// MarshalText writes the method's name ("fast"), in JSON too.
func (m Method) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// MarshalJSON writes the solution with snake_case keys, the method by name
// and a NaN bound as null (encoding/json refuses NaN).
func (s Solution) MarshalJSON() ([]byte, error) {
	type plain Solution
	var bound *float64
	if !math.IsNaN(s.Bound) && !math.IsInf(s.Bound, 0) {
		bound = &s.Bound
	}
	return json.Marshal(struct {
		plain
		Bound *float64 `json:"bound"`
	}{plain(s), bound})
}

func (m Method) String() string {
	switch m {
	case Fast:
		return "fast"
	case Reference:
		return "reference"
	}
	return "auto"
}

// Options tune Solve. The zero value is valid.
type Options struct {
	Method Method
	// Tolerance is the fast solver's relative optimality gap: it stops when
	// (objective − lower bound)/objective ≤ Tolerance and no engine exceeds
	// its limit by more than Tolerance/10 relative (or when the objective
	// has stalled, see the package doc). 0 means 1e-4.
	Tolerance float64
	// MaxSweeps bounds the fast solver's sweeps over all blocks; 0 means
	// 20000. On reaching it Solve returns the iterate with ErrNotConverged.
	MaxSweeps int
	// Tangents is the number of initial tangent lines per engine in the
	// reference LP (refined by Kelley cuts until the LP bound and the exact
	// objective agree to 1e-5); 0 means 6, otherwise at least 2.
	Tangents int
	// MaxReferenceArcs bounds the reference solver's size; 0 means 2000.
	MaxReferenceArcs int
	// NoPooling turns off merging of indistinguishable engines in the fast
	// solver (for tests and measurements).
	NoPooling bool
}

// Solution is Solve's answer. Slices follow the Problem's order.
type Solution struct {
	Method Method `json:"method"`
	// Flows has one entry per (frontend, class), frontend-major.
	Flows []Flow `json:"flows"`
	// Engines has one entry per engine.
	Engines []EngineResult `json:"engines"`
	// Objective is the total cost in ms·req/s: latency of routed traffic
	// (network + TTFT + output tokens × TBOT), plus shedding and stability
	// costs. Evaluated on the exact convex model for either method.
	Objective float64 `json:"objective"`
	// Bound is a lower bound on the optimal objective when known (the
	// reference LP's tangent relaxation), else NaN (null in JSON).
	Bound float64 `json:"bound"`
	// Sweeps is the number of fast-solver sweeps (0 for Reference).
	Sweeps int `json:"sweeps"`
	// ShedCostMs[p] is the cost actually charged per shed request of
	// priority p (see Solve).
	ShedCostMs []float64 `json:"shed_cost_ms"`

	// stalled: the fast solver stopped on its stall rule, not on the
	// certified gap (for tests of the explanation identity).
	stalled bool
}

// Flow is the result for one (frontend, class).
type Flow struct {
	Frontend   string  `json:"frontend"`
	Class      string  `json:"class"`
	DemandPerS float64 `json:"demand_per_s"`
	RoutedPerS float64 `json:"routed_per_s"`
	// Weights over engines with positive traffic, in engine order; the
	// weights sum to 1 whenever RoutedPerS > 0.
	Weights []Weight `json:"weights"`
	// Shed has one entry per priority.
	Shed []Shed `json:"shed"`
	// Predicted means over routed traffic, ms.
	TTFTMs    float64 `json:"ttft_ms"`
	TBOTMs    float64 `json:"tbot_ms"`
	NetworkMs float64 `json:"network_ms"`
	LatencyMs float64 `json:"latency_ms"`
	// PriceMs is the marginal cost of one more request of this flow: the
	// cheapest eligible engine's marginal cost at the solved point (see
	// Explanation), which at the optimum is the demand constraint's dual.
	// Every used engine's explanation terms add up to it (within the
	// solver's tolerance, see Explanation) and unused engines cost at least
	// as much. A flow that routes nothing is priced at its most expensive
	// shed priority's cost.
	PriceMs float64 `json:"price_ms"`
}

// Shed is the shed part of one priority of a flow.
type Shed struct {
	Priority   string  `json:"priority"`
	RatePerS   float64 `json:"rate_per_s"`
	Fraction   float64 `json:"fraction"` // of this priority's demand
	DemandPerS float64 `json:"demand_per_s"`
}

// Weight is one engine's share of a flow, with the terms that made it.
type Weight struct {
	Engine     string  `json:"engine"`
	Weight     float64 `json:"weight"`
	RatePerS   float64 `json:"rate_per_s"`
	LastWeight float64 `json:"last_weight"`
	Explanation
}

// Explanation decomposes the marginal cost (ms per request) of sending one
// more request of a flow to an engine: the derivative of the objective
// along the arc, a + r·g'(u) with a the round trip + zero-load latency +
// outlier cost, r the request's work relative to the engine's reference
// request, g(u) = u·K(u) the engine's cost per unit capacity and K(u) the
// reference request's load-dependent latency; plus r × the capacity price
// and the stability charge. For every engine with traffic,
//
//	NetworkMs + LatencyMs + OutlierCostMs + CongestionMs + CapacityPriceMs + StabilityMs = PriceMs
//
// at the optimum (LatencyMs already contains QueueingMs and PenaltyMs);
// engines without traffic have a marginal cost ≥ PriceMs. At a solved point
// the left side is never below PriceMs (PriceMs is the cheapest route's
// marginal cost); by how much it exceeds it is the point's stationarity
// residual: for the fast solver, Σ over weights of RatePerS × excess ≤
// Tolerance × Objective when it stops on its certified gap (see
// docs/optimizer.md for the stall rule and the reference solver).
type Explanation struct {
	// NetworkMs is the round trip from the frontend.
	NetworkMs float64 `json:"network_ms"`
	// LatencyMs is the request's latency as the objective charges it at the
	// engine's solved load: its time to first token at the tail, zero-load
	// TTFT plus QueueingMs (Problem.TailFactor × the load-dependent part of
	// TTFTMs). The decode time (output × TBOTMs) is not charged: see "What
	// the objective charges" in docs/optimizer.md. TTFTMs and TBOTMs are the
	// profile's (mean) TTFT and TBOT curves at that load for this request's
	// shape.
	LatencyMs float64 `json:"latency_ms"`
	TTFTMs    float64 `json:"ttft_ms"`
	TBOTMs    float64 `json:"tbot_ms"`
	// QueueingMs is the load-dependent part of LatencyMs (TailFactor × TTFT
	// at the current load minus TTFT at zero load): under continuous batching the
	// wait for the step in progress and the slower steps of a bigger
	// batch, not a wait for earlier requests to finish.
	QueueingMs float64 `json:"queueing_ms"`
	// CongestionMs is the marginal congestion: the extra latency one more
	// request imposes on everyone already at the engine, r·u·K'(u) =
	// r·(g'(u) − K(u)).
	CongestionMs float64 `json:"congestion_ms"`
	// CapacityPriceMs is the engine capacity constraint's dual (the fast
	// solver's augmented-Lagrangian multiplier λ), scaled to this flow's
	// request size (× r): > 0 only when the engine is at its headroom.
	CapacityPriceMs float64 `json:"capacity_price_ms"`
	// PenaltyMs is how much of LatencyMs is due to the outlier penalty
	// (latency at the current load with the penalty minus without it).
	PenaltyMs float64 `json:"penalty_ms"`
	// OutlierCostMs is Problem.PenaltyCostMs × the engine's penalty: the
	// per-request charge for a misbehaving engine (failures, retries),
	// beside the capacity the penalty removes.
	OutlierCostMs float64 `json:"outlier_cost_ms"`
	// StabilityMs is the stability term's share of the marginal cost, σ =
	// Problem.StabilityMs × RemapFactor/2 per moved request: +σ where the
	// engine gets more of the flow than its last weight (one more request
	// here moves one more), −σ where it gets less (the term holds traffic
	// here), and at exactly the last allocation the value in [−σ, σ] that
	// brings the sum to PriceMs. 0 without a last allocation.
	StabilityMs float64 `json:"stability_ms"`
	// Utilization is the engine's solved utilization of its available
	// capacity.
	Utilization float64 `json:"utilization"`
}

// EngineResult is the solved state of one engine.
type EngineResult struct {
	ID string `json:"id"`
	// LoadRPS is the load in reference requests per second; CapacityRPS is
	// the available capacity (capacity × ready × health × (1 − penalty)) and
	// LimitRPS = Headroom × CapacityRPS, or less where
	// Problem.MarginalStretch caps the engine.
	LoadRPS     float64 `json:"load_rps"`
	CapacityRPS float64 `json:"capacity_rps"`
	LimitRPS    float64 `json:"limit_rps"`
	Utilization float64 `json:"utilization"`
	// CapacityPriceMs is the capacity dual per reference request (the same
	// λ as in the explanations).
	CapacityPriceMs float64 `json:"capacity_price_ms"`
	// TTFTMs and TBOTMs are the reference request's predicted latencies.
	TTFTMs float64 `json:"ttft_ms"`
	TBOTMs float64 `json:"tbot_ms"`
}

// Allocation returns the solution's weights, for the next Problem.Last.
func (s *Solution) Allocation() *Allocation {
	a := &Allocation{Weights: map[string]map[string]map[string]float64{}}
	for _, f := range s.Flows {
		if len(f.Weights) == 0 {
			continue
		}
		m := a.Weights[f.Frontend]
		if m == nil {
			m = map[string]map[string]float64{}
			a.Weights[f.Frontend] = m
		}
		w := map[string]float64{}
		for _, x := range f.Weights {
			w[x.Engine] = x.Weight
		}
		m[f.Class] = w
	}
	return a
}

// Flow returns the flow of a (frontend, class), or nil.
func (s *Solution) Flow(frontend, class string) *Flow {
	for i := range s.Flows {
		if s.Flows[i].Frontend == frontend && s.Flows[i].Class == class {
			return &s.Flows[i]
		}
	}
	return nil
}
