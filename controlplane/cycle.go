// Package controlplane is inferlb's control loop: each cycle it turns
// engine signals and demand into per-frontend xDS resources.
//
// Controller holds the cycle's logic and nothing else: no clock, no
// goroutines, no network. Step takes the time and the inputs (smoothed
// engine signals, demand, per-engine evidence) and returns the resources to
// publish. The same Controller therefore runs in real time under Runner
// (runner.go: scraping, the Reports intake, the xDS server, the admin HTTP
// server) and in virtual time inside a fleet simulator.
//
// One cycle (Step; each step in its own file):
//
//  0. Demand (shape.go, demand.go): the classes' learned request shapes,
//     the load our own published weights put on each engine, the smoothed
//     demand.
//  1. Engine view (engines.go, penalty.go): health from /health and
//     staleness (stale = unknown, weighted by UnknownHealth, never idle);
//     observed utilization from token rates; background load = observed −
//     what our own traffic puts there.
//  2. Outlier penalties (penalty.go): observed TTFT/TBOT against the
//     engine's own profile at its observed load, and error rates from
//     ext_proc evidence; a penalty rises at once and decays with
//     PenaltyHalfLife on recovery.
//  3. The problem and the allocator (problem.go): the optimizer with the
//     published weights as Last, so its stability term charges moving
//     traffic away from warm KV caches; OverloadHeadroom when it sheds; the
//     fallback allocator when it fails.
//  4. Per (frontend, class), the proposal (weights.go: probe shares, shed
//     fractions) and the deadband (hold.go, deadband.go): new weights
//     replace the published ones only when the move is worth its cache
//     misses or an eligible engine's health changed.
//  5. Split tables per class (affinity.go).
//  6. Translation (publish.go, package xds/translate; retry.go's retry
//     policy) of every node; nodes whose content changed are returned for
//     publication, and the decisions become the published ones.
package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/xds/translate"
)

// Config is the cycle's tuning. Start from DefaultConfig.
type Config struct {
	Translate translate.Options
	// Headroom caps planned utilization of available capacity (0, 1).
	Headroom float64
	// OverloadHeadroom is the cap when demand does not fit under Headroom
	// (the solution sheds): [Headroom, 1). Keeping headroom for latency is
	// then paid for in shed requests, and an overloaded fleet should serve
	// what it can: at Headroom 0.85 an overload admitted at most 85% of
	// the fleet's capacity.
	OverloadHeadroom float64
	// StabilityMs: the cost the optimizer charges per moved request (a cold
	// KV cache).
	StabilityMs float64
	// PenaltyCostMs: the optimizer's per-request charge per unit of outlier
	// penalty (optimizer.Problem.PenaltyCostMs), so a failing or slow
	// engine loses traffic even when capacity is not binding.
	PenaltyCostMs float64
	// DeadbandTV: smallest total-variation change of a (frontend, class)'s
	// weights worth publishing; above it, new weights are published when
	// what they gain outweighs the cache misses they cause (deadband.go).
	DeadbandTV float64
	// DemandSmoothing is the time constant of the demand the optimizer
	// plans with (demand.go); 0 plans with the intake's window as is.
	DemandSmoothing time.Duration
	// ShedDeadband: smallest change of a shed fraction worth publishing.
	ShedDeadband float64
	// IdleDemandPerS is the demand assumed for a (frontend, class) with no
	// reported demand, so it still gets weights (where its first requests
	// should go).
	IdleDemandPerS float64
	// UnknownHealth scales the capacity of a stale engine (0..1).
	UnknownHealth float64
	// BackgroundFloor is the part of observed minus our own (OwnUtilization)
	// taken for measurement noise rather than background load.
	BackgroundFloor float64
	Penalty         PenaltyOptions
	// RetryBudget is the retry share at low utilization, published as the
	// policy's retry_budget_fraction. ext_proc alone scales it down with
	// utilization and stops it while the class sheds (retryScale in
	// extproc/admission.go: it sees the moment as well as the plan).
	// MaxRetries per request while the budget is positive.
	RetryBudget float64
	MaxRetries  uint32
	// ShapeSmoothing is the time constant with which each class's work per
	// request (tokens per request, cached share of the prompt; shape.go)
	// follows what is observed.
	ShapeSmoothing time.Duration
	// MaxCachedShare caps the share of prompt tokens counted as prefix-cache
	// hits (no prefill work), [0, 1).
	MaxCachedShare float64
	// MarginalStretch (optimizer.Problem.MarginalStretch): an engine is
	// full where one more request would cost this many times its zero-load
	// latency (its own and the congestion it adds), if that comes before
	// the headroom; 0: the headroom alone.
	MarginalStretch float64
	// BalanceFactor β, when > 0, bounds balance: no engine is planned
	// above β × the mean planned utilization of its pool, the engines of
	// its region eligible for the same classes (balance.go). 0: off, the
	// optimizer's latency-minimizing plan as it is. The default, 1.02, was
	// chosen in the simulator as the loosest bound that keeps the busiest
	// engine near the fleet's mean utilization in the multi-region chat
	// scenarios (the bound is per region, regions differ in load per
	// engine, and a class only the H100s serve lifts their caps); the
	// price is latency on mixed GPUs, where the plan moves load from fast
	// to slow engines. The measurements are in docs/decisions/balance-bound.md.
	BalanceFactor float64
}

// PenaltyOptions shape outlier penalties.
type PenaltyOptions struct {
	// LatencyTolerance: observed/predicted latency ratios up to 1+this are
	// normal. Above, the penalty grows by 1 per LatencyScale of ratio.
	LatencyTolerance, LatencyScale float64
	// ErrorTolerance: error rates up to this are normal; above, the
	// penalty grows by 1 per ErrorScale of error rate.
	ErrorTolerance, ErrorScale float64
	// MinSamples: fewer first tokens (or responses) in an interval are no
	// evidence.
	MinSamples float64
	// E2ESlackMs is the time per request allowed for the proxy path when
	// ext_proc's timing of whole requests is compared with the engine's
	// profile.
	E2ESlackMs float64
	// Max caps a penalty.
	Max float64
	// HalfLife of the decay while the evidence shows the engine normal
	// again (without evidence a penalty is held).
	HalfLife time.Duration
	// A penalized engine that is up keeps a probe share of each class:
	// enough for ProbeRPS requests/s of the class's demand, between
	// MinProbeShare and MaxProbeShare, so that its recovery is judged on
	// traffic.
	ProbeRPS, MinProbeShare, MaxProbeShare float64
}

// DefaultConfig is the production tuning.
func DefaultConfig() Config {
	return Config{
		Translate:        translate.DefaultOptions(),
		Headroom:         0.85,
		OverloadHeadroom: 0.95,
		StabilityMs:      30,
		PenaltyCostMs:    1500,
		DeadbandTV:       0.03,
		DemandSmoothing:  30 * time.Second,
		ShedDeadband:     0.01,
		IdleDemandPerS:   0.05,
		UnknownHealth:    0.5,
		BackgroundFloor:  0.1,
		Penalty: PenaltyOptions{LatencyTolerance: 0.5, LatencyScale: 2, ErrorTolerance: 0.02, ErrorScale: 0.5,
			MinSamples: 3, E2ESlackMs: 50, Max: 0.9, HalfLife: 10 * time.Second, ProbeRPS: 0.5, MinProbeShare: 0.01, MaxProbeShare: 0.1},
		RetryBudget:     0.2,
		MaxRetries:      2,
		ShapeSmoothing:  20 * time.Second,
		MaxCachedShare:  0.9,
		MarginalStretch: 12,
		BalanceFactor:   1.02,
	}
}

// Validate checks the config.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, v any, why string) { errs = append(errs, fmt.Errorf("%s: %s, got %v", f, why, v)) }
	if err := c.Translate.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(c.Headroom > 0 && c.Headroom < 1) {
		bad("headroom", c.Headroom, "must be in (0, 1)")
	}
	if !(c.OverloadHeadroom >= c.Headroom && c.OverloadHeadroom < 1) {
		bad("overload_headroom", c.OverloadHeadroom, "must be in [headroom, 1)")
	}
	if !(c.PenaltyCostMs >= 0) || math.IsInf(c.PenaltyCostMs, 0) {
		bad("penalty_cost_ms", c.PenaltyCostMs, "must be ≥ 0 and finite")
	}
	if !(c.StabilityMs >= 0) {
		bad("stability_ms", c.StabilityMs, "must be ≥ 0")
	}
	if !(c.DeadbandTV >= 0 && c.DeadbandTV < 1) {
		bad("deadband_tv", c.DeadbandTV, "must be in [0, 1)")
	}
	if c.DemandSmoothing < 0 {
		bad("demand_smoothing", c.DemandSmoothing, "must be ≥ 0 (0: off)")
	}
	if !(c.ShedDeadband >= 0 && c.ShedDeadband < 1) {
		bad("shed_deadband", c.ShedDeadband, "must be in [0, 1)")
	}
	if !(c.IdleDemandPerS > 0) {
		bad("idle_demand_per_s", c.IdleDemandPerS, "must be > 0")
	}
	if !(c.UnknownHealth >= 0 && c.UnknownHealth <= 1) {
		bad("unknown_health", c.UnknownHealth, "must be in [0, 1]")
	}
	if !(c.BackgroundFloor >= 0 && c.BackgroundFloor < 1) {
		bad("background_floor", c.BackgroundFloor, "must be in [0, 1)")
	}
	p := c.Penalty
	for _, f := range []struct {
		name     string
		v        float64
		positive bool
	}{{"penalty.latency_tolerance", p.LatencyTolerance, false}, {"penalty.latency_scale", p.LatencyScale, true},
		{"penalty.error_tolerance", p.ErrorTolerance, false}, {"penalty.error_scale", p.ErrorScale, true},
		{"penalty.min_samples", p.MinSamples, false}, {"penalty.e2e_slack_ms", p.E2ESlackMs, false}} {
		switch {
		case f.positive && !(f.v > 0 && !math.IsInf(f.v, 0)):
			bad(f.name, f.v, "must be > 0 and finite")
		case !f.positive && !(f.v >= 0 && !math.IsInf(f.v, 0)):
			bad(f.name, f.v, "must be ≥ 0 and finite")
		}
	}
	if !(p.Max >= 0 && p.Max < 1) {
		bad("penalty.max", p.Max, "must be in [0, 1)")
	}
	if p.HalfLife <= 0 {
		bad("penalty.half_life", p.HalfLife, "must be positive")
	}
	if !(p.ProbeRPS >= 0 && p.MinProbeShare >= 0 && p.MinProbeShare <= p.MaxProbeShare && p.MaxProbeShare < 0.5) {
		bad("penalty.probe", fmt.Sprintf("rps %v, share %v–%v", p.ProbeRPS, p.MinProbeShare, p.MaxProbeShare), "want rps ≥ 0 and 0 ≤ min ≤ max < 0.5")
	}
	if !(c.RetryBudget >= 0 && c.RetryBudget <= 1) {
		bad("retry_budget", c.RetryBudget, "must be in [0, 1]")
	}
	if c.MaxRetries > 10 {
		bad("max_retries", c.MaxRetries, "must be at most 10")
	}
	if c.ShapeSmoothing < 0 {
		bad("shape_smoothing", c.ShapeSmoothing, "must be ≥ 0")
	}
	if !(c.MaxCachedShare >= 0 && c.MaxCachedShare < 1) {
		bad("max_cached_share", c.MaxCachedShare, "must be in [0, 1)")
	}
	if !(c.MarginalStretch == 0 || c.MarginalStretch > 1) || math.IsInf(c.MarginalStretch, 0) {
		bad("marginal_stretch", c.MarginalStretch, "must be 0 (off) or > 1, and finite")
	}
	if !(c.BalanceFactor == 0 || c.BalanceFactor >= 1) || math.IsInf(c.BalanceFactor, 0) {
		bad("balance_factor", c.BalanceFactor, "must be 0 (off) or ≥ 1, and finite")
	}
	return errors.Join(errs...)
}

// Inputs are one cycle's observations.
type Inputs struct {
	Now      time.Time
	Engines  []signals.Engine
	Demand   map[signals.DemandKey]signals.DemandRate
	Evidence map[string]signals.Evidence // by engine address
	// DemandWindow is the span Demand's rates average over (the intake's
	// window), for their noise (demand.go); 0 means 10 s.
	DemandWindow time.Duration
	// Prefixes is the prefix view by class (signals.Intake.Prefixes), from
	// which the split tables are learned (affinity.go).
	Prefixes map[string]signals.ClassPrefixes
	// Instances is the number of ext_proc instances reporting per node
	// (signals.Intake.Instances); a node absent has one. A node served by
	// several has no exclusive engine (exclusiveEngines).
	Instances map[string]int
}

// EngineView is what the cycle concluded about an engine (admin view).
type EngineView struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Health string `json:"health"`
	// HealthFactor and BackgroundLoad scale capacity for the optimizer.
	HealthFactor   float64 `json:"health_factor"`
	BackgroundLoad float64 `json:"background_load"`
	// ObservedUtilization is work per second over replica capacity.
	ObservedUtilization float64 `json:"observed_utilization"`
	PlannedUtilization  float64 `json:"planned_utilization"`
	// OwnUtilization is our traffic's part of ObservedUtilization as
	// background load is measured against it: the plan's, or more where
	// ext_proc saw the engine get more of our requests (ownLoad).
	OwnUtilization float64 `json:"own_utilization"`
	// OwnWindowUtilization is the most OwnUtilization was over the
	// engine's evidence window (this cycle's included): what its queue
	// and token rates, which cover that window, are measured against.
	OwnWindowUtilization float64 `json:"own_window_utilization"`
	// foreignWork: the engine's token rates exceed OwnWindowUtilization
	// by more than BackgroundFloor (someone else's requests run there),
	// as opposed to background load read from a queue alone.
	foreignWork bool
	// SolvedUtilization is what this cycle's allocation plans for the
	// engine, UtilizationLimit the cap it was planned under (the headroom,
	// or lower where MaxStretch puts the engine's hockey stick).
	SolvedUtilization float64 `json:"solved_utilization"`
	UtilizationLimit  float64 `json:"utilization_limit"`
	// Residuals: observed / predicted at the observed load and queue (0: no
	// evidence): TTFT and TBOT from the engine's metrics, E2E from
	// ext_proc's timing of whole requests. The predictions are in ms.
	TTFTResidual float64 `json:"ttft_residual"`
	// TTFTResidualLow is what the window proves of the TTFT residual: the
	// mean less ttftConfidence standard errors, over the prediction (the
	// histogram's spread, Window.TTFTSDMs; equal to TTFTResidual without
	// it). The latency penalty reads it.
	TTFTResidualLow float64 `json:"ttft_residual_low"`
	TBOTResidual    float64 `json:"tbot_residual"`
	E2EResidual     float64 `json:"e2e_residual"`
	TTFTPredMs      float64 `json:"ttft_predicted_ms"`
	// ProfileCorrection is the factor on the TTFT curve the optimizer
	// plans this engine with (correction.go: observed over predicted TTFT,
	// smoothed, within [1/4, 4]; 1: the profile as configured), and
	// ProfileCorrectionWhy the evidence behind it.
	ProfileCorrection    float64        `json:"profile_correction"`
	ProfileCorrectionWhy string         `json:"profile_correction_why,omitempty"`
	TBOTPredMs           float64        `json:"tbot_predicted_ms"`
	Window               signals.Window `json:"evidence_window"`
	ErrorRate            float64        `json:"error_rate"`
	Penalty              float64        `json:"penalty"`
	PenaltyWhy           string         `json:"penalty_why,omitempty"`
}

// ClassDecision is one (frontend, class)'s outcome.
type ClassDecision struct {
	Class string `json:"class"`
	// Weights are the published shares; Proposed the allocator's.
	Weights  map[string]float64 `json:"weights"`
	Proposed map[string]float64 `json:"proposed"`
	// Held: the deadband kept the published weights.
	Held       bool    `json:"held"`
	TVDistance float64 `json:"tv_distance"`
	// Gain is what the proposal saves over the published weights and
	// MissCost what its cache misses cost, both ms·req/s (deadband.go);
	// 0 when the deadband did not need to price them.
	Gain        float64            `json:"deadband_gain_ms_per_s"`
	MissCost    float64            `json:"deadband_miss_cost_ms_per_s"`
	Shed        map[string]float64 `json:"shed_by_priority,omitempty"`
	Explain     []optimizer.Weight `json:"explanations,omitempty"`
	Demand      float64            `json:"demand_per_s"`
	Flow        *optimizer.Flow    `json:"-"`
	EnvoyW      map[string]uint32  `json:"envoy_weights"`
	Priority    map[string]uint32  `json:"envoy_priority"`
	Health      map[string]string  `json:"engine_health"`
	Utilization float64            `json:"utilization"`
	shedLevels  map[uint32]float64
	util        float64 // published utilization; -1 unknown
}

// NodeDecision is one frontend's outcome.
type NodeDecision struct {
	NodeID    string                    `json:"node_id"`
	Classes   map[string]*ClassDecision `json:"classes"`
	Resources *translate.Resources      `json:"-"`
	Changed   bool                      `json:"changed"`
}

// Result is one cycle's outcome.
type Result struct {
	At        time.Time `json:"at"`
	Allocator string    `json:"allocator"`
	Fallback  string    `json:"fallback_reason,omitempty"`
	// BalanceSkipped says why the balance bound (Config.BalanceFactor) was
	// not applied this cycle: its plan failed, or shed where the unbounded
	// one did not. Empty when the bound is off or applied.
	BalanceSkipped string       `json:"balance_skipped,omitempty"`
	Objective      float64      `json:"objective"`
	Engines        []EngineView `json:"engines"`
	// Headroom is the utilization cap the allocation was planned with
	// (OverloadHeadroom when demand did not fit under Headroom).
	Headroom float64 `json:"headroom"`
	// PenaltyNotes say when fleet-wide slowness was not taken for faults.
	PenaltyNotes []string                 `json:"penalty_notes,omitempty"`
	Nodes        map[string]*NodeDecision `json:"nodes"`
	// Affinity is each class's split table (the same at every node).
	Affinity map[string]*AffinityView `json:"affinity"`
	// Shapes is each class's work per request the allocation was planned
	// with (shape.go).
	Shapes map[string]ClassShape `json:"shapes"`
	// Publish lists the nodes whose resources changed, to publish.
	Publish []*translate.Resources `json:"-"`
}

// Controller is the cycle's state: penalties, what was published, the last
// solution. Not safe for concurrent use; one loop owns it.
type Controller struct {
	// capped holds the engines the balance bound capped in this cycle's
	// plan (balance.go); reset by allocate. Step's goroutine only.
	capped map[string]bool
	// shedAt is the last cycle at which the published policy shed
	// (correction.go). Step's goroutine only.
	shedAt time.Time
	// ownSeen is each cycle's OwnUtilization per engine, oldest first,
	// kept ownSeenKeep (observe reads it, assessEngines appends). Step's
	// goroutine only.
	ownSeen []ownSample
	// demanding is, per class, the frontends (node ids) with demand in
	// the solution demandingSol (nearestProber's cache). Step's
	// goroutine only.
	demanding    map[string]map[string]bool
	demandingSol *optimizer.Solution
	cfg          Config
	spec         *fleet.Spec
	alloc        Allocator
	fallback     Allocator
	profiles     map[string]optimizer.Profile
	problem      problemFrame

	// correction is each engine's online TTFT-curve correction factor,
	// correctionPlanned its value at the engine's last replan
	// (correction.go).
	correction, correctionPlanned map[string]float64

	penalties map[string]float64
	cause     map[string]string // engine → why its penalty was set (causeLatency, causeErrors)
	// impaired marks engines that were penalized, down or stale last cycle
	// (never-scraped engines are not impaired), to notice recoveries.
	impaired  map[string]bool
	lastStep  time.Time
	published map[string]*NodeDecision
	planned   map[string]float64 // engine → planned load (ref req/s)
	// weightsMovedAt is when a commit last changed the published weights
	// (ownLoad waits a Reports window after it).
	weightsMovedAt time.Time
	// plannedReq is planned in requests/s (each class's at its count, not
	// its work): what ext_proc's response counts compare with (ownLoad).
	plannedReq map[string]float64
	version    int64
	// tables holds each class's published split-table rules.
	tables map[string][]translate.PrefixRule
	// depths holds each class's published shared-prefix depth.
	depths map[string]uint32
	// smoothed is the demand the optimizer planned with, at smoothedAt
	// (demand.go).
	smoothed   map[signals.DemandKey]smoothedDemand
	smoothedAt time.Time
	// shapes holds each class's smoothed work estimate, shapeView its value
	// this cycle, traffic each class's requests/s per engine under the
	// weights in force (classTraffic) as of this cycle.
	shapes    map[string]*shapeState
	shapeView map[string]ClassShape
	traffic   map[string]map[string]float64
	// tight holds the classes whose clusters run at the tightest bounded
	// load (boundedload.go).
	tight map[string]bool
}

type problemFrame struct {
	frontends  []fleet.Frontend
	classes    []fleet.Class
	engines    []fleet.Engine
	priorities []fleet.Priority
	byAddr     map[string]string
	eligible   map[string][]int
	rtt        [][]float64 // [frontend][engine] ms
	// engineIdx and nodeIdx index engines and frontends (node id) into rtt.
	engineIdx, nodeIdx map[string]int
	// The priorities as translation names them, each one's level by name,
	// and the default priority (the middle level: the fleet spec has none).
	tprios          []translate.Priority
	levelOf         map[string]uint32
	defaultPriority string
}

// NewController builds a controller for a validated fleet.
func NewController(spec *fleet.Spec, cfg Config, alloc Allocator) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("control plane config: %w", err)
	}
	if alloc == nil {
		alloc = OptimizerAllocator{Options: optimizer.Options{Tolerance: DefaultSolverTolerance}}
	}
	c := &Controller{cfg: cfg, spec: spec, alloc: alloc, fallback: ProportionalAllocator{},
		profiles: map[string]optimizer.Profile{}, penalties: map[string]float64{}, cause: map[string]string{}, impaired: map[string]bool{},
		published: map[string]*NodeDecision{}, planned: map[string]float64{}, tables: map[string][]translate.PrefixRule{}, depths: map[string]uint32{},
		shapes: map[string]*shapeState{}, tight: map[string]bool{}}
	f := &c.problem
	f.frontends, f.classes, f.engines = spec.Frontends, spec.Classes, spec.Engines
	f.priorities = slices.Clone(spec.Priorities)
	slices.SortFunc(f.priorities, func(a, b fleet.Priority) int { return cmp.Compare(a.Level, b.Level) })
	f.levelOf = map[string]uint32{}
	for _, pr := range f.priorities {
		f.levelOf[pr.Name] = uint32(pr.Level)
		f.tprios = append(f.tprios, translate.Priority{Name: pr.Name, Level: uint32(pr.Level)})
	}
	if len(f.frontends) == 0 || len(f.engines) == 0 || len(f.classes) == 0 || len(f.priorities) == 0 {
		return nil, fmt.Errorf("control plane: fleet %q needs frontends, engines, classes and priorities (has %d, %d, %d, %d)",
			spec.Name, len(f.frontends), len(f.engines), len(f.classes), len(f.priorities))
	}
	f.defaultPriority = f.priorities[len(f.priorities)/2].Name
	f.byAddr = map[string]string{}
	idx := map[string]int{}
	for j, e := range f.engines {
		idx[e.ID] = j
		f.byAddr[e.Address] = e.ID
		fp, ok := spec.ProfileOf(e)
		if !ok {
			return nil, fmt.Errorf("control plane: engine %s: no profile for gpu %q model %q", e.ID, e.GPU, e.Model)
		}
		// The same profile the optimizer's own tools build (capacity and
		// measured curves from the spec included).
		// The engine's model's reference request, as in FromFleet
		// (before, every engine took the fleet's first class, whatever its
		// model).
		refP, refO, ok := ReferenceShape(spec, e.Model)
		if !ok {
			return nil, fmt.Errorf("control plane: engine %s: no class of model %q gives a reference request shape", e.ID, e.Model)
		}
		p, err := ProfileFromFleet(fp, refP, refO)
		if err != nil {
			return nil, fmt.Errorf("control plane: engine %s: %w", e.ID, err)
		}
		c.profiles[e.ID] = p
	}
	f.eligible = map[string][]int{}
	for _, cl := range f.classes {
		for _, e := range spec.EligibleEngines(cl.Name) {
			f.eligible[cl.Name] = append(f.eligible[cl.Name], idx[e.ID])
		}
	}
	f.engineIdx, f.nodeIdx = idx, map[string]int{}
	f.rtt = make([][]float64, len(f.frontends))
	for i, fe := range f.frontends {
		f.nodeIdx[fe.NodeID] = i
		f.rtt[i] = make([]float64, len(f.engines))
		for j, e := range f.engines {
			ms, ok := spec.RTTMs(fe.Region, e.Region)
			if !ok {
				return nil, fmt.Errorf("control plane: no round trip between %s and %s", fe.Region, e.Region)
			}
			f.rtt[i][j] = ms
		}
	}
	return c, nil
}

// Seed sets the published weights (e.g. from a state file written by a
// previous process), so the first cycle holds them unless the deadband is
// crossed, and the translation reproduces the same versions.
//
// A share that is not a finite number ≥ 0, or a negative version, is an
// error and nothing is seeded: held by the deadband, such a share would
// fail every cycle's translation. Nodes, classes and engines the fleet no
// longer has (the spec changed between runs) are left out and named in
// ignored, for the caller to report.
func (c *Controller) Seed(weights map[string]map[string]map[string]float64, version int64) (ignored []string, err error) {
	if version < 0 {
		return nil, fmt.Errorf("seed: version %d is negative", version)
	}
	nodes, classes := map[string]bool{}, map[string]bool{}
	for _, fe := range c.problem.frontends {
		nodes[fe.NodeID] = true
	}
	for _, cl := range c.problem.classes {
		classes[cl.Name] = true
	}
	seeded := map[string]*NodeDecision{}
	for _, node := range slices.Sorted(maps.Keys(weights)) {
		if !nodes[node] {
			ignored = append(ignored, fmt.Sprintf("node %q", node))
			continue
		}
		nd := &NodeDecision{NodeID: node, Classes: map[string]*ClassDecision{}}
		for _, cl := range slices.Sorted(maps.Keys(weights[node])) {
			if !classes[cl] {
				ignored = append(ignored, fmt.Sprintf("node %q class %q", node, cl))
				continue
			}
			w := map[string]float64{}
			for _, id := range slices.Sorted(maps.Keys(weights[node][cl])) {
				v := weights[node][cl][id]
				if !(v >= 0) || math.IsInf(v, 0) {
					return nil, fmt.Errorf("seed: node %q class %q engine %q: share %v, want a finite number ≥ 0", node, cl, id, v)
				}
				if _, ok := c.profiles[id]; !ok {
					ignored = append(ignored, fmt.Sprintf("node %q class %q engine %q", node, cl, id))
					continue
				}
				w[id] = v
			}
			nd.Classes[cl] = &ClassDecision{Class: cl, Weights: w, util: -1}
		}
		seeded[node] = nd
	}
	maps.Copy(c.published, seeded)
	c.version = max(c.version, version)
	return ignored, nil
}

// Published returns the published weights: node → class → engine → share.
func (c *Controller) Published() map[string]map[string]map[string]float64 {
	out := map[string]map[string]map[string]float64{}
	for n, nd := range c.published {
		out[n] = map[string]map[string]float64{}
		for cl, d := range nd.Classes {
			out[n][cl] = d.Weights
		}
	}
	return out
}

// Version is the last policy version issued.
func (c *Controller) Version() int64 { return c.version }

// Step runs one cycle: the steps below, each in its own file and pure
// but for the controller state it names.
func (c *Controller) Step(ctx context.Context, in Inputs) (*Result, error) {
	res := &Result{At: in.Now, Nodes: map[string]*NodeDecision{}, Allocator: fmt.Sprintf("%T", c.alloc)}
	decay := c.penaltyDecay(in.Now)    // since the last step (engines.go)
	demand := c.observeDemand(in, res) // 0. shape.go, demand.go
	c.lastStep = in.Now
	eng := c.assessEngines(in, decay, res) // 1–2. engines.go, penalty.go
	p := c.buildProblem(eng, demand)       // 3. problem.go
	sol, err := c.allocate(ctx, p, res)
	if err != nil {
		return nil, err
	}
	engUtil := solvedView(res, sol)                                         // view.go
	res.Affinity = c.splitTables(in.Prefixes, eng)                          // 5. affinity.go
	db := c.deadbandCycle(p, sol, in.Engines, demand, c.problem.priorities) // 4. deadband.go
	nextVersion := max(c.version+1, in.Now.UnixMilli())
	classes := map[string][]translate.Class{}
	for _, fe := range c.problem.frontends {
		// 4: weights.go, hold.go, and the classes' policies (publish.go)
		res.Nodes[fe.NodeID], classes[fe.NodeID] = c.decideNode(fe, sol, eng, engUtil, db, res)
	}
	// 6: every node's weights are known, so each node's policy can say
	// which engines only it sends requests to (exclusiveEngines).
	exclusive := c.exclusiveEngines(res.Nodes, demand, in.Instances)
	for _, fe := range c.problem.frontends {
		nd := res.Nodes[fe.NodeID]
		if err := c.translateNode(fe, nd, classes[fe.NodeID], eng.health, exclusive[fe.NodeID], c.published[fe.NodeID], in.Now, nextVersion); err != nil {
			return nil, fmt.Errorf("cycle: %w", err)
		}
		if nd.Changed {
			res.Publish = append(res.Publish, nd.Resources)
		}
	}
	c.commit(res, in.Demand, nextVersion)
	return res, nil
}

// observeDemand learns what the demand is made of before anything is
// judged against it. What our own traffic puts on each engine now is the
// weights in force (published, or seeded from a state file) times the
// demand admitted now: background load is measured against this, not
// against the last cycle's plan (a surge of our own demand, or a restart,
// read against an older plan looked like background load, cut every busy
// engine's capacity and shed even the top priority). Both sides count work
// with the same shapes, learned first (shape.go): planned with the spec's
// 200/200-token mean against ~1k-token prompts, our own traffic read as
// background load. It returns the smoothed demand (demand.go).
func (c *Controller) observeDemand(in Inputs, res *Result) map[signals.DemandKey]signals.DemandRate {
	c.traffic = c.classTraffic(in.Demand)
	c.shapeView = c.updateShapes(in.Now, in.Demand, in.Engines, c.traffic)
	c.updateBounds(in.Prefixes)
	res.Shapes = c.shapeView
	c.planned, c.plannedReq = c.plannedFromPublished(in.Demand)
	return c.smoothDemand(in.Now, in.Demand, in.DemandWindow)
}

// decideNode is step 4 for one frontend: per class the proposal
// (weights.go), the deadband (hold.go) and the class's policy
// (publish.go), which the node's translation (step 6) takes.
func (c *Controller) decideNode(fe fleet.Frontend, sol *optimizer.Solution, eng engineStep, engUtil map[string]float64,
	db *deadbandCycle, res *Result) (*NodeDecision, []translate.Class) {
	prev := c.published[fe.NodeID]
	nd := &NodeDecision{NodeID: fe.NodeID, Classes: map[string]*ClassDecision{}}
	var classes []translate.Class
	for _, cl := range c.problem.classes {
		cd, flow, util := c.propose(fe.NodeID, cl, sol, eng, engUtil)
		var prevCD *ClassDecision
		if prev != nil {
			prevCD = prev.Classes[cl.Name]
		}
		util = c.hold(fe.NodeID, cl, flow != nil, prevCD, cd, util, db, eng)
		cd.Utilization = util
		nd.Classes[cl.Name] = cd
		classes = append(classes, c.classPolicy(cl, cd, util, res.Affinity[cl.Name]))
	}
	return nd, classes
}

// commit makes the cycle's decisions the published ones: the version (if
// anything is published), the weights, the load they plan, the split
// tables.
func (c *Controller) commit(res *Result, dem map[signals.DemandKey]signals.DemandRate, nextVersion int64) {
	if len(res.Publish) > 0 {
		c.version = nextVersion
	}
	if weightsMoved(c.published, res.Nodes) {
		c.weightsMovedAt = res.At
	}
	c.published = res.Nodes
	c.planned, c.plannedReq = c.plannedFromPublished(dem)
	for cl, av := range res.Affinity {
		c.tables[cl] = av.rules
		c.depths[cl] = av.SharedDepthBytes
	}
}

// weightsMoved reports whether any frontend's class weights differ between
// two publications.
func weightsMoved(old, cur map[string]*NodeDecision) bool {
	if len(old) != len(cur) {
		return true
	}
	for n, nd := range cur {
		o := old[n]
		if o == nil || len(o.Classes) != len(nd.Classes) {
			return true
		}
		for cl, cd := range nd.Classes {
			oc := o.Classes[cl]
			if oc == nil || !maps.Equal(oc.Weights, cd.Weights) {
				return true
			}
		}
	}
	return false
}

// InflightLimit is a class's local in-flight limit at one ext_proc instance
// (RoutingPolicy local_inflight_limit): three times the running slots of
// its eligible engines. Requests in flight at ext_proc include their time in
// Envoy and on the network, and under overload the fleet is planned at
// OverloadHeadroom with a queue: with twice the slots, ext_proc's local
// guardrail sheds more than the policy does and leaves capacity unused. The least important level is refused at 1.8× the slots
// (extproc's 40% reserve).
func (c *Controller) InflightLimit(class string) int {
	n := 0
	for _, j := range c.problem.eligible[class] {
		e := c.problem.engines[j]
		if fp, ok := c.spec.ProfileOf(e); ok {
			n += 3 * fp.MaxRunning * max(e.Replicas, 1)
		}
	}
	return n
}

// IntakeOptions are the Reports intake's names (the fleet's frontends,
// classes and priorities) and plausibility bounds for what an honest
// ext_proc under this controller's policies can report: a frontend carries
// at most its max_requests_per_s (default twice the fleet's capacity); an
// instance has at most its classes' local in-flight limits in flight; a
// request makes at most 1 + MaxRetries attempts and reports at most the
// largest context of the fleet in prompt and in output tokens (ext_proc
// caps both at its class's context limit). Window and clock are the
// caller's.
func (c *Controller) IntakeOptions() signals.IntakeOptions {
	spec := c.spec
	o := signals.IntakeOptions{MaxRequestsPerS: map[string]float64{}, MaxInflight: map[string]float64{},
		CapacityBound: map[string]bool{}, Engines: map[string]string{}, MaxAttempts: 1 + float64(c.cfg.MaxRetries)}
	for _, e := range spec.Engines {
		o.Engines[e.Address] = e.ID
	}
	for _, f := range spec.Frontends {
		o.Nodes = append(o.Nodes, f.NodeID)
	}
	for _, p := range spec.Priorities {
		o.Priorities = append(o.Priorities, p.Name)
	}
	inflight := 0.0
	for _, cl := range spec.Classes {
		o.Classes = append(o.Classes, cl.Name)
		inflight += float64(c.InflightLimit(cl.Name))
	}
	for _, f := range spec.Frontends {
		b := f.MaxRequestsPerS
		if b <= 0 {
			b = signals.CapacityBoundFactor * c.CapacityRPS()
			o.CapacityBound[f.NodeID] = true
		}
		o.MaxRequestsPerS[f.NodeID], o.MaxInflight[f.NodeID] = b, inflight
	}
	for _, m := range spec.Models {
		o.MaxTokensPerRequest = max(o.MaxTokensPerRequest, float64(m.MaxContextTokens))
	}
	for _, p := range spec.Profiles {
		o.MaxTokensPerRequest = max(o.MaxTokensPerRequest, float64(p.MaxContextTokens))
	}
	return o
}

// CapacityRPS is the fleet's capacity in reference requests per second (each
// engine's profile capacity times its replicas).
func (c *Controller) CapacityRPS() float64 {
	sum := 0.0
	for _, e := range c.problem.engines {
		sum += c.profiles[e.ID].CapacityRPS * float64(max(e.Replicas, 1))
	}
	return sum
}

// plannedFromPublished is the load (reference req/s per engine) the
// published weights send at the given demand, counting only what ext_proc
// admits (shed requests never reach an engine), each class's requests at
// its learned work (shapeOf); req is the same in requests/s.
// exclusiveShare is the share of an engine's requests one node must send,
// under the weights decided and the demand, for its policy to call the
// engine exclusive (a neighbour's probe share does not count against it).
const exclusiveShare = 0.9

// exclusiveEngines is, per node, the engines it sends at least
// exclusiveShare of the requests of, with the cycle's weights and smoothed
// demand (every class). A boolean, so that the policy changes only when a
// share crosses the bound, not with every change of demand. A node served
// by several ext_proc instances (instances) has none: exclusive promises
// the instance that it sees the engine's requests (placement moves a
// request to an engine that looks idle to it, which another instance's
// requests may be keeping busy).
func (c *Controller) exclusiveEngines(nodes map[string]*NodeDecision, dem map[signals.DemandKey]signals.DemandRate, instances map[string]int) map[string]map[string]bool {
	byNode := map[string]map[string]float64{}
	total := map[string]float64{}
	for _, fe := range c.problem.frontends {
		if nodes[fe.NodeID] == nil {
			continue
		}
		m := map[string]float64{}
		c.eachEngineRate(fe.NodeID, nodes[fe.NodeID], dem, func(_, id string, r float64) {
			if r > 0 {
				m[id] += r
				total[id] += r
			}
		})
		byNode[fe.NodeID] = m
	}
	out := map[string]map[string]bool{}
	for node, m := range byNode {
		ex := map[string]bool{}
		for id, r := range m {
			ex[id] = r >= exclusiveShare*total[id] && instances[node] <= 1
		}
		out[node] = ex
	}
	return out
}

func (c *Controller) plannedFromPublished(dem map[signals.DemandKey]signals.DemandRate) (ref, req map[string]float64) {
	ref, req = map[string]float64{}, map[string]float64{}
	traffic := c.classTraffic(dem)
	for _, cl := range c.problem.classes {
		sh := c.shapeOf(cl)
		for id, rate := range traffic[cl.Name] {
			p := c.profiles[id]
			ref[id] += rate * p.Ratio(sh)
			req[id] += rate
		}
	}
	return ref, req
}

// minPenalty: smaller penalties are dropped to 0. Every penalty costs
// PenaltyCostMs × penalty per request in the optimizer, so a lingering tail
// (0.001 × 1500 ms still outweighs the congestion differences of a lightly
// loaded fleet) would keep a recovered engine drained for many half-lives.
const minPenalty = 0.01

// touchesRecovered reports whether any engine eligible for the class
// recovered this cycle. For such classes the cycle solves without the
// stability term (no Last weights): the traffic a penalty or a failure took
// away from the engine goes back. Stability would otherwise hold it away
// for good at low load, where moving it back gains little latency, and the
// move back is cheap: Maglev with the pre-fault weights maps conversations
// to the engines they had before, whose caches still hold them.
func (c *Controller) touchesRecovered(class string, recovered map[string]bool) bool {
	if len(recovered) == 0 {
		return false
	}
	for _, j := range c.problem.eligible[class] {
		if recovered[c.problem.engines[j].ID] {
			return true
		}
	}
	return false
}

// maxContext is the longest request (prompt + output tokens) the class
// guarantees: the smallest context limit among its eligible engines
// (fleet.Class.ContextLimit), since Envoy may send a request of the class to
// any of them.
func (c *Controller) maxContext(cl fleet.Class) int { return cl.ContextLimit }

func clamp(v, lo, hi float64) float64 {
	if math.IsNaN(v) {
		return lo
	}
	return math.Max(lo, math.Min(hi, v))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// sameSupport: the same engines have a positive share in both.
func sameSupport(a, b map[string]float64) bool {
	for k := range unionKeys(a, b) {
		if (a[k] > 1e-3) != (b[k] > 1e-3) {
			return false
		}
	}
	return true
}

func unionKeys[K comparable, V any](a, b map[K]V) map[K]bool {
	out := map[K]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// minShedFraction: smaller shed fractions are solver noise and dropped.
const minShedFraction = 1e-3

// consistentShed makes a flow's shed fractions what ext_proc enforces:
// ext_proc sheds a level only while every less important level is shed
// entirely (extproc.Compile), and the optimizer sheds least important
// first, so a level it sheds has every less important one shed too — but
// it reports a level without demand (nothing to shed) as 0, and a fully
// shed one as a hair below 1. Both made ext_proc ignore the shedding of
// the levels above: under a 1.3× overload of a single priority the
// control plane shed it and ext_proc admitted everything. So every level
// less important than the most important one shed is published as 1, and
// fractions below minShedFraction are dropped.
func consistentShed(levels map[uint32]float64, prios []translate.Priority) map[uint32]float64 {
	out := map[uint32]float64{}
	top, any := uint32(0), false
	for _, pr := range prios {
		f := levels[pr.Level]
		if f < minShedFraction {
			continue
		}
		out[pr.Level] = math.Min(f, 1)
		if !any || pr.Level < top {
			top, any = pr.Level, true
		}
	}
	if !any {
		return out
	}
	for _, pr := range prios {
		if pr.Level > top {
			out[pr.Level] = 1
		}
	}
	return out
}

// inherit takes over what old learnt of the engines this controller still
// has (a fleet update, Runner.UpdateFleet): their penalties and why, which
// were impaired, the planned loads (and own loads of recent cycles) and when the weights last moved, and
// the smoothed demand and class shapes (the classes are the same). What
// old knew of engines that left is dropped.
func (c *Controller) inherit(old *Controller) {
	for id := range c.profiles {
		if v, ok := old.penalties[id]; ok {
			c.penalties[id] = v
		}
		if v, ok := old.cause[id]; ok {
			c.cause[id] = v
		}
		if old.impaired[id] {
			c.impaired[id] = true
		}
		if v, ok := old.planned[id]; ok {
			c.planned[id] = v
		}
	}
	if old.plannedReq != nil {
		c.plannedReq = map[string]float64{}
		for id, v := range old.plannedReq {
			if _, ok := c.profiles[id]; ok {
				c.plannedReq[id] = v
			}
		}
	}
	c.lastStep, c.weightsMovedAt = old.lastStep, old.weightsMovedAt
	c.smoothed, c.smoothedAt = old.smoothed, old.smoothedAt
	c.ownSeen = old.ownSeen
	c.shapes = old.shapes
	c.tight = old.tight
	c.tables = old.tables
}
