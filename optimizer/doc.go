// Package optimizer computes, each control cycle, every frontend's share of
// traffic per engine: the allocation that minimizes the expected time to
// first token (round trip + TTFT at the engine's load) of routed traffic
// under engine capacity, with load shedding only
// when demand cannot fit and a stability term that keeps traffic where its KV
// cache is.
//
// The control plane builds a Problem (controlplane.FromFleet does it from a
// fleet spec and a demand file) and calls
//
//	sol, err := optimizer.Solve(p, optimizer.Options{})
//
// Solve is pure: it reads p, allocates a new Solution and keeps no state. The
// same input gives bit-identical output. sol.Flows holds, per (frontend,
// class), the weights over engines (summing to 1), shed fractions per
// priority, predicted TTFT/TBOT and an Explanation per weight;
// sol.Allocation() is the next cycle's Problem.Last.
//
// # Model
//
// Decision: x[i,c,j] ≥ 0, the rate of class c from frontend i to engine j,
// and s[i,c,p] ∈ [0, d[i,c,p]], the rate of priority p shed.
//
//	minimize   Σ x[i,c,j]·(RTT[i,j] + TTFT_cj(0) + τ·(TTFT_cj(u_j) − TTFT_cj(0)))
//	         + Σ shed[p]·s[i,c,p]
//	         + StabilityMs·RemapFactor/2 · Σ |x[i,c,j] − d[i,c]·w_last[i,c,j]|
//	subject to Σ_j x[i,c,j] + Σ_p s[i,c,p] = d[i,c]
//	           load_j = Σ r[i,c,j]·x[i,c,j] ≤ Headroom·C_j
//
// where r is the request's work relative to the engine profile's reference
// request, C_j = CapacityRPS × ReadyReplicas × Health × (1 − Penalty), and
// u_j = load_j / C_j. Latency curves have the queueing form of Curve, and a
// request r times larger sees r times the congestion delay (processor
// sharing), which makes the objective Σ_j load_j·K_j(u_j) + linear terms,
// convex and separable per engine. docs/optimizer.md has the derivation.
//
// The decode time (n_c × TBOT) is not charged: under continuous batching a
// busier engine streams every answer a little slower (each step carries a
// bigger batch), which a reader of a streamed answer does not wait for,
// and charged over 200 tokens it outweighed any round trip, so the system
// optimum spread a region's traffic over an ocean at a fraction of its
// engines' capacity. TBOT still sets where an engine is full
// (MarginalStretch, Profile.FullUtilization) and is reported per weight.
// τ (Problem.TailFactor, default ln 100) prices the load-dependent wait at
// its tail, not its mean. The rule the tests hold (TestSpillOnlyWhenItPays):
// when a frontend's nearest engines carry its demand below their limits at
// a price (round trip + TTFT, its wait × τ, + the delay one more request
// adds there) below every farther engine's round trip + zero-load TTFT,
// nothing leaves the region.
//
// Shedding: the charged cost of shedding one request of priority p is
// M·(1 + ShedCost_p/max ShedCost), where M exceeds the marginal cost of any
// route at full headroom times the number of flows, so routing always beats
// shedding while capacity remains; lower ShedCost is shed first.
//
// # Tolerances
//
// The fast solver stops when its certified relative gap, (objective − lower
// bound)/objective, is at most Options.Tolerance (default 1e-4) and no engine
// exceeds its limit by more than Tolerance/10 relative; or when the objective
// improved by less than Tolerance/1000 over 100 sweeps (degenerate instances
// creep with a loose bound). Solution.Bound is the lower bound reached.
// Demand is conserved to 1e-12 relative and weights sum to 1 up to rounding.
// The reference LP refines its tangents until its value (a lower bound) and
// the exact objective at its solution agree to 1e-5; gonum's Simplex runs at
// tolerance 1e-10 on a problem scaled to order one. On 200 random small
// instances the fast solver's objective is held within 0.1% of the
// reference's (docs/optimizer.md, "Measured", has the worst difference).
package optimizer
