package controlplane

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/ordered"
	"github.com/inferlb/inferlb/optimizer"
)

// Work per request.
//
// The optimizer plans engine load in reference requests: a class's request
// counts Profile.Ratio(shape) of them. The shape is each class's, learned
// from what the cycle observes, not the fleet spec's mean:
//
//   - prompt and output tokens per request from the demand reports (their
//     token totals over the requests of every frontend and priority),
//   - the cached share of the prompt from the engines' own prefix-cache
//     counters (vLLM prefix_cache_hits/queries, SGLang cached/prompt tokens
//     or its cache_hit_rate), averaged over the engines in proportion to
//     the class's traffic on each under the weights in force.
//
// The fleet spec's shape (mean_prompt_tokens, mean_output_tokens, nothing
// cached) is the prior: it holds until something is observed, as a
// pseudo-count of priorRatePerS requests/s, and the estimate then follows
// the observations with time constant Config.ShapeSmoothing (token and
// request rates are smoothed separately, so a busier interval weighs more
// and an idle class keeps its last shape).
//
// Bounds. A report is outside input: one claiming tiny requests would make
// capacity look unbounded (nothing shed in an overload), one claiming huge
// ones would shed everything. The tokens the class's engines processed are
// scraped by the control plane itself, so each interval's observation is
// kept within shapeTrust (2×) of what the engines saw per admitted request
// of the class, widened to always include the prior: the prompt tokens per
// request lie in [min(prior, E/(2·A)), max(prior, 2·E/A)], E being the
// class's eligible engines' prompt tokens/s and A the class's admitted
// requests/s (likewise output tokens). Before the engines saw any traffic
// the upper bound is the prior. A request has at least one prompt and one
// output token and at most the class's context limit. The cached share is
// at most Config.MaxCachedShare: a forged or broken hit counter cannot make
// prefill free.
//
// The feedback loop. The hit rate depends on the routing (affinity keeps a
// conversation's history on the engine that caches it). It is measured
// under the allocation in force and used to plan the next one, which the
// deadband and the stability term keep close to it (moved traffic, whose
// cache is cold, is a few percent per update and is charged StabilityMs per
// request). Weighting the engines by the class's traffic under the weights
// in force means a share moved to a cold engine shows up as that engine's
// lower hit rate in the next measurements, not as a belief about the
// allocation being planned. The slow smoothing keeps a transient miss burst
// (a failover, a restart) from swinging capacity, and a fall of the hit
// rate can only remove capacity gradually.

// priorRatePerS is the weight (requests/s) of the fleet spec's shape in a
// class's estimate: small against any real demand, so the first reports
// take over at once.
const priorRatePerS = 0.1

// shapeTrust bounds each observation to this factor of what the class's
// engines measured themselves (see above).
const shapeTrust = 2

// ClassShape is the admin view of one class's work estimate.
type ClassShape struct {
	// PromptTokens, OutputTokens: mean tokens per request; CachedShare the
	// share of the prompt served from the prefix caches.
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	CachedShare  float64 `json:"cached_share"`
	// Observed: the estimate has seen reports (else it is the prior);
	// CacheObserved: it has seen the engines' cache counters.
	Observed      bool `json:"observed"`
	CacheObserved bool `json:"cache_observed"`
	// Bounded names the bound that clipped this cycle's observation, if
	// any ("prompt above what the engines processed", ...).
	Bounded string `json:"bounded,omitempty"`
	// HashBalanceFactor is the bounded-load factor the class's clusters
	// get when it is not the translation's (boundedload.go: the tightest,
	// 100, while the class reuses no cache); 0 otherwise.
	HashBalanceFactor uint32 `json:"hash_balance_factor,omitempty"`
}

// Shape is the optimizer's request shape.
func (s ClassShape) Shape() optimizer.Shape {
	return optimizer.Shape{PromptTokens: s.PromptTokens, OutputTokens: s.OutputTokens, CachedShare: s.CachedShare}
}

// shapeState is one class's smoothed estimate: rates, so that the shape is
// a ratio of smoothed totals.
type shapeState struct {
	reqs, prompt, output float64 // requests/s, prompt and output tokens/s
	cached               float64
	observed, cacheSeen  bool
	at                   time.Time
}

func newShapeState(cl fleet.Class) *shapeState {
	return &shapeState{reqs: priorRatePerS, prompt: priorRatePerS * cl.MeanPromptTokens, output: priorRatePerS * cl.MeanOutputTokens}
}

// shapeObservation is one cycle's evidence about a class.
type shapeObservation struct {
	reqs, prompt, output float64 // reported requests/s and their mean tokens
	admitted             float64 // requests/s admitted (not shed)
	// engPrompt, engOutput: prompt and generated tokens/s of the class's
	// eligible engines that are up (all their traffic).
	engPrompt, engOutput float64
	// hit and hitWeight: the traffic-weighted hit rate of the class's
	// engines (hitWeight 0: no evidence).
	hit, hitWeight float64
}

// updateShapes folds this cycle's observations into every class's estimate
// and returns the estimates. traffic is each class's requests/s per engine
// under the weights in force (classTraffic).
func (c *Controller) updateShapes(now time.Time, dem map[signals.DemandKey]signals.DemandRate, engines []signals.Engine,
	traffic map[string]map[string]float64) map[string]ClassShape {
	f := &c.problem
	sig := map[string]signals.Engine{}
	for _, e := range engines {
		if e.Status() == signals.Up {
			sig[e.ID] = e
		}
	}
	out := make(map[string]ClassShape, len(f.classes))
	for _, cl := range f.classes {
		var o shapeObservation
		for _, fe := range f.frontends {
			for _, pr := range f.priorities {
				d := dem[signals.DemandKey{Node: fe.NodeID, Class: cl.Name, Priority: pr.Name}]
				if !(d.RequestsPerS > 0) {
					continue
				}
				o.reqs += d.RequestsPerS
				o.prompt += d.RequestsPerS * d.PromptTokens
				o.output += d.RequestsPerS * d.OutputTokens
				o.admitted += math.Max(0, d.RequestsPerS-d.ShedPerS)
			}
		}
		if o.reqs > 0 {
			o.prompt /= o.reqs
			o.output /= o.reqs
		}
		tr := traffic[cl.Name]
		for _, j := range f.eligible[cl.Name] {
			e, ok := sig[f.engines[j].ID]
			if !ok {
				continue
			}
			o.engPrompt += math.Max(0, e.PromptTokensPerS)
			o.engOutput += math.Max(0, e.GenerationTokPerS)
			if !(e.PromptTokensPerS > 0) {
				continue // no prompt seen lately: its hit rate says nothing now
			}
			w := tr[e.ID]
			if tr == nil {
				w = e.PromptTokensPerS // nothing published yet: weigh by what each engine takes
			}
			if w > 0 {
				o.hit += w * clamp(hitRate(e), 0, 1)
				o.hitWeight += w
			}
		}
		if o.hitWeight > 0 {
			o.hit /= o.hitWeight
		}
		st := c.shapes[cl.Name]
		if st == nil {
			st = newShapeState(cl)
			c.shapes[cl.Name] = st
		}
		out[cl.Name] = st.fold(now, cl, o, c.cfg.ShapeSmoothing, c.cfg.MaxCachedShare)
	}
	return out
}

// hitRate is an engine's prefix-cache hit rate: its cached over its prompt
// tokens, or the server's own hit-rate gauge where it has no counters.
func hitRate(e signals.Engine) float64 {
	if e.PromptTokensPerS > 0 && e.CachedTokensPerS > 0 {
		return e.CachedTokensPerS / e.PromptTokensPerS
	}
	return e.PrefixCacheHitRate
}

// fold adds one observation (bounded) and returns the estimate.
func (st *shapeState) fold(now time.Time, cl fleet.Class, o shapeObservation, tau time.Duration, maxCached float64) ClassShape {
	a := 1.0
	if !st.at.IsZero() && tau > 0 {
		a = 1 - math.Exp(-now.Sub(st.at).Seconds()/tau.Seconds())
	}
	first := st.at.IsZero()
	st.at = now
	var why string
	if o.reqs > 0 {
		p, whyP := bound(o.prompt, cl.MeanPromptTokens, o.engPrompt, o.admitted, float64(cl.ContextLimit))
		out, whyO := bound(o.output, cl.MeanOutputTokens, o.engOutput, o.admitted, float64(cl.ContextLimit))
		why = joinWhy(prefixWhy("prompt", whyP), prefixWhy("output", whyO))
		if first {
			// The prior is a pseudo-count: the first observation adds to it.
			st.reqs += o.reqs
			st.prompt += o.reqs * p
			st.output += o.reqs * out
		} else {
			st.reqs += a * (o.reqs - st.reqs)
			st.prompt += a * (o.reqs*p - st.prompt)
			st.output += a * (o.reqs*out - st.output)
		}
		st.observed = true
	} else if !first {
		// No demand: the rates decay together and the shape is kept.
		st.reqs, st.prompt, st.output = st.reqs*(1-a), st.prompt*(1-a), st.output*(1-a)
	}
	if o.hitWeight > 0 {
		h := math.Min(o.hit, maxCached)
		if !st.cacheSeen {
			st.cached = h
		} else {
			st.cached += a * (h - st.cached)
		}
		st.cacheSeen = true
	}
	s := ClassShape{PromptTokens: cl.MeanPromptTokens, OutputTokens: cl.MeanOutputTokens, CachedShare: st.cached,
		Observed: st.observed, CacheObserved: st.cacheSeen, Bounded: why}
	if st.reqs > 1e-12 {
		s.PromptTokens, s.OutputTokens = st.prompt/st.reqs, st.output/st.reqs
	}
	s.CachedShare = clamp(s.CachedShare, 0, maxCached)
	return s
}

// bound keeps one observed mean (tokens per request) within the physical
// limits and within shapeTrust of what the engines processed per admitted
// request (engRate tokens/s over admitted requests/s), widened to include
// the prior. It returns the value and why it was clipped ("" if it was not).
func bound(v, prior, engRate, admitted, limit float64) (float64, string) {
	lo, hi := 1.0, prior
	evidence := engRate > 0 && admitted > 0
	if evidence {
		perReq := engRate / admitted
		lo = math.Min(prior, perReq/shapeTrust)
		hi = math.Max(prior, shapeTrust*perReq)
	}
	if limit > 0 {
		hi = math.Min(hi, limit)
	}
	lo = math.Max(1, lo)
	hi = math.Max(hi, lo)
	switch {
	case !(v >= lo): // NaN too
		return lo, "below what the engines processed"
	case v > hi:
		if evidence {
			return hi, "above what the engines processed"
		}
		return hi, "above the fleet spec's mean before the engines saw traffic"
	}
	return v, ""
}

func prefixWhy(what, why string) string {
	if why == "" {
		return ""
	}
	return what + " " + why
}

func joinWhy(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// classTraffic is each class's requests/s per engine under the weights in
// force (published, or seeded), at the demand admitted now: what our own
// traffic puts on each engine. Nil for a class without published weights.
func (c *Controller) classTraffic(dem map[signals.DemandKey]signals.DemandRate) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, fe := range c.problem.frontends {
		c.eachEngineRate(fe.NodeID, c.published[fe.NodeID], dem, func(class, id string, r float64) {
			m := out[class]
			if m == nil {
				m = map[string]float64{}
				out[class] = m
			}
			if _, ok := c.profiles[id]; ok {
				m[id] += r
			}
		})
	}
	return out
}

// eachEngineRate calls f, class by class and engine by engine in a fixed
// order, with the requests/s node's weights nd send each engine of the
// demand the node admits (every priority, less what it sheds; possibly 0).
// Classes nd has no weights for, or only zero weights, are skipped.
func (c *Controller) eachEngineRate(node string, nd *NodeDecision, dem map[signals.DemandKey]signals.DemandRate, f func(class, id string, r float64)) {
	if nd == nil {
		return
	}
	for _, cl := range c.problem.classes {
		cd := nd.Classes[cl.Name]
		if cd == nil {
			continue
		}
		rate := 0.0
		for _, pr := range c.problem.priorities {
			d := dem[signals.DemandKey{Node: node, Class: cl.Name, Priority: pr.Name}]
			rate += math.Max(0, d.RequestsPerS-d.ShedPerS)
		}
		sum := ordered.Sum(cd.Weights) // a fixed order: replicas agree to the bit
		if sum <= 0 {
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(cd.Weights)) {
			f(cl.Name, id, cd.Weights[id]/sum*rate)
		}
	}
}

// shapeOf is a class's current work estimate (the fleet spec's shape
// before the first cycle).
func (c *Controller) shapeOf(cl fleet.Class) optimizer.Shape {
	if s, ok := c.shapeView[cl.Name]; ok {
		return s.Shape()
	}
	return optimizer.Shape{PromptTokens: cl.MeanPromptTokens, OutputTokens: cl.MeanOutputTokens}
}

// outputTokenSec is an engine's cost of one output token (replica-seconds)
// for the traffic it carries under the weights in force: the classes'
// costs at their learned contexts (a long context bounds the batch by KV
// space), weighted by their output tokens/s, so that observed and planned
// utilization count work alike. OutputTokenSec without traffic.
func (c *Controller) outputTokenSec(id string) float64 {
	p := c.profiles[id]
	var w, sum float64
	for _, cl := range c.problem.classes {
		sh := c.shapeOf(cl)
		if v := c.traffic[cl.Name][id] * sh.OutputTokens; v > 0 {
			w += v
			sum += v * p.OutputTokenSecAt(sh.ContextTokens())
		}
	}
	if w <= 0 {
		return p.OutputTokenSec
	}
	return sum / w
}
