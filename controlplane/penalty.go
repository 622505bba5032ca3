package controlplane

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/ordered"
)

// Outlier penalties tell faults from overload.
//
// An engine's latency is compared with what its own step model (the fleet
// profile: decode step a + b per running sequence, prefill rate P, overhead)
// predicts at the load and queue it actually has, over the tracker's
// evidence window:
//
//	TBOT = (a + b·running) / (1 − uncached prompt tokens/s ÷ P)
//	TTFT = overhead + uncached prompt per request ÷ P + 1.5·TBOT + 2·waiting ÷ completions/s
//
// (the last term is the queue wait by Little's law, with room for bursts). A busy, healthy engine
// is slow because its batch is full and its queue long, and the prediction
// says so; a faulty one is slower than its own batch and queue explain. A
// third estimate comes from ext_proc: the time Envoy measured for requests
// the engine served to the end, against overhead + queue + the tokens they
// asked for at the predicted TBOT, plus the round trip and E2ESlackMs per
// request for the proxy path (Envoy, the network, a busy frontend: for a
// short request they would dwarf the engine's time). Each needs MinSamples;
// the largest residual counts.
//
// Load alone never penalizes the whole fleet: when every engine with
// evidence would get a latency penalty from its own metrics and all of them
// are loaded, the cause is demand, not faults, and no latency penalty is
// given (shedding is the answer to that). Likewise when ext_proc's timing
// finds every engine slow: the common cause is on the frontend's side (its
// CPU, its network), not in the engines.
//
// A penalty rises at once to its target. It decays (half-life) on evidence
// that the engine is doing well again; without evidence it decays
// heldSlowdown times slower — an engine that gets no traffic proves
// nothing, and forgetting fast let slow engines back in, but one old piece
// of evidence must not keep an engine out for good. A target from
// ext_proc's evidence (errors, request times) is worth the requests behind
// it (reportWorth): a report of a few responses cannot set a large penalty. To get that evidence, a penalized engine that is up
// keeps a probe share of each of its classes (enough for ProbeRPS, between
// MinProbeShare and MaxProbeShare), so its recovery is decided by traffic.

// observe builds every engine's view (state, health, utilization,
// background load) and assessment from the inputs; up marks the engines
// that are up.
func (c *Controller) observe(in Inputs) (views []EngineView, states []signals.State, as map[string]*assessment, up map[string]bool) {
	f := &c.problem
	sig := map[string]signals.Engine{}
	for _, e := range in.Engines {
		sig[e.ID] = e
	}
	evidence := map[string]signals.Evidence{}
	for addr, ev := range in.Evidence {
		if id, ok := f.byAddr[addr]; ok {
			evidence[id] = ev
		}
	}
	own := c.ownLoad(evidence, in.Now, in.DemandWindow)
	views, states = make([]EngineView, len(f.engines)), make([]signals.State, len(f.engines))
	as, up = map[string]*assessment{}, map[string]bool{}
	for j, e := range f.engines {
		s, ok := sig[e.ID]
		state := signals.New
		if ok {
			state = s.Status()
		}
		h, hf := c.healthOf(state)
		prof := c.profiles[e.ID]
		reps := float64(max(e.Replicas, 1))
		v := EngineView{ID: e.ID, State: state.String(), Health: h.String(), HealthFactor: hf}
		if state == signals.Up {
			work := math.Max(0, s.PromptTokensPerS-s.CachedTokensPerS)*prof.PromptTokenSec + s.GenerationTokPerS*c.outputTokenSec(e.ID)
			v.ObservedUtilization = work / reps
			// Background: load beyond what our traffic explains (the
			// weights in force times the demand admitted now, or what
			// ext_proc saw it put there: ownLoad), from the token rates.
			// A queue (a KV-bound batch never reaches the work model's
			// rate) means no spare capacity: when our traffic alone
			// would leave the engine well below capacity, the queue is
			// someone else's and the engine counts as full. When our own
			// traffic is near capacity, its queue is ours: counting it as
			// background cut the capacity of every engine an overload
			// queued on, and shed what the fleet could have served.
			v.PlannedUtilization = c.planned[e.ID] / (prof.CapacityRPS * reps)
			v.OwnUtilization = own[e.ID] / (prof.CapacityRPS * reps)
			// The queue and the token rates cover the evidence window
			// (the rates' smoothing is shorter): they are ours if our
			// traffic loaded the engine that much at any time in it.
			// Against this cycle's own load alone, a plan that has just
			// moved traffic off an engine would read the queue and the
			// rates that traffic left behind as someone else's, move
			// the rest off, and load the others until they queue in
			// turn: under overload, shares swing between equal engines
			// from one cycle to the next and the plan admits far less
			// than the engines serve (docs/control-plane.md, "One
			// cycle", step 1).
			v.OwnWindowUtilization = v.OwnUtilization
			if sec := s.Window.Seconds; sec > 0 {
				v.OwnWindowUtilization = math.Max(v.OwnWindowUtilization, c.ownPeak(e.ID, in.Now.Add(-time.Duration(sec*float64(time.Second)))))
			}
			ownWin := v.OwnWindowUtilization
			used := v.ObservedUtilization
			rates := used // the token rates' load, before a queue counts
			// Work beyond ours: the token rates exceed the most our
			// traffic loaded the engine by more than the noise floor.
			foreign := rates-ownWin > c.cfg.BackgroundFloor
			// A queue that lasts (the evidence window's mean, not one
			// scrape's burst) means no spare capacity.
			waiting, running := s.Waiting, s.Running
			if s.Window.Seconds > 0 {
				waiting, running = s.Window.Waiting, s.Window.Running
			}
			if s.Waiting >= 1 {
				v.ObservedUtilization = math.Max(v.ObservedUtilization, 0.95)
			}
			if waiting >= 1 && ownWin < ownQueue {
				used = math.Max(used, 0.95)
				// Full, and offered more than it serves by the queue
				// over the running batch (Little's law: the waiting
				// requests are served after the running ones): the
				// plan prices time to first token, which a foreign
				// queue sets, not the token rates. Only where the
				// engine serves work beyond ours (its token rates
				// exceed our own load by more than the noise floor)
				// is the queue known to be foreign. An engine that
				// serves our traffic alone queues ours: under
				// overload, bursts queue an engine our admitted
				// traffic loads well below capacity, and scaling that
				// queue into background (up to 0.95) would take the
				// engine out of the plan and move its traffic to the
				// others, which queue in turn: shares would swing
				// between equal engines and the plan would admit much
				// less than they serve.
				if over := 1.0; running > 0 && foreign {
					over += waiting / running
					used = math.Max(used, 0.95*over)
				}
			}
			// Estimates of both sides are noisy (token rates over a few
			// seconds against a work model): the first BackgroundFloor of
			// the difference is taken for noise, not someone else's load.
			// Before anything is published there is no plan to compare
			// with: every engine's load would read as background.
			if len(c.published) > 0 {
				v.BackgroundLoad = clamp(used-ownWin-c.cfg.BackgroundFloor, 0, 0.95)
				v.foreignWork = v.ObservedUtilization > 0 && foreign
			}
			up[e.ID] = true
		} else {
			s = signals.Engine{} // latency evidence only from an engine that is up
		}
		a := c.judge(e, s, evidence[e.ID], &v)
		as[e.ID] = &a
		views[j], states[j] = v, state
	}
	return views, states, as, up
}

// ownSample is one cycle's OwnUtilization per engine.
type ownSample struct {
	at   time.Time
	util map[string]float64
}

// ownSeenKeep bounds how far back ownSeen reaches: longer than any
// evidence window a tracker is run with.
const ownSeenKeep = 2 * time.Minute

// rememberOwn appends a cycle's own utilizations to ownSeen and drops
// what is older than ownSeenKeep (or from the future: a clock that went
// back).
func (c *Controller) rememberOwn(now time.Time, views []EngineView) {
	util := make(map[string]float64, len(views))
	for _, v := range views {
		util[v.ID] = v.OwnUtilization
	}
	keep := c.ownSeen[:0]
	for _, o := range c.ownSeen {
		if now.Sub(o.at) <= ownSeenKeep && !o.at.After(now) {
			keep = append(keep, o)
		}
	}
	c.ownSeen = append(keep, ownSample{at: now, util: util})
}

// ownPeak is the most an engine's own utilization was in the cycles
// since from (0 if none).
func (c *Controller) ownPeak(id string, from time.Time) float64 {
	peak := 0.0
	for _, o := range c.ownSeen {
		if !o.at.Before(from) {
			peak = math.Max(peak, o.util[id])
		}
	}
	return peak
}

// ownLoad is the load our traffic puts on each engine (reference req/s),
// what background load is measured against: the plan's (planned), and,
// while the published policy sheds, more where ext_proc's responses show
// that Envoy sent the engine a larger share of our requests than the
// weights plan.
//
// Maglev's hash and its bounded loads spread a few seconds' keys unevenly,
// by tens of percent on a small fleet. Read as someone else's load, the
// spread moves weight off the engines Envoy overfeeds, and while nothing
// sheds that is all it does: it shortens the tail, so the correction
// below is left out then. Under overload it cuts capacity the fleet has:
// the plan sheds more, every engine's planned load falls, the spread reads
// as background again, and the fleet admits less than its engines serve.
// The simulator's and the overload drill's figures for both cases are in
// docs/control-plane.md, "One cycle", step 1.
//
// An engine's share of the answered requests (responses less errors: a
// fast 5xx is no work) times the planned request total is what it got of
// our requests, at the work per request its classes plan there. It only
// raises the estimate: where our responses fall short of the plan (an
// engine slowed by another tenant's load spills ours to its neighbours),
// the plan stands. The plan is used alone with fewer than MinSamples
// answered requests per engine on average (noise), and for a Reports
// window after the weights moved: the counts would still be the old
// weights' spread, and an engine the new plan relieved of another
// tenant's load would get its old share back as its own. The gate is
// fleet-wide: one frontend shedding turns the correction on for every
// engine, as one overloaded region spills into the others.
func (c *Controller) ownLoad(evidence map[string]signals.Evidence, now time.Time, window time.Duration) map[string]float64 {
	engines := c.problem.engines
	own := make(map[string]float64, len(engines))
	answered := func(id string) float64 { return math.Max(0, evidence[id].Responses-evidence[id].Errors) }
	var totalAnswered, totalReq, totalRef float64
	for _, e := range engines {
		own[e.ID] = c.planned[e.ID]
		totalAnswered += answered(e.ID)
		totalReq += c.plannedReq[e.ID]
		totalRef += c.planned[e.ID]
	}
	if window <= 0 {
		window = defaultDemandWindow
	}
	if !c.publishedSheds() || now.Sub(c.weightsMovedAt) < window || totalReq <= 0 || totalAnswered <= 0 ||
		totalAnswered < c.cfg.Penalty.MinSamples*float64(len(engines)) {
		return own
	}
	meanPerReq := totalRef / totalReq // the work per request where nothing is planned
	for _, e := range engines {
		perReq := meanPerReq
		if r := c.plannedReq[e.ID]; r > 0 {
			perReq = c.planned[e.ID] / r
		}
		own[e.ID] = math.Max(own[e.ID], answered(e.ID)/totalAnswered*totalReq*perReq)
	}
	return own
}

// publishedSheds reports whether the published policy sheds any class at
// any frontend.
func (c *Controller) publishedSheds() bool {
	for _, nd := range c.published {
		for _, cd := range nd.Classes {
			for _, f := range cd.Shed {
				if f > 0 {
					return true
				}
			}
		}
	}
	return false
}

// PenaltyRising reports the engines whose penalty the inputs would raise by
// at least 0.05. The runner checks after every scrape and runs a cycle at
// once when there are any, so a slow or failing engine loses its traffic
// within a scrape or two of the evidence instead of a whole interval.
// It changes nothing.
func (c *Controller) PenaltyRising(in Inputs) []string {
	_, _, as, _ := c.observe(in)
	notFaults(as)
	var out []string
	for _, e := range c.problem.engines {
		a := as[e.ID]
		t := clamp(math.Max(a.scrapeTarget, math.Max(a.e2eTarget, a.errTarget)), 0, c.cfg.Penalty.Max)
		if t >= c.penalties[e.ID]+0.05 {
			out = append(out, e.ID)
		}
	}
	return out
}

// ownQueue: an engine our traffic loads to this share of its capacity or
// more may queue our own requests (see observe).
const ownQueue = 0.8

// queueSlack widens the Little's-law queue wait in the TTFT prediction.
const queueSlack = 2

// queueWaitMs is the mean time a request of the window waited to be
// scheduled: measured, from the engine's queue-time histogram, when it
// timed at least minSamples requests; else by Little's law from the
// waiting gauge, widened by queueSlack. The gauge is sampled at scrapes,
// and under overload a small engine's queue swings between empty and
// twice its slots between them: one engine's bursts can read as up to
// twice the latency its gauge explains, and the overloaded engine would
// be penalized for queueing (TestDrillOverload guards against it). The
// histogram times every request, so a TTFT residual then measures what
// queueing does not explain.
//
// But it times a request's wait at its finish, and its TTFT is timed at
// its first token: at a burst's onset the queued requests already have
// first tokens while the histogram has timed only the first, unqueued
// ones to finish. Then the window's gauges (both means over the same
// scrapes, so the idle part of the window cancels out of their ratio)
// show the queue by Little's law, unwidened: the larger of the two is
// taken. With the histogram alone, a burst on idle engines (such as the
// overload drill's capacity measurement, 8 requests at once on each) can
// read as a TTFT well above the prediction and set a penalty that takes
// weight from a healthy engine.
func queueWaitMs(w signals.Window, minSamples float64) float64 {
	little := 1000 * w.Waiting / w.CompletionsPerS
	if w.QueueCount > 0 && w.QueueCount >= minSamples {
		return math.Max(w.QueueMeanMs, little)
	}
	return queueSlack * little
}

// ttftConfidence is how many standard errors of the window's mean TTFT
// the penalty leaves out: a latency penalty needs a mean that is high
// beyond its sampling noise (one-sided, about 98% for a normal mean).
//
// Why: with prompts of very different lengths (the Mooncake trace: a few
// hundred to 30,000 tokens), a first token waits for whatever long prefill
// is ahead of it, so one window's mean TTFT over a dozen requests swings
// by several times around what the profile predicts from the mean prompt,
// even on healthy, lightly loaded engines. Each swing would set a penalty,
// the penalty would move the engine's share and the probe bring it back,
// and every move remaps the long shared prefixes Maglev had placed, losing
// their cache hits (docs/decisions/noisy-ttft-penalties.md). A faulty engine is slow on every request, so
// its mean stands well clear of the noise and keeps its penalty.
const ttftConfidence = 2.0

// ttftProven is the window's mean TTFT less ttftConfidence standard errors
// (not below 0), in ms: the mean itself without the spread.
func ttftProven(w signals.Window) float64 {
	if !(w.TTFTSDMs > 0) || w.TTFTCount < 2 {
		return w.TTFTMeanMs
	}
	return math.Max(w.TTFTMeanMs-ttftConfidence*w.TTFTSDMs/math.Sqrt(w.TTFTCount), 0)
}

// assessment is one engine's evidence in one cycle: targets from its own
// metrics (scrape), from ext_proc's timing (e2e) and from errors.
type assessment struct {
	scrapeTarget, e2eTarget, errTarget float64
	scrapeWhy, e2eWhy, errWhy          string
	hasScrape, hasE2E, hasError        bool
	loaded                             bool
}

// judge fills the view's residuals and predictions and returns the
// engine's assessment. s is its tracker view (state Up), ev its ext_proc
// evidence (zero if none).
func (c *Controller) judge(e fleet.Engine, s signals.Engine, ev signals.Evidence, v *EngineView) assessment {
	po := c.cfg.Penalty
	var a assessment
	w := s.Window // zero unless the engine is up
	fp, _ := c.spec.ProfileOf(e)
	reps := float64(max(e.Replicas, 1))
	a.loaded = w.Waiting >= 0.5 || v.ObservedUtilization >= 0.8
	v.Window = w
	if w.Seconds > 0 {
		rho := math.Min(w.UncachedPromptPerS/reps/fp.PrefillTokensPerS, 0.9)
		tbot := (fp.DecodeStepMs + fp.DecodeStepPerSeqMs*w.Running/reps) / (1 - rho)
		v.TBOTPredMs = tbot
		if w.ITLCount >= po.MinSamples && w.TBOTMeanMs > 0 {
			v.TBOTResidual = w.TBOTMeanMs / tbot
		}
		// Queue wait and prompt per request need requests finishing.
		if w.CompletionsPerS > 0 {
			queue := queueWaitMs(w, po.MinSamples)
			prompt := w.UncachedPromptPerS / w.CompletionsPerS
			v.TTFTPredMs = fp.OverheadMs + 1000*prompt/fp.PrefillTokensPerS + 1.5*tbot + queue
			if w.TTFTCount >= po.MinSamples && w.TTFTMeanMs > 0 {
				v.TTFTResidual = w.TTFTMeanMs / v.TTFTPredMs
				v.TTFTResidualLow = ttftProven(w) / v.TTFTPredMs
			}
			// ext_proc's timing of whole requests: per request overhead,
			// queue, prefill and the round trip from its frontend, then
			// one TBOT per output token after the first.
			if ev.Completed >= po.MinSamples && ev.CompletionSeconds > 0 {
				j := c.problem.engineIdx[e.ID]
				pred := 0.0
				for _, node := range ordered.Keys(ev.CompletedByNode) {
					if i, ok := c.problem.nodeIdx[node]; ok {
						pred += ev.CompletedByNode[node] * c.problem.rtt[i][j]
					}
				}
				perReqPrompt := ev.CompletionPromptTokens / ev.Completed
				pred += ev.Completed*(fp.OverheadMs+queue+1000*perReqPrompt/fp.PrefillTokensPerS+1.5*tbot+po.E2ESlackMs) +
					math.Max(0, ev.CompletionOutputTokens-ev.Completed)*tbot
				if pred > 0 {
					v.E2EResidual = 1000 * ev.CompletionSeconds / pred
				}
			}
		}
	}
	target := func(r float64, which string) (float64, string) {
		if r <= 1+po.LatencyTolerance {
			return 0, ""
		}
		return (r - 1 - po.LatencyTolerance) / po.LatencyScale,
			fmt.Sprintf("%s %.2f× what its profile predicts at its load (%.1f running, %.1f waiting)", which, r, w.Running, w.Waiting)
	}
	if r := math.Max(v.TTFTResidualLow, v.TBOTResidual); r > 0 {
		which := "TBOT"
		if r == v.TTFTResidualLow {
			which = "TTFT"
			if v.TTFTResidualLow < v.TTFTResidual {
				which = fmt.Sprintf("TTFT (mean %.2f×, less %g standard errors)", v.TTFTResidual, ttftConfidence)
			}
		}
		a.hasScrape = true
		a.scrapeTarget, a.scrapeWhy = target(r, which)
	}
	if v.E2EResidual > 0 {
		a.hasE2E = true
		a.e2eTarget, a.e2eWhy = target(v.E2EResidual, "request time (ext_proc)")
		a.e2eTarget *= reportWorth(ev.Completed, po.MinSamples)
	}
	if ev.Responses >= po.MinSamples {
		a.hasError = true
		v.ErrorRate = ev.ErrorRate()
		if t := (v.ErrorRate - po.ErrorTolerance) / po.ErrorScale; t > 0 {
			a.errTarget = t * reportWorth(ev.Responses, po.MinSamples)
			a.errWhy = fmt.Sprintf("%.0f%% errors over %.0f responses", 100*v.ErrorRate, ev.Responses)
		}
	}
	return a
}

// fullEvidence is how many times MinSamples of ext_proc's evidence (reported
// responses, timed requests) a penalty from it needs to reach its full
// target.
const fullEvidence = 10

// reportWorth scales a penalty target from reported evidence by the
// requests behind it: n samples are worth n/(fullEvidence·MinSamples) of
// it, at most all. The engines' own metrics are scraped by the control
// plane; reports come from whoever holds a reporter's credential, and
// without this scaling one report of 3 errors of 3 responses would set the
// largest penalty.
// A real fault keeps failing the engine's traffic, so its evidence grows
// within a window or two; a single report's stays small.
func reportWorth(n, minSamples float64) float64 {
	full := fullEvidence * math.Max(minSamples, 1)
	return math.Min(1, n/full)
}

// heldSlowdown: without evidence a penalty decays this many times slower
// than with evidence that the engine is well (its half-life times this).
const heldSlowdown = 6

// notFaults drops fleet-wide latency targets: from the engines' metrics
// when every engine with such evidence would get one and all of them are
// loaded (demand, not faults), and from ext_proc's timing when every engine
// with such evidence would get one (a cause at the frontend). It returns
// the notes for the views.
func notFaults(as map[string]*assessment) []string {
	var notes []string
	var with, firing, e2eWith, e2eFiring []string
	allLoaded := true
	for id, a := range as {
		if a.hasScrape {
			with = append(with, id)
			if a.scrapeTarget > 0 {
				firing = append(firing, id)
				allLoaded = allLoaded && a.loaded
			}
		}
		if a.hasE2E {
			e2eWith = append(e2eWith, id)
			if a.e2eTarget > 0 {
				e2eFiring = append(e2eFiring, id)
			}
		}
	}
	if len(firing) > 0 && len(firing) == len(with) && allLoaded {
		sort.Strings(firing)
		for _, id := range firing {
			as[id].scrapeTarget, as[id].scrapeWhy = 0, ""
		}
		notes = append(notes, "every engine ("+strings.Join(firing, ", ")+") is slow and loaded: overload, not a fault; no latency penalty")
	}
	if len(e2eFiring) > 0 && len(e2eFiring) == len(e2eWith) {
		sort.Strings(e2eFiring)
		for _, id := range e2eFiring {
			as[id].e2eTarget, as[id].e2eWhy = 0, ""
		}
		notes = append(notes, "ext_proc times every engine ("+strings.Join(e2eFiring, ", ")+") slow: a frontend-side cause; no latency penalty from it")
	}
	return notes
}

// Causes of a penalty: recovery needs evidence of the same kind (an engine
// penalized for errors does not recover by being fast).
const (
	causeLatency = "latency"
	causeErrors  = "errors"
)

// nextPenalty is the engine's penalty after this cycle: the target at once
// if higher, else a decay towards it when there is evidence of the kind
// that caused the penalty, else held.
func (c *Controller) nextPenalty(id string, prev float64, a assessment, decay float64) (pen float64, why string) {
	target, why, cause := a.scrapeTarget, a.scrapeWhy, causeLatency
	if a.e2eTarget > target {
		target, why = a.e2eTarget, a.e2eWhy
	}
	if a.errTarget > target {
		target, why, cause = a.errTarget, a.errWhy, causeErrors
	}
	target = clamp(target, 0, c.cfg.Penalty.Max)
	evidence := a.hasError
	if c.cause[id] != causeErrors {
		evidence = a.hasScrape || a.hasE2E
	}
	switch {
	case target >= prev:
		pen = target
		if target > 0 {
			c.cause[id] = cause
		}
	case evidence:
		pen = math.Max(target, prev*decay)
		if target > 0 {
			why = "recovering (decaying to " + why + ")"
		} else {
			why = "recovering: its traffic looks normal (decaying)"
		}
	default:
		// Without evidence the penalty decays slowly: an engine its probe
		// share cannot judge (too little traffic, reports refused) must
		// not stay out for good on one old piece of evidence.
		pen = math.Max(target, prev*math.Pow(decay, 1.0/heldSlowdown))
		why = "held: no traffic to judge its recovery yet (probing; decaying slowly)"
	}
	if pen < minPenalty {
		pen = 0
	}
	if pen == 0 {
		why = ""
		delete(c.cause, id)
	}
	return pen, why
}

// probe gives every penalized engine that is up, and that this frontend is
// to probe (from), at least its probe share of a class's
// weights (scaling the others down), so that its recovery shows.
func (c *Controller) probe(w map[string]float64, demandPerS float64, penalties map[string]float64, up map[string]bool, from func(engine string) bool) {
	po := c.cfg.Penalty
	share := po.MaxProbeShare
	if demandPerS > 0 {
		share = clamp(po.ProbeRPS/demandPerS, po.MinProbeShare, po.MaxProbeShare)
	}
	if share <= 0 {
		return
	}
	// In engine order: the sums must not vary with map order.
	ids := ordered.Keys(w)
	total, rest := ordered.Sum(w), 0.0
	raised := map[string]bool{}
	for id := range w {
		if penalties[id] > 0 && up[id] && from(id) {
			raised[id] = true
		}
	}
	if total <= 0 || len(raised) == 0 || len(raised) == len(w) {
		return
	}
	probed := 0.0
	for _, id := range ids {
		if x := w[id]; raised[id] {
			probed += math.Max(x/total, share)
		} else {
			rest += x / total
		}
	}
	if rest <= 0 || probed >= 1 {
		return
	}
	k := (1 - probed) / rest
	for id, x := range w {
		if raised[id] {
			w[id] = math.Max(x/total, share)
		} else {
			w[id] = x / total * k
		}
	}
}
