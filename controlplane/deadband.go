package controlplane

import (
	"math"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/ordered"
	"github.com/inferlb/inferlb/optimizer"
)

// The deadband weighs what new weights gain against the cache misses they
// cause. Weighted Maglev moves about RemapFactor × TV of a flow's keys when
// its weights move by TV (total variation); each moved key's next request
// finds a cold engine and prefills again what its old engine had cached.
// New weights are published for a (frontend, class) when
//
//	gain ≥ RemapFactor × TV × routed × missMs
//
// where gain is the latency cost, ms·req/s, of keeping the published
// weights minus that of the proposal, both priced by the optimizer's model
// at the demand admitted now (optimizer.Evaluator: every other flow at its
// decided weights), routed the flow's rate and missMs the prefill time of
// a request's cached prefix (prompt × the old engines' observed hit rate,
// at the new engines' prefill rate). Both sides are latency per second;
// the cost side counts every request of a moved key as a miss while the
// gain is counted, so the rule leans to holding: new weights must pay for
// their misses within about one request of each moved conversation.
// Below DeadbandTV nothing is published unless the set of engines with a
// share changes; a health change or a recovered engine always publishes.
//
// A fixed TV threshold alone published whenever noisy demand moved the
// optimum by 3% (at steady demand a 10 s window of a few requests a second
// moves by ±15%), although near the optimum the latency cost is flat and
// the misses are not.

// deadbandCycle is one cycle's deadband: its inputs, and the pricing of
// the weights, built on the first flow that needs it.
type deadbandCycle struct {
	c       *Controller
	p       *optimizer.Problem
	sol     *optimizer.Solution
	engines []signals.Engine
	demand  map[signals.DemandKey]signals.DemandRate // as planned (demand.go)
	prios   []fleet.Priority
	db      *deadband // nil until priced
	// done holds the weights of the flows decided before db was priced.
	done map[[2]string]map[string]float64
}

func (c *Controller) deadbandCycle(p *optimizer.Problem, sol *optimizer.Solution, engines []signals.Engine,
	demand map[signals.DemandKey]signals.DemandRate, prios []fleet.Priority) *deadbandCycle {
	return &deadbandCycle{c: c, p: p, sol: sol, engines: engines, demand: demand, prios: prios}
}

// apply decides whether cd keeps prevCD's published weights: below
// DeadbandTV with the same engines, or when the proposal's gain does not
// pay for its misses (priced only for flows the optimizer solved). A held
// routing that names an engine the class can no longer use costs +Inf, so
// it is never kept. The caller has ruled out health changes and
// recoveries, which always publish.
func (dc *deadbandCycle) apply(node string, cl fleet.Class, solved bool, prevCD, cd *ClassDecision) {
	switch {
	case cd.TVDistance < dc.c.cfg.DeadbandTV && sameSupport(prevCD.Weights, cd.Proposed):
		cd.Held = true
	case solved:
		held := map[string]float64{}
		for id := range cd.Proposed {
			held[id] = prevCD.Weights[id]
		}
		db := dc.pricing()
		cd.Gain, cd.MissCost = db.worth(node, cl.Name, held, cd.Proposed, cd.TVDistance, meanPrompt(dc.demand, node, cl, dc.prios))
		cd.Held = cd.Gain < cd.MissCost && !dc.c.balanceHolds(held, cd.Proposed, dc.c.cfg.DeadbandTV)
	}
	if cd.Held {
		cd.Weights = prevCD.Weights
	}
}

// decided records the weights a flow got, for the flows priced after it.
func (dc *deadbandCycle) decided(node, class string, w map[string]float64) {
	if dc.db != nil {
		dc.db.ev.Set(node, class, w)
		return
	}
	if dc.done == nil {
		dc.done = map[[2]string]map[string]float64{}
	}
	dc.done[[2]string{node, class}] = w
}

func (dc *deadbandCycle) pricing() *deadband {
	if dc.db == nil {
		dc.db = dc.c.newDeadband(dc.p, dc.sol, dc.engines)
		for k, w := range dc.done {
			dc.db.ev.Set(k[0], k[1], w)
		}
	}
	return dc.db
}

// deadband holds one cycle's pricing of the published weights.
type deadband struct {
	ev     *optimizer.Evaluator
	remap  float64
	hit    map[string]float64 // engine → observed prefix-cache hit rate
	prefil map[string]float64 // engine → prefill tokens per second
}

func (c *Controller) newDeadband(p *optimizer.Problem, sol *optimizer.Solution, engines []signals.Engine) *deadband {
	db := &deadband{ev: optimizer.NewEvaluator(p, sol), remap: p.RemapFactor, hit: map[string]float64{}, prefil: map[string]float64{}}
	if db.remap == 0 {
		db.remap = optimizer.DefaultRemapFactor
	}
	for _, e := range engines {
		if e.Status() == signals.Up && e.PrefixCacheHitRate > 0 {
			db.hit[e.ID] = math.Min(e.PrefixCacheHitRate, 1)
		}
	}
	for id, pr := range c.profiles {
		db.prefil[id] = pr.PrefillTokensPerS
	}
	return db
}

// missMs is the expected extra prefill, ms, of one request moved from
// the engines of old to those of proposed: its cached prefix (prompt ×
// the hit rate of the engine it leaves, weighted by old) recomputed at
// the prefill rate of the engine it goes to (weighted by proposed).
func (db *deadband) missMs(prompt float64, old, proposed map[string]float64) float64 {
	h, hw := 0.0, 0.0
	for _, id := range ordered.Keys(old) { // in key order: bit for bit in every run
		if w := old[id]; w > 0 {
			h += w * db.hit[id]
			hw += w
		}
	}
	sec, sw := 0.0, 0.0
	for _, id := range ordered.Keys(proposed) {
		if w, r := proposed[id], db.prefil[id]; w > 0 && r > 0 {
			sec += w / r
			sw += w
		}
	}
	if !(hw > 0 && sw > 0 && prompt > 0) {
		return 0
	}
	return 1000 * prompt * (h / hw) * (sec / sw)
}

// worth prices publishing proposed instead of held for (node, class):
// its gain and the misses it costs, both ms·req/s. held must name only
// engines the class may use (the cycle's held map).
func (db *deadband) worth(node, class string, held, proposed map[string]float64, tvDist, prompt float64) (gain, cost float64) {
	db.ev.Set(node, class, held)
	keep := db.ev.Cost()
	db.ev.Set(node, class, proposed)
	move := db.ev.Cost()
	gain = keep - move
	if math.IsInf(keep, 1) {
		gain = math.Inf(1)
	}
	cost = db.remap * tvDist * db.ev.Routed(node, class) * db.missMs(prompt, held, proposed)
	return gain, cost
}

// meanPrompt is the (frontend, class)'s mean prompt as reported (every
// token, cached or not: what a moved request loses is its cached share),
// else the class's.
func meanPrompt(dem map[signals.DemandKey]signals.DemandRate, node string, cl fleet.Class, prios []fleet.Priority) float64 {
	req, pt := 0.0, 0.0
	for _, pr := range prios {
		d := dem[signals.DemandKey{Node: node, Class: cl.Name, Priority: pr.Name}]
		req += d.RequestsPerS
		pt += d.PromptTokens * d.RequestsPerS
	}
	if req > 0 && pt > 0 {
		return pt / req
	}
	return cl.MeanPromptTokens
}
