package fleetsim

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Regional rivals: llm-d's EPP, SGLang's router and Dynamo's KV router as
// their users deploy them, one per cluster. Each frontend's router sees
// only its own region's engines and scores them as the global variant
// does; it spills to the nearest other region (by round trip) only when
// none of its own engines is eligible. What eligible means follows each
// rival's own admission rule:
//
//   - llm_d_regional: healthy, serving the class's model, and not saturated
//     by the EPP's saturation detector (gateway-api-inference-extension
//     saturationdetector/utilization, defaults QueueDepthThreshold 5 waiting
//     requests and KVCacheUtilThreshold 0.8): a pool with no unsaturated pod
//     is what the EPP reports as out of capacity.
//   - sglang_regional: healthy and serving the model. SGLang's router has
//     per-worker health checks and circuit breakers (Envoy's health verdict
//     here) and a router-wide concurrency limiter that queues at the
//     router; no per-worker admission limit to spill on.
//   - dynamo_regional: healthy and serving the model. Dynamo's busy
//     thresholds (request rejection: every eligible worker busy → HTTP 529)
//     are all unset by default, so no worker is ever busy.
//
// When no region has an eligible engine, the router keeps to the nearest
// region with a healthy one (llm-d schedules non-sheddable requests on a
// saturated pool; nothing here sheds).

// Regional policy names.
const (
	PolicyLLMDRegional   = "llm_d_regional"
	PolicySGLangRegional = "sglang_regional"
	PolicyDynamoRegional = "dynamo_regional"
)

// llm-d EPP saturation detector defaults (utilization detector).
const (
	llmdSatQueueDepth = 5
	llmdSatKVUtil     = 0.8
)

// regionScope restricts a router's candidates to one region: the nearest
// region (by round trip from the request's frontend, its own first) that
// has an eligible candidate.
type regionScope struct {
	// tier[f][j] is engine j's region's rank by round trip from frontend
	// f: 0 for the nearest (the frontend's own region when it has
	// engines), then in order of round trip; engines of one region share
	// a rank.
	tier [][]int
	// eligible is the rival's admission test beyond health (nil: every
	// healthy engine is eligible).
	eligible func(j int) bool
}

func newRegionScope(s *Sim, eligible func(j int) bool) *regionScope {
	rs := &regionScope{eligible: eligible}
	for _, f := range s.fronts {
		rs.tier = append(rs.tier, regionTiers(f.spec.Region, f.owd, s.engines))
	}
	return rs
}

// regionTiers ranks the engines' regions by one-way delay from a frontend
// in region home: ties go to home, then by name, so the rank is
// deterministic.
func regionTiers(home string, owd []time.Duration, engines []*engine) []int {
	type reg struct {
		name string
		d    time.Duration
	}
	seen := map[string]bool{}
	var regs []reg
	for j, e := range engines {
		if !seen[e.region] {
			seen[e.region] = true
			regs = append(regs, reg{e.region, owd[j]})
		}
	}
	slices.SortFunc(regs, func(a, b reg) int {
		if c := cmp.Compare(a.d, b.d); c != 0 {
			return c
		}
		if (a.name == home) != (b.name == home) {
			if a.name == home {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.name, b.name)
	})
	rank := map[string]int{}
	for i, r := range regs {
		rank[r.name] = i
	}
	out := make([]int, len(engines))
	for j, e := range engines {
		out[j] = rank[e.region]
	}
	return out
}

// restrict keeps, of the candidates c (healthy, serving the model), those
// in the nearest region that has an eligible one; when no region has, those
// in the nearest region. It reuses c's array.
func (rs *regionScope) restrict(front int, c []int) []int {
	if len(c) == 0 {
		return c
	}
	tier := rs.tier[front]
	best, bestAny := -1, -1
	for _, j := range c {
		t := tier[j]
		if bestAny < 0 || t < bestAny {
			bestAny = t
		}
		if (best < 0 || t < best) && (rs.eligible == nil || rs.eligible(j)) {
			best = t
		}
	}
	if best < 0 {
		best = bestAny
	}
	out := c[:0]
	for _, j := range c {
		if tier[j] == best {
			out = append(out, j)
		}
	}
	return out
}

// llmdUnsaturated is the EPP saturation detector's per-pod test: waiting
// queue and KV cache utilization at most their thresholds.
func (s *Sim) llmdUnsaturated(j int) bool {
	st := s.engines[j].reps.Stats()
	return st.Waiting <= llmdSatQueueDepth && st.KVUsage <= llmdSatKVUtil
}

func newRegionalPolicy(name string, s *Sim) Policy {
	switch name {
	case PolicyLLMDRegional:
		l := newLLMD(s)
		l.scope = newRegionScope(s, s.llmdUnsaturated)
		return l
	case PolicySGLangRegional:
		g := newSGLang(s)
		g.scope = newRegionScope(s, nil)
		return g
	case PolicyDynamoRegional:
		return &dynamo{base: base{s: s, scope: newRegionScope(s, nil)}}
	}
	return nil
}

// rivalFamilies pairs each rival's global and regional deployment: a
// comparison counts only against the stronger of the two.
var rivalFamilies = [][2]string{
	{PolicyLLMD, PolicyLLMDRegional},
	{PolicySGLang, PolicySGLangRegional},
	{PolicyDynamo, PolicyDynamoRegional},
}

// notRivals are the project's own policies (inferlb and its ablation).
var notRivals = []string{PolicyInferlb, PolicyRandomKey}

// stronger reports whether a beats b: lower TTFT p99, then less shed, then
// lower p50. A policy that served nothing (NaN) loses.
func stronger(a, b *PolicyResult) bool {
	ap, bp := a.TTFT.P99, b.TTFT.P99
	switch {
	case ap != ap:
		return false
	case bp != bp:
		return true
	case ap != bp:
		return ap < bp
	case a.ShedPct != b.ShedPct:
		return a.ShedPct < b.ShedPct
	}
	return a.TTFT.P50 < b.TTFT.P50
}

// markStrongest sets the scenario's strongest rival (every policy but
// inferlb and random_key) and, for each rival run in both deployments,
// the stronger one.
func markStrongest(r *ScenarioResult) {
	by := map[string]*PolicyResult{}
	var best *PolicyResult
	for _, p := range r.Policies {
		by[p.Policy] = p
		if slices.Contains(notRivals, p.Policy) {
			continue
		}
		if best == nil || stronger(p, best) {
			best = p
		}
	}
	r.StrongestRival = ""
	if best != nil {
		r.StrongestRival = best.Policy
	}
	r.StrongerVariant = nil
	for _, f := range rivalFamilies {
		g, l := by[f[0]], by[f[1]]
		if g == nil || l == nil {
			continue
		}
		w := g
		if stronger(l, g) {
			w = l
		}
		r.StrongerVariant = append(r.StrongerVariant, w.Policy)
	}
}

// writeStrongest notes, under a scenario's table, the strongest rival and
// the stronger deployment of each rival run both ways.
func writeStrongest(w io.Writer, r *ScenarioResult) {
	if r.StrongestRival == "" {
		return
	}
	fmt.Fprintf(w, "\nStrongest rival (lowest TTFT p99, then least shed, of every policy but inferlb and random_key): **%s**.", r.StrongestRival)
	if len(r.StrongerVariant) > 0 {
		fmt.Fprintf(w, " Stronger deployment of each rival (global or per region): %s.", strings.Join(r.StrongerVariant, ", "))
	}
	fmt.Fprintln(w)
}
