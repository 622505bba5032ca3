package controlplane

import (
	"fmt"
	"math"
	"time"

	"github.com/inferlb/inferlb/optimizer"
)

// Online profile correction. The optimizer plans with each engine's
// profile: a curve of TTFT against utilization, derived from the fleet's
// step model or fitted offline (inferlb profile). A profile that is wrong
// keeps steering traffic wrong for as long as it stands: one three times
// too pessimistic sends a region's traffic across an ocean to avoid a wait
// that does not exist. So each cycle compares every engine's observed mean
// TTFT (its /metrics, over the evidence window) with what the profile
// predicts for the requests it served, at the utilization it was observed
// at, and scales the TTFT curve the optimizer plans with by the smoothed
// ratio:
//
//	target = clamp(observed / predicted, 1/correctionMax, correctionMax)
//	k      = k^(1−correctionGain) · target^correctionGain      (per cycle with evidence)
//
// (geometric smoothing: a factor of 3 and its inverse converge alike).
// With the 5 s control interval, 3× becomes 1.1× in about 15 cycles (75 s).
// Unlike the outlier penalty (penalty.go), which only removes capacity from
// an engine slower than its step model says and charges its failures, the
// correction changes the latency the plan prices, both ways: an engine can
// look faster than its profile as well as slower. Its evidence needs
// MinSamples first tokens in the window; without them k stands (an engine
// without traffic proves nothing). The factor and its reason are in each
// engine's view (profile_correction, profile_correction_why on /explain's
// cycle view and the dashboard's engine table).
//
// The optimizer's stability term holds traffic where it is within a band of
// a few tens of milliseconds (moving costs cache misses): a marginal rule
// that would keep most of a plan a wrong profile made (a pessimistic
// curve's spill to another region stays). When an engine's factor has moved by
// more than correctionReplan since its last replan, its classes are solved
// without the stability term, once; the new weights still go through the
// deadband (deadband.go), which publishes them only where their latency
// gain, priced with the corrected profile, pays for the cache misses the
// move causes. The deadband is not bypassed (as a recovery bypasses it):
// where an engine's factor crosses the threshold every few cycles, every
// stability-free re-solve would be published, and the weight churn would
// remap follow-ups to cold caches and lengthen the tail (the comparison is
// in docs/control-plane.md, "One cycle", step 2).
//
// A queued engine (a window mean of correctionQueue waiting requests or
// more, or queue waits of at least half its TTFT) is offered more than it
// serves, and its TTFT is the queue's length times its service time.
// Whether that says anything about the profile depends on whose queue it
// is. While the policy sheds (or did within the window the evidence
// covers), the queue's length is what admission lets through, not the
// curve: taking that evidence would blame the profile for an overload,
// the factor would climb within seconds, and the plan would see a
// fraction of the fleet's capacity and shed what the engines can serve;
// so the factor holds. Likewise where the engine's token rates
// show another tenant's work (its background load already removes the
// capacity), and before anything is published (no plan to tell whose). But
// where the plan's own load, unshed, queues an engine, the curve promised
// a latency the engine does not give: that is the correction's case.
// Holding the factor there too would keep a small region loaded while its
// queue grows, instead of moving the excess to a farther region that
// serves it sooner.
const (
	correctionQueue  = 0.5
	correctionGain   = 0.2
	correctionMax    = 4.0
	correctionReplan = 1.25
)

// correctProfiles updates each engine's correction from its view's
// evidence (views and c.profiles are in fleet order via c.problem.engines)
// and returns the profiles to plan with, and the engines whose factor moved
// past correctionReplan since their last replan.
func (c *Controller) correctProfiles(now time.Time, views []EngineView) (map[string]optimizer.Profile, map[string]bool) {
	if c.publishedSheds() {
		c.shedAt = now
	}
	if c.correction == nil {
		c.correction, c.correctionPlanned = map[string]float64{}, map[string]float64{}
	}
	replan := map[string]bool{}
	out := make(map[string]optimizer.Profile, len(c.profiles))
	for j, e := range c.problem.engines {
		v := &views[j]
		prof := c.profiles[e.ID]
		k, ok := c.correction[e.ID]
		if !ok {
			k = 1
		}
		w := v.Window
		// Queued: a lasting queue, or one that waited at least half the
		// observed TTFT (a burst: the window's mean queue may be short
		// while its first tokens are mostly queue).
		queueMs := 0.0
		if w.CompletionsPerS > 0 {
			queueMs = queueWaitMs(w, c.cfg.Penalty.MinSamples)
		}
		queued := w.Seconds > 0 && (w.Waiting >= correctionQueue || (w.TTFTMeanMs > 0 && queueMs >= w.TTFTMeanMs/2))
		// Whose queue: admission's, while the policy sheds or did within
		// the window the evidence covers; someone else's, where the
		// engine's token rates show another tenant's work (not background
		// read from a queue alone). Otherwise the queue is what
		// the plan's load does to the engine, which its curve should
		// have predicted: that evidence corrects it.
		var whose string
		switch {
		case len(c.published) == 0:
			whose = "nothing is published yet: whose queue it is cannot be told"
		case !c.shedAt.IsZero() && now.Sub(c.shedAt).Seconds() <= w.Seconds: // shedAt is now while it sheds
			whose = "the policy sheds: admission sets that queue, not the profile"
		case v.foreignWork:
			whose = fmt.Sprintf("its token rates show another tenant's work (background load %.2f), and so is the queue", v.BackgroundLoad)
		}
		if queued && whose != "" && v.State == "up" && w.TTFTCount >= c.cfg.Penalty.MinSamples {
			v.ProfileCorrectionWhy = fmt.Sprintf("held at %.2f× (a queue of %.1f requests over the window, %.0f ms of its %.0f ms TTFT; %s)",
				k, w.Waiting, queueMs, w.TTFTMeanMs, whose)
		} else if w.TTFTCount >= c.cfg.Penalty.MinSamples && w.TTFTMeanMs > 0 && w.CompletionsPerS > 0 && v.State == "up" {
			// The requests the engine served: their uncached prompt (the
			// cached part costs no prefill, so no TTFT), the reference
			// output (the TTFT does not depend on it beyond the work ratio).
			shape := optimizer.Shape{PromptTokens: w.UncachedPromptPerS / w.CompletionsPerS, OutputTokens: prof.RefOutputTokens}
			if w.GenerationPerS > 0 {
				shape.OutputTokens = w.GenerationPerS / w.CompletionsPerS
			}
			u := math.Min(v.ObservedUtilization, 0.95)
			pred, _ := prof.Latency(shape, u)
			if pred > 0 {
				target := clamp(w.TTFTMeanMs/pred, 1/correctionMax, correctionMax)
				k = math.Exp((1-correctionGain)*math.Log(k) + correctionGain*math.Log(target))
				v.ProfileCorrectionWhy = fmt.Sprintf("TTFT %.0f ms observed at %.0f%% load, profile predicts %.0f ms (%.2f×): planning with %.2f× its TTFT curve",
					w.TTFTMeanMs, 100*u, pred, w.TTFTMeanMs/pred, k)
			}
		} else if k != 1 {
			v.ProfileCorrectionWhy = fmt.Sprintf("held at %.2f× (fewer than %.0f first tokens in the window)", k, c.cfg.Penalty.MinSamples)
		}
		c.correction[e.ID] = k
		v.ProfileCorrection = k
		if at, ok := c.correctionPlanned[e.ID]; !ok {
			c.correctionPlanned[e.ID] = 1
		} else if math.Abs(math.Log(k/at)) > math.Log(correctionReplan) {
			c.correctionPlanned[e.ID] = k
			replan[e.ID] = true
			v.ProfileCorrectionWhy += "; replanned: its classes are solved without the stability term this cycle (the deadband still prices the move)"
		}
		prof.TTFT = optimizer.Curve{Base: k * prof.TTFT.Base, Linear: k * prof.TTFT.Linear, Queue: k * prof.TTFT.Queue}
		out[e.ID] = prof
	}
	return out, replan
}
